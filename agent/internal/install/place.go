package install

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/agent/internal/blockdev"
)

// BootLabel is the filesystem label of the partition that receives the
// Ignition config (CoreOS's and the dev OS image's boot partition).
const BootLabel = "boot"

// Partition is a partition of a disk image.
type Partition struct {
	Number int    // 1-based, as the kernel names it
	Start  int64  // byte offset on the disk
	FSType string // vfat or ext4
	Label  string
}

// FindBoot finds the partition labelled BootLabel in the partition table
// (MBR or GPT) of the disk or image r.
func FindBoot(r io.ReaderAt) (Partition, error) {
	parts, err := partitions(r)
	if err != nil {
		return Partition{}, err
	}
	for _, p := range parts {
		if fsType, label := probe(r, p.Start); fsType != "" && strings.EqualFold(label, BootLabel) {
			p.FSType, p.Label = fsType, label
			return p, nil
		}
	}
	return Partition{}, fmt.Errorf("no partition labelled %q among %d partitions", BootLabel, len(parts))
}

// partitions reads an MBR or, behind a protective MBR, a GPT.
func partitions(r io.ReaderAt) ([]Partition, error) {
	mbr := make([]byte, 512)
	if _, err := r.ReadAt(mbr, 0); err != nil {
		return nil, fmt.Errorf("read the partition table: %w", err)
	}
	if mbr[510] != 0x55 || mbr[511] != 0xaa {
		return nil, errors.New("no partition table (no MBR signature)")
	}
	var parts []Partition
	for i := 0; i < 4; i++ {
		e := mbr[446+16*i : 446+16*(i+1)]
		typ, start := e[4], binary.LittleEndian.Uint32(e[8:])
		if typ == 0xee {
			return gptPartitions(r)
		}
		if typ != 0 && start != 0 {
			parts = append(parts, Partition{Number: i + 1, Start: int64(start) * 512})
		}
	}
	return parts, nil
}

func gptPartitions(r io.ReaderAt) ([]Partition, error) {
	hdr := make([]byte, 92)
	if _, err := r.ReadAt(hdr, 512); err != nil || string(hdr[:8]) != "EFI PART" {
		return nil, errors.New("protective MBR without a GPT header")
	}
	entriesLBA := int64(binary.LittleEndian.Uint64(hdr[72:]))
	count := binary.LittleEndian.Uint32(hdr[80:])
	size := binary.LittleEndian.Uint32(hdr[84:])
	if count > 256 || size < 128 || size > 4096 {
		return nil, fmt.Errorf("implausible GPT: %d entries of %d bytes", count, size)
	}
	table := make([]byte, int(count)*int(size))
	if _, err := r.ReadAt(table, entriesLBA*512); err != nil {
		return nil, fmt.Errorf("read the GPT entries: %w", err)
	}
	var parts []Partition
	for i := 0; i < int(count); i++ {
		e := table[i*int(size) : (i+1)*int(size)]
		if bytes.Equal(e[:16], make([]byte, 16)) {
			continue
		}
		parts = append(parts, Partition{Number: i + 1, Start: int64(binary.LittleEndian.Uint64(e[32:])) * 512})
	}
	return parts, nil
}

// probe returns the filesystem type and label at off: FAT (label in the
// boot sector) or ext2/3/4 (label in the superblock).
func probe(r io.ReaderAt, off int64) (string, string) {
	bs := make([]byte, 512)
	if _, err := r.ReadAt(bs, off); err == nil && bs[510] == 0x55 && bs[511] == 0xaa {
		switch {
		case string(bs[0x52:0x57]) == "FAT32":
			return "vfat", strings.TrimRight(string(bs[0x47:0x52]), " ")
		case string(bs[0x36:0x39]) == "FAT":
			return "vfat", strings.TrimRight(string(bs[0x2b:0x36]), " ")
		}
	}
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, off+1024); err == nil && binary.LittleEndian.Uint16(sb[0x38:]) == 0xef53 {
		return "ext4", strings.TrimRight(string(sb[0x78:0x88]), "\x00")
	}
	return "", ""
}

// PlaceOnBootPartition makes the kernel re-read the disk's partition table,
// mounts its boot partition and writes ignition/config.ign, as
// coreos-installer does. It needs root.
func PlaceOnBootPartition(disk string, config []byte) error {
	// Partitions are named after the device, not a /dev/disk/by-id link.
	if real, err := filepath.EvalSymlinks(disk); err == nil {
		disk = real
	}
	f, err := os.Open(disk)
	if err != nil {
		return err
	}
	boot, err := FindBoot(f)
	if err == nil {
		// The kernel still knows the old partitions until told.
		err = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
		if err != nil {
			err = fmt.Errorf("re-read the partition table: %w", err)
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	dev := blockdev.PartitionDevice(disk, boot.Number)
	for i := 0; i < 50; i++ {
		if _, err = os.Stat(dev); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("partition %s did not appear: %w", dev, err)
	}
	mnt, err := os.MkdirTemp("", "agent-boot-")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	if err := unix.Mount(dev, mnt, boot.FSType, 0, ""); err != nil {
		return fmt.Errorf("mount %s (%s): %w", dev, boot.FSType, err)
	}
	werr := writeConfig(filepath.Join(mnt, "ignition"), config)
	if err := unix.Unmount(mnt, 0); err != nil && werr == nil {
		werr = fmt.Errorf("unmount %s: %w", dev, err)
	}
	return werr
}

func writeConfig(dir string, config []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "config.ign"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(config); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
