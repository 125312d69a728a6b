package initramfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Archives are read back by the real tools: xz(1) and cpio(1).
func TestArchiveReadByCpio(t *testing.T) {
	for name, c := range map[string]Compression{"xz": XZ, "gzip": Gzip, "none": None} {
		t.Run(name, func(t *testing.T) {
			archive, err := Archive(c,
				File{Path: "config.ign", Mode: 0o600, Data: []byte(`{"ignition":{"version":"3.2.0"}}`)},
				File{Path: "etc/agentboot/x.conf", Mode: 0o644, Data: []byte("a=b\n")},
			)
			require.NoError(t, err)
			dir := t.TempDir()
			var raw []byte
			switch c {
			case XZ:
				// xz --list shows the check type the kernel depends on.
				f := filepath.Join(dir, "a.xz")
				require.NoError(t, os.WriteFile(f, archive, 0o644))
				out, err := exec.Command("xz", "--robot", "--list", f).CombinedOutput()
				require.NoError(t, err, string(out))
				require.Contains(t, string(out), "CRC32")
				raw, err = exec.Command("xz", "-dc", f).Output()
				require.NoError(t, err)
			case Gzip:
				cmd := exec.Command("gzip", "-dc")
				cmd.Stdin = bytes.NewReader(archive)
				raw, err = cmd.Output()
				require.NoError(t, err)
			case None:
				raw = archive
			}
			cmd := exec.Command("cpio", "-idmu", "--quiet", "--no-absolute-filenames")
			cmd.Dir = dir
			cmd.Stdin = bytes.NewReader(raw)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, string(out))
			got, err := os.ReadFile(filepath.Join(dir, "config.ign"))
			require.NoError(t, err)
			require.JSONEq(t, `{"ignition":{"version":"3.2.0"}}`, string(got))
			info, err := os.Stat(filepath.Join(dir, "etc/agentboot/x.conf"))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o644), info.Mode().Perm())
		})
	}
}

func TestArchiveRejectsEscapingPaths(t *testing.T) {
	for _, p := range []string{"../etc/passwd", "/", "."} {
		_, err := Archive(None, File{Path: p, Data: []byte("x")})
		require.Error(t, err, p)
	}
}

func TestPad4(t *testing.T) {
	require.Len(t, Pad4(make([]byte, 5)), 8)
	require.Len(t, Pad4(make([]byte, 8)), 8)
}
