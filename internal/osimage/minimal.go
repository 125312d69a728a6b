package osimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/agentboot/agentboot/internal/filehash"
	"github.com/agentboot/agentboot/internal/liveiso"
)

// makeMinimalISO writes src without its root filesystem to dst. xorriso
// replays the El Torito and isohybrid boot setup of the original, so the
// result boots like it (BIOS and UEFI); the boot configs, and with them the
// kernel-argument areas, are unchanged.
func makeMinimalISO(src, dst string) (cacheMeta, error) {
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		return cacheMeta{}, fmt.Errorf("xorriso is not installed (Debian package xorriso)")
	}
	tf, err := os.CreateTemp(filepath.Dir(dst), ".minimal-*.iso")
	if err != nil {
		return cacheMeta{}, err
	}
	tmp := tf.Name()
	tf.Close()
	defer os.Remove(tmp)
	out, err := exec.Command(xorriso, "-indev", src, "-outdev", tmp,
		"-boot_image", "any", "replay",
		"-rm", "/"+liveiso.RootfsPath, "--",
		"-commit").CombinedOutput()
	if err != nil {
		return cacheMeta{}, fmt.Errorf("xorriso: %v: %s", err, tail(out))
	}
	sum, n, err := filehash.SHA256(tmp)
	if err != nil {
		return cacheMeta{}, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return cacheMeta{}, err
	}
	return cacheMeta{SHA256: sum, Size: n}, nil
}

func tail(b []byte) string {
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(b)
}
