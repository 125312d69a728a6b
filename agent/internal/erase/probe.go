package erase

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentboot/agentboot/agent/internal/blockdev"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// Options say where the probe and the erase look.
type Options struct {
	// Root is "/" except in tests, which point it at a fake sysfs and procfs.
	Root string
	// Drive asks devices and sends them commands; the kernel's ioctls
	// when nil.
	Drive Drive
}

// Drive asks a device what it is and sends it its own erase commands.
type Drive interface {
	// NVMe returns Identify Controller of the namespace block device at
	// path.
	NVMe(path string) ([]byte, error)
	// ATA returns IDENTIFY DEVICE of the disk at path.
	ATA(path string) ([]byte, error)
	// FormatNVM formats the NVMe namespace open as f with secure erase
	// setting ses (sesUserData, sesCrypto), keeping its LBA format and
	// protection settings, and returns once the controller reports the
	// command complete or timeout passed.
	FormatNVM(f *os.File, ses uint32, timeout time.Duration) error
	// FormatProgress is how much of a running format of the namespace
	// open as f is done, 0 to 1, and whether the drive says (its Format
	// Progress Indicator); the kernel waits up to wait for the answer
	// (a controller may hold it until the format is done).
	FormatProgress(f *os.File, wait time.Duration) (float64, bool)
}

func (o Options) path(p string) string { return filepath.Join(o.Root, p) }

func (o Options) drive() Drive {
	if o.Drive != nil {
		return o.Drive
	}
	return kernel{}
}

// Target is one disk as the probe found it.
type Target struct {
	// Path is the device (or, in tests, a file) that is erased.
	Path string
	// Name is its kernel name (sda, nvme0n1); empty for a file.
	Name string
	// Size in bytes.
	Size int64
	// Device is what the device reports, as internal/sanitize decides on it.
	Device sanitize.Device
	// Partitions are the kernel's partitions of the disk, where a metadata
	// wipe looks for file system, RAID and LVM signatures.
	Partitions []Extent
	// Notes say what could not be found out (an identify command the
	// device refused): the decision then takes the slower, certain method.
	Notes []string

	// drive is what Probe asked; Run sends the erase commands through it.
	drive Drive
}

// Probe finds out what the disk at path can do. kept is the admin's mark.
func Probe(o Options, path string, kept bool) (Target, error) {
	t := Target{Path: path, Device: sanitize.Device{Kept: kept}, drive: o.Drive}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return t, fmt.Errorf("disk %s: %w", path, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return t, fmt.Errorf("disk %s: %w", path, err)
	}
	if st.Mode().IsRegular() {
		// A disk image (tests, `agent sanitize` on a file): nothing to ask.
		t.Size = st.Size()
		return t, nil
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return t, fmt.Errorf("disk %s is not a block device", path)
	}
	return probeDevice(o, t, filepath.Base(real), isoImage(real))
}

// probeDevice reads sysfs and the device's identify data for block device
// name (t.Path); iso says it holds an ISO 9660 volume.
//
// What the disk holds never decides that it is spared: the previous tenant
// wrote it. An ISO 9660 volume makes a disk the boot medium only on a
// read-only removable device (a BMC's virtual media); on a fixed disk or a
// writable USB stick it is data like any other.
func probeDevice(o Options, t Target, name string, iso bool) (Target, error) {
	path := t.Path
	t.Name = name
	sys := o.path("sys/block/" + t.Name)
	if _, err := os.Stat(sys); err != nil {
		return t, fmt.Errorf("disk %s: no %s: a partition or not a disk", path, sys)
	}
	sectors, err := readInt(filepath.Join(sys, "size"))
	if err != nil {
		return t, fmt.Errorf("disk %s: size: %w", path, err)
	}
	t.Size = sectors * 512 // sysfs counts 512-byte sectors whatever the block size
	removable := readTrim(filepath.Join(sys, "removable")) == "1"
	optical := strings.HasPrefix(t.Name, "sr") || readTrim(filepath.Join(sys, "device/type")) == "5"
	if t.Size == 0 {
		// A drive without a medium: opening it would fail (ENOMEDIUM).
		// A fixed disk without capacity is not empty.
		t.Device.Empty = removable || optical
		t.Device.NoCapacity = !t.Device.Empty
		return t, nil
	}
	t.Device.ReadOnly = readTrim(filepath.Join(sys, "ro")) == "1"
	mounted, err := blockdev.Mounted(o.path("proc/mounts"), "/dev/"+t.Name)
	if err != nil {
		return t, fmt.Errorf("disk %s: %w", path, err)
	}
	// The discovery OS runs from memory: a disk with a file system it
	// mounted is what it booted from. Optical drives hold read-only media.
	t.Device.BootMedium = mounted != "" || optical || removable && iso && t.Device.ReadOnly
	if t.Partitions, err = partitions(sys, t.Name, t.Size); err != nil {
		return t, fmt.Errorf("disk %s: %w", path, err)
	}
	if !t.Device.BootMedium && !t.Device.Kept {
		// A disk to keep is never opened for writing (the agent does not
		// even probe it), so what holds it does not matter. O_EXCL on
		// the whole disk does not see a partition held by device-mapper,
		// RAID or LVM: their holders are in sysfs.
		if h := holders(sys, t.Name); h != "" {
			return t, fmt.Errorf("disk %s is in use by %s: not erased", path, h)
		}
	}
	if n, _ := readInt(filepath.Join(sys, "queue/write_zeroes_max_bytes")); n > 0 {
		t.Device.WriteZeroes = true
	}
	switch {
	case strings.HasPrefix(t.Name, "nvme"):
		t.probeNVMe(o.drive())
	case strings.HasPrefix(t.Name, "sd"):
		t.probeATA(o.drive())
	}
	return t, nil
}

