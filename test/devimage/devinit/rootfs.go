package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The image builder records the root filesystem's digest in the initramfs;
// like CoreOS's stream hash it is the trust anchor, so TLS need not be.
const rootfsDigestFile = "/etc/agentboot/rootfs.sha256"

func wantRootfsDigest() (string, error) {
	raw, err := os.ReadFile(rootfsDigestFile)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(raw)), nil
}

// fetchRootfs downloads the root filesystem, checks it and unpacks it.
func fetchRootfs(url string) error {
	want, err := wantRootfsDigest()
	if err != nil {
		return err
	}
	client := &http.Client{
		Timeout:   10 * time.Minute,
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // verified by digest
	}
	var data []byte
	for attempt := 1; ; attempt++ {
		data, err = get(client, url)
		if err == nil {
			break
		}
		if attempt == 10 {
			return fmt.Errorf("fetch %s: %w", url, err)
		}
		logf("fetch root filesystem (attempt %d): %v", attempt, err)
		time.Sleep(time.Duration(attempt) * 2 * time.Second)
	}
	if err := unpackRootfs(data, want); err != nil {
		return err
	}
	logf("fetched root filesystem from %s (%d bytes, sha256 verified)", url, len(data))
	return nil
}

func get(c *http.Client, url string) ([]byte, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// rootfsFromISO finds the CD with the ISO volume label, mounts it and
// unpacks its images/pxeboot/rootfs.img.
func rootfsFromISO(label string) error {
	dev, err := rootfsFrom(label, func() string { return findByISOLabel(label) }, "/run/media/iso", "iso9660", unix.MS_RDONLY, "images/pxeboot/rootfs.img", true)
	if err != nil {
		return err
	}
	logf("booted from ISO %s on %s: root filesystem unpacked (sha256 verified)", label, dev)
	return nil
}

// diskMount is where an installed dev OS mounts its boot partition, and
// diskIgnition the Ignition config an installer left there.
const (
	diskMount    = "/boot"
	diskIgnition = diskMount + "/ignition/config.ign"
)

// rootfsFromDisk mounts the FAT partition labelled label (the installed
// disk's boot partition) at /boot, where it stays, and unpacks its
// rootfs.img.
func rootfsFromDisk(label string) error {
	dev, err := rootfsFrom(label, func() string { return findByFATLabel(label) }, diskMount, "vfat", 0, "rootfs.img", false)
	if err != nil {
		return err
	}
	logf("booted from disk %s: root filesystem unpacked (sha256 verified)", dev)
	return nil
}

// rootfsFrom waits for the device find returns, mounts it at mnt and
// unpacks the root filesystem at path on it; unmount leaves it mounted
// when false.
func rootfsFrom(label string, find func() string, mnt, fsType string, flags uintptr, path string, unmount bool) (string, error) {
	want, err := wantRootfsDigest()
	if err != nil {
		return "", err
	}
	var dev string
	for i := 0; i < 60 && dev == ""; i++ {
		if dev = find(); dev == "" {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if dev == "" {
		return "", fmt.Errorf("no block device with %s label %q", fsType, label)
	}
	_ = os.MkdirAll(mnt, 0o755)
	if err := unix.Mount(dev, mnt, fsType, flags, ""); err != nil {
		return "", fmt.Errorf("mount %s: %w", dev, err)
	}
	if unmount {
		defer unix.Unmount(mnt, 0)
	}
	data, err := os.ReadFile(filepath.Join(mnt, path))
	if err != nil {
		return "", err
	}
	return dev, unpackRootfs(data, want)
}

// findByFATLabel finds the block device whose FAT32 (or FAT12/16) boot
// sector carries the volume label.
func findByFATLabel(label string) string {
	return findBlock(0, 512, func(bs []byte) bool {
		if bs[510] != 0x55 || bs[511] != 0xaa {
			return false
		}
		for _, at := range []int{0x47, 0x2b} { // FAT32, FAT12/16
			if (string(bs[at+11:at+16]) == "FAT32" || string(bs[at+11:at+14]) == "FAT") &&
				strings.EqualFold(strings.TrimRight(string(bs[at:at+11]), " "), label) {
				return true
			}
		}
		return false
	})
}

// findByISOLabel finds the block device whose ISO 9660 volume identifier
// is label.
func findByISOLabel(label string) string {
	return findBlock(16*2048, 2048, func(pvd []byte) bool {
		return string(pvd[1:6]) == "CD001" && strings.TrimRight(string(pvd[40:72]), " ") == label
	})
}

// findBlock reads n bytes at off of every block device and returns the
// first whose bytes match.
func findBlock(off int64, n int, match func([]byte) bool) string {
	entries, _ := os.ReadDir("/sys/class/block")
	buf := make([]byte, n)
	for _, e := range entries {
		dev := "/dev/" + e.Name()
		f, err := os.Open(dev)
		if err != nil {
			continue
		}
		_, err = f.ReadAt(buf, off)
		f.Close()
		if err == nil && match(buf) {
			return dev
		}
	}
	return ""
}

func unpackRootfs(data []byte, wantDigest string) error {
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != wantDigest {
		return fmt.Errorf("root filesystem digest %s, want %s", got, wantDigest)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command("cpio", "-idmu")
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, os.Stderr, os.Stderr
	ch, err := processes.start(cmd)
	pr.Close()
	if err != nil {
		pw.Close()
		return err
	}
	_, werr := pw.Write(raw)
	pw.Close()
	if ws := <-ch; ws.ExitStatus() != 0 {
		return fmt.Errorf("cpio exited with status %d", ws.ExitStatus())
	}
	return werr
}
