package liveiso

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/initramfs"
	"github.com/agentboot/agentboot/internal/overlay"
	"github.com/agentboot/agentboot/test/testenv"
)

func TestInspectDevImageAndEmbed(t *testing.T) {
	iso, err := testenv.DevImage()
	require.NoError(t, err)
	f, err := os.Open(iso)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)

	l, err := Inspect(f, st.Size())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(l.VolumeID, "agentboot-dev-"))
	require.Equal(t, int64(256<<10), l.Ignition.Length)
	require.Len(t, l.Kargs.Offsets, 2)
	require.Contains(t, l.Kargs.Default, "coreos.liveiso="+l.VolumeID)
	require.Positive(t, l.Kernel.Length)
	require.Positive(t, l.Initrd.Length)
	require.Positive(t, l.Rootfs.Length)
	require.True(t, l.InitrdNetwork, "coreos/features.json says live-initrd-network")

	config := []byte(`{"ignition":{"version":"3.2.0"}}`)
	archive, err := initramfs.Archive(initramfs.XZ, initramfs.File{Path: "config.ign", Mode: 0o600, Data: config})
	require.NoError(t, err)
	kargs := l.Kargs.Default + " agentboot.test=1"
	patches, err := l.Patches(archive, kargs)
	require.NoError(t, err)
	s, err := overlay.New(overlay.FileSection(iso, f, 0, st.Size()), patches...)
	require.NoError(t, err)

	// Real consumers read the result: xorriso extracts the embed area and the
	// boot configs, xz and cpio unpack the config.
	dir := t.TempDir()
	custom := filepath.Join(dir, "custom.iso")
	out, err := os.Create(custom)
	require.NoError(t, err)
	_, err = io.Copy(out, s)
	require.NoError(t, err)
	require.NoError(t, out.Close())
	for _, p := range []string{"images/ignition.img", "isolinux/isolinux.cfg", "EFI/agentboot/grub.cfg"} {
		o, err := exec.Command("xorriso", "-osirrox", "on", "-indev", custom, "-extract", "/"+p, filepath.Join(dir, filepath.Base(p))).CombinedOutput()
		require.NoError(t, err, string(o))
	}
	area, err := os.ReadFile(filepath.Join(dir, "ignition.img"))
	require.NoError(t, err)
	require.Len(t, area, 256<<10)
	raw, err := exec.Command("sh", "-c", "xz -dc < "+filepath.Join(dir, "ignition.img")+" | (cd "+dir+" && cpio -idu --quiet)").CombinedOutput()
	require.NoError(t, err, string(raw))
	got, err := os.ReadFile(filepath.Join(dir, "config.ign"))
	require.NoError(t, err)
	require.Equal(t, config, got)
	for _, cfg := range []string{"isolinux.cfg", "grub.cfg"} {
		text, err := os.ReadFile(filepath.Join(dir, cfg))
		require.NoError(t, err)
		require.Contains(t, string(text), kargs+"\n###")
		require.Contains(t, string(text), "## COREOS_KARG_EMBED_AREA", "the marker line stays a comment")
	}
	// The original is untouched.
	l2, err := Inspect(f, st.Size())
	require.NoError(t, err)
	require.Equal(t, l, l2)
}

func TestPatchesRejectOversize(t *testing.T) {
	l := &Layout{Ignition: Area{Offset: 0, Length: 16}, Kargs: KargAreas{Default: "a", Size: 8, Pad: '#', End: '\n', Offsets: []int64{100}}}
	_, err := l.Patches(make([]byte, 17), "a")
	require.ErrorIs(t, err, ErrIgnitionTooLarge)
	_, err = l.Patches(nil, "12345678")
	require.ErrorIs(t, err, ErrKargsTooLong)
	_, err = l.Patches(nil, "a\nb")
	require.ErrorContains(t, err, "line break")
	region, err := l.Kargs.Render("abc")
	require.NoError(t, err)
	require.Equal(t, []byte("abc\n####"), region)
}

// makeLiveISO builds a minimal live ISO tree with a chosen kargs.json.
func makeLiveISO(t *testing.T, kargsJSON, cfg string) (*bytes.Reader, int64) {
	t.Helper()
	src := t.TempDir()
	files := map[string]string{
		"coreos/kargs.json":         kargsJSON,
		"isolinux/isolinux.cfg":     cfg,
		"images/ignition.img":       string(make([]byte, 4096)),
		"images/pxeboot/vmlinuz":    "k",
		"images/pxeboot/initrd.img": "i",
	}
	for name, content := range files {
		p := filepath.Join(src, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	out := filepath.Join(t.TempDir(), "x.iso")
	o, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", "X", "-o", out, src).CombinedOutput()
	require.NoError(t, err, string(o))
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return bytes.NewReader(data), int64(len(data))
}

func TestInspectErrors(t *testing.T) {
	cfg := "append a b\n#######" + "# COREOS_KARG_EMBED_AREA\n"
	cases := map[string]struct{ kargs, cfg, want string }{
		"valid":             {`{"default":"a b","files":[{"path":"isolinux/isolinux.cfg","offset":7}],"size":10}`, cfg, ""},
		"area not pristine": {`{"default":"a c","files":[{"path":"isolinux/isolinux.cfg","offset":7}],"size":10}`, cfg, "not the default"},
		"area outside file": {`{"default":"a b","files":[{"path":"isolinux/isolinux.cfg","offset":70}],"size":10}`, cfg, "lies outside"},
		"missing cfg":       {`{"default":"a b","files":[{"path":"EFI/x/grub.cfg","offset":7}],"size":10}`, cfg, "no such file"},
		"bad json":          {`{`, cfg, "kargs.json"},
		"size too large":    {`{"default":"a b","files":[{"path":"isolinux/isolinux.cfg","offset":7}],"size":4096}`, cfg, "out of range"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, size := makeLiveISO(t, tc.kargs, tc.cfg)
			l, err := Inspect(r, size)
			if tc.want == "" {
				require.NoError(t, err)
				require.False(t, l.InitrdNetwork, "no coreos/features.json: an older live image")
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}