func (t *Target) probeNVMe(id Drive) {
	ctrl, err := id.NVMe(t.Path)
	if err != nil {
		t.Notes = append(t.Notes, "NVMe identify: "+err.Error())
		return
	}
	c, err := parseNVMeController(ctrl)
	if err != nil {
		t.Notes = append(t.Notes, "NVMe identify controller: "+err.Error())
		return
	}
	// A sanitize erases every namespace of the NVM subsystem, and a
	// format may erase them all too (FNA): neither is offered where that
	// could be a disk other than this one (a disk to keep, the boot
	// medium), that is where the subsystem may have more than one.
	if c.namespaces == 1 {
		t.Device.NVMeSanitizeCrypto = c.sanitizeCrypto
		t.Device.NVMeSanitizeBlock = c.sanitizeBlock
	} else if c.sanitizeCrypto || c.sanitizeBlock {
		t.Notes = append(t.Notes, fmt.Sprintf("NVMe sanitize not used: it erases every namespace, and the subsystem may have namespace IDs up to %d", c.namespaces))
	}
	if c.formatsOnlyOne() {
		t.Device.NVMeFormatCrypto = c.formatCrypto
		t.Device.NVMeFormatUserData = c.formatNVM
	} else if c.formatNVM {
		t.Notes = append(t.Notes, fmt.Sprintf("NVMe format not used: the subsystem formats or erases all of its namespaces at once (FNA), and may have namespace IDs up to %d", c.namespaces))
	}
}

func (t *Target) probeATA(id Drive) {
	raw, err := id.ATA(t.Path)
	if err != nil {
		// SCSI, SAS, USB bridges and virtio-scsi disks answer no ATA
		// IDENTIFY: not an error, only nothing to learn.
		t.Notes = append(t.Notes, "no ATA IDENTIFY: "+err.Error())
		return
	}
	a, err := parseATAIdentify(raw)
	if err != nil {
		t.Notes = append(t.Notes, "ATA IDENTIFY: "+err.Error())
		return
	}
	t.Device.ATASecurityErase = a.securitySupported && !a.securityLocked
	t.Device.ATAEnhancedErase = a.enhancedErase
	t.Device.ATAFrozen = a.securityFrozen
}

// holders names what holds the disk or one of its partitions (dm-0, md127),
// "" when nothing does.
func holders(sys, name string) string {
	dirs := []string{filepath.Join(sys, "holders")}
	entries, _ := os.ReadDir(sys)
	for _, e := range entries {
		if blockdev.IsPartitionOf(e.Name(), name) {
			dirs = append(dirs, filepath.Join(sys, e.Name(), "holders"))
		}
	}
	var held []string
	for _, d := range dirs {
		hs, _ := os.ReadDir(d)
		for _, h := range hs {
			held = append(held, h.Name()+" (of "+filepath.Base(filepath.Dir(d))+")")
		}
	}
	return strings.Join(held, ", ")
}

// Extent is a byte range of a disk.
type Extent struct{ Offset, Length int64 }

// partitions lists the partitions sysfs shows below the disk's directory,
// refusing one that does not lie within the disk.
func partitions(sys, name string, size int64) ([]Extent, error) {
	entries, err := os.ReadDir(sys)
	if err != nil {
		return nil, err
	}
	var out []Extent
	for _, e := range entries {
		if !blockdev.IsPartitionOf(e.Name(), name) {
			continue
		}
		start, err := readInt(filepath.Join(sys, e.Name(), "start"))
		if err != nil {
			return nil, fmt.Errorf("partition %s: start: %w", e.Name(), err)
		}
		sectors, err := readInt(filepath.Join(sys, e.Name(), "size"))
		if err != nil {
			return nil, fmt.Errorf("partition %s: size: %w", e.Name(), err)
		}
		x := Extent{Offset: start * 512, Length: sectors * 512}
		if start < 0 || sectors < 0 || x.Offset+x.Length > size {
			return nil, fmt.Errorf("partition %s (%d+%d bytes) lies outside the disk (%d bytes)", e.Name(), x.Offset, x.Length, size)
		}
		out = append(out, x)
	}
	return out, nil
}

// isoImage reports an ISO 9660 volume (the discovery media written to a
// USB stick, or attached as virtual media).
func isoImage(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 5)
	_, err = f.ReadAt(b, 32769)
	return err == nil && bytes.Equal(b, []byte("CD001"))
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func readInt(p string) (int64, error) {
	return strconv.ParseInt(readTrim(p), 10, 64)
}
