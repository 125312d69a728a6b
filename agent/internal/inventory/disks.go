package inventory

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/jaypipes/ghw/pkg/block"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// hiddenDisk names devices that are not disks to install to and are left
// out of the inventory.
func hiddenDisk(name string) bool {
	for _, p := range []string{"loop", "zram", "dm-", "ram", "nbd", "fd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Reasons a disk is not eligible for installation (agentwire's: the
// service reads them too).
const (
	ReasonRemovable = agentwire.DiskRemovable
	ReasonISO       = agentwire.DiskHoldsISO
	ReasonOptical   = agentwire.DiskOptical
	ReasonReadOnly  = agentwire.DiskReadOnly
)

func collectDisks(o Options) []agentwire.Disk {
	info, err := block.New(o.ghwOpts()...)
	if err != nil {
		return nil
	}
	db := loadPCIIDs(o)
	byID := links(o, "dev/disk/by-id")
	byPath := links(o, "dev/disk/by-path")
	var out []agentwire.Disk
	for _, d := range info.Disks {
		if hiddenDisk(d.Name) {
			continue
		}
		disk := agentwire.Disk{
			Name:      d.Name,
			Path:      "/dev/" + d.Name,
			ByID:      byID[d.Name],
			ByPath:    byPath[d.Name],
			DriveType: driveType(d),
			Vendor:    clean(d.Vendor),
			Model:     clean(d.Model),
			Serial:    clean(d.SerialNumber),
			Wwn:       clean(d.WWN),
			SizeBytes: int64(d.SizeBytes),
			Hctl:      hctl(o, d.Name),
		}
		if hex, ok := strings.CutPrefix(disk.Vendor, "0x"); ok {
			if name, _ := db.names(hex, ""); name != "" {
				disk.Vendor = name
			}
		}
		if disk.Serial == "" {
			disk.Serial = readTrim(o.path("sys/block/" + d.Name + "/serial"))
		}
		disk.ID = disk.ByID
		if disk.ID == "" {
			disk.ID = disk.ByPath
		}
		if disk.ID == "" {
			disk.ID = disk.Path
		}
		dev := o.path("dev/" + d.Name)
		head := readHead(dev)
		disk.Bootable = bootable(dev, head)
		disk.InstallationEligibility = eligibility(o, d, disk, head)
		out = append(out, disk)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

func driveType(d *block.Disk) string {
	switch d.DriveType {
	case block.DriveTypeHDD:
		return "HDD"
	case block.DriveTypeSSD:
		return "SSD"
	case block.DriveTypeODD:
		return "ODD"
	case block.DriveTypeFDD:
		return "FDD"
	}
	if strings.HasPrefix(d.Name, "sr") {
		return "ODD"
	}
	return "Unknown"
}

// links maps device names to the first (sorted) udev link naming them.
func links(o Options, dir string) map[string]string {
	out := map[string]string{}
	entries, err := os.ReadDir(o.path(dir))
	if err != nil {
		return out
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		target, err := os.Readlink(o.path(filepath.Join(dir, n)))
		if err != nil {
			continue
		}
		dev := filepath.Base(target)
		if _, done := out[dev]; !done && !strings.Contains(n, "-part") {
			out[dev] = "/" + filepath.Join(dir, n)
		}
	}
	return out
}

func hctl(o Options, name string) string {
	entries, err := os.ReadDir(o.path("sys/block/" + name + "/device/scsi_device"))
	if err != nil || len(entries) == 0 {
		return ""
	}
	return entries[0].Name()
}

// readHead reads the first 40 KiB of a device: enough for a partition table
// and an ISO 9660 volume descriptor.
func readHead(dev string) []byte {
	f, err := os.Open(dev)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, 40<<10)
	n, _ := f.ReadAt(buf, 0)
	return buf[:n]
}

// bootable reports whether the disk carries something firmware boots: an
// MBR partition marked active, or a GPT with an EFI system or BIOS boot
// partition.
func bootable(dev string, head []byte) bool {
	if len(head) < 512 || head[510] != 0x55 || head[511] != 0xAA {
		return false
	}
	gpt := false
	for i := 0; i < 4; i++ {
		e := head[446+16*i : 446+16*(i+1)]
		if e[0] == 0x80 {
			return true
		}
		if e[4] == 0xEE {
			gpt = true
		}
	}
	if !gpt || len(head) < 1024 || string(head[512:520]) != "EFI PART" {
		return false
	}
	entriesLBA := binary.LittleEndian.Uint64(head[512+72:])
	count := binary.LittleEndian.Uint32(head[512+80:])
	size := binary.LittleEndian.Uint32(head[512+84:])
	if size < 128 || size > 1024 || count > 1024 {
		return false
	}
	f, err := os.Open(dev)
	if err != nil {
		return false
	}
	defer f.Close()
	table := make([]byte, int(count)*int(size))
	if _, err := f.ReadAt(table, int64(entriesLBA)*512); err != nil {
		return false
	}
	esp := guid("C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	biosBoot := guid("21686148-6449-6E6F-744E-656564454649")
	for i := 0; i < int(count); i++ {
		t := table[i*int(size) : i*int(size)+16]
		if bytes.Equal(t, esp) || bytes.Equal(t, biosBoot) {
			return true
		}
	}
	return false
}

// guid encodes a GUID in its mixed-endian on-disk form.
func guid(s string) []byte {
	var b []byte
	parts := strings.Split(s, "-")
	for i, p := range parts {
		var raw []byte
		for j := 0; j+2 <= len(p); j += 2 {
			var v byte
			fmt.Sscanf(p[j:j+2], "%02X", &v)
			raw = append(raw, v)
		}
		if i < 3 {
			for l, r := 0, len(raw)-1; l < r; l, r = l+1, r-1 {
				raw[l], raw[r] = raw[r], raw[l]
			}
		}
		b = append(b, raw...)
	}
	return b
}

func eligibility(o Options, d *block.Disk, disk agentwire.Disk, head []byte) agentwire.InstallationEligibility {
	reasons := []string{}
	if disk.DriveType == "ODD" {
		reasons = append(reasons, ReasonOptical)
	} else if d.IsRemovable {
		reasons = append(reasons, ReasonRemovable)
	}
	if len(head) >= 32769+5 && string(head[32769:32774]) == "CD001" {
		reasons = append(reasons, ReasonISO)
	}
	if readTrim(o.path("sys/block/"+d.Name+"/ro")) == "1" && disk.DriveType != "ODD" {
		reasons = append(reasons, ReasonReadOnly)
	}
	if disk.SizeBytes < o.MinDiskSizeBytes {
		reasons = append(reasons, fmt.Sprintf("Disk is too small (%.1f GB, the minimum is %.0f GB)", float64(disk.SizeBytes)/1e9, float64(o.MinDiskSizeBytes)/1e9))
	}
	var mounted []string
	for _, p := range d.Partitions {
		if p.MountPoint != "" {
			mounted = append(mounted, p.Name+" on "+p.MountPoint)
		}
	}
	if mp := mountedWhole(o, d.Name); mp != "" {
		mounted = append(mounted, d.Name+" on "+mp)
	}
	if len(mounted) > 0 {
		reasons = append(reasons, agentwire.DiskMounted+" ("+strings.Join(mounted, ", ")+")")
	}
	return agentwire.InstallationEligibility{Eligible: len(reasons) == 0, NotEligibleReasons: reasons}
}

// mountedWhole finds a file system mounted from the whole disk.
func mountedWhole(o Options, name string) string {
	raw, err := os.ReadFile(o.path("proc/mounts"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "/dev/"+name {
			return f[1]
		}
	}
	return ""
}
