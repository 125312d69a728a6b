package iso9660

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// makeISO builds an image with xorriso (a real ISO writer) from files.
func makeISO(t testing.TB, files map[string]string, mkisofsArgs ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Fatal("xorriso not found: install Debian package xorriso (.ci/packages lists it)")
	}
	src := t.TempDir()
	for name, content := range files {
		p := filepath.Join(src, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	out := filepath.Join(t.TempDir(), "test.iso")
	args := append([]string{"-as", "mkisofs", "-quiet", "-V", "TEST"}, mkisofsArgs...)
	args = append(args, "-o", out, src)
	cmdOut, err := exec.Command("xorriso", args...).CombinedOutput()
	require.NoError(t, err, string(cmdOut))
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return data
}

var sample = map[string]string{
	"coreos/igninfo.json":                                  `{"file": "images/ignition.img"}`,
	"coreos/kargs.json":                                    `{"default": "a b", "files": [], "size": 16}`,
	"images/ignition.img":                                  string(make([]byte, 8192)),
	"images/pxeboot/vmlinuz":                               "kernel bytes",
	"images/pxeboot/initrd.img":                            "initrd bytes",
	"isolinux/isolinux.cfg":                                "append initrd=/images/pxeboot/initrd.img\n",
	"a/long-directory-name/with.a.very.long.file.name.txt": "deep",
}

func TestStatFindsFilesInPlace(t *testing.T) {
	for name, args := range map[string][]string{
		"rock ridge and joliet": {"-R", "-J"},
		"rock ridge":            {"-R"},
		"plain iso 9660":        nil,
	} {
		t.Run(name, func(t *testing.T) {
			img := makeISO(t, sample, args...)
			fs, err := Open(bytes.NewReader(img))
			require.NoError(t, err)
			require.Equal(t, int64(len(img)), fs.Size())
			for p, content := range sample {
				if args == nil && filepath.Base(p) == "with.a.very.long.file.name.txt" {
					continue // not representable without Rock Ridge
				}
				f, err := fs.Stat(p)
				require.NoError(t, err, p)
				require.False(t, f.IsDir)
				require.Equal(t, content, string(img[f.Offset:f.Offset+f.Size]), p)
				got, err := fs.ReadFile(p, 1<<20)
				require.NoError(t, err)
				require.Equal(t, content, string(got))
			}
			// Case-insensitive, and 8.3 names where Rock Ridge is absent.
			_, err = fs.Stat("COREOS/IGNINFO.JSON")
			require.NoError(t, err)
			d, err := fs.Stat("images/pxeboot")
			require.NoError(t, err)
			require.True(t, d.IsDir)
			list, err := fs.ReadDir("images/pxeboot")
			require.NoError(t, err)
			require.Len(t, list, 2)
		})
	}
}

func TestStatErrors(t *testing.T) {
	img := makeISO(t, sample, "-R")
	fs, err := Open(bytes.NewReader(img))
	require.NoError(t, err)
	_, err = fs.Stat("images/pxeboot/rootfs.img")
	require.ErrorIs(t, err, ErrNotExist)
	_, err = fs.Stat("coreos/kargs.json/x")
	require.ErrorIs(t, err, ErrNotExist)
	_, err = fs.ReadFile("images/ignition.img", 100)
	require.ErrorContains(t, err, "more than the 100 expected")

	_, err = Open(bytes.NewReader(make([]byte, 64*SectorSize)))
	require.ErrorContains(t, err, "not an ISO 9660 image")
	_, err = Open(bytes.NewReader(img[:16*SectorSize+10]))
	require.Error(t, err)
}

// FuzzOpen feeds damaged images through everything a caller does with one.
func FuzzOpen(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.iso.gz")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			f.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw[16*SectorSize:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The fuzzer mutates from the volume descriptors on; the system area
		// before them is never read.
		fs, err := Open(bytes.NewReader(append(make([]byte, 16*SectorSize), data...)))
		if err != nil {
			return
		}
		for _, p := range []string{"coreos/igninfo.json", "images/pxeboot/vmlinuz", "isolinux", "a/b/c/d"} {
			if f, err := fs.Stat(p); err == nil && !f.IsDir {
				_, _ = fs.ReadFile(p, 1<<16)
			}
		}
		_, _ = fs.ReadDir("/")
	})
}
