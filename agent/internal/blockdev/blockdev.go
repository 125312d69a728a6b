// Package blockdev holds the agent's rules about block device names and
// the mount table, read by the installer and the eraser alike: a disk one
// of them thinks is free the other must not think is in use. It only reads.
package blockdev

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PartitionDevice names partition n of disk: /dev/sda1, /dev/nvme0n1p1.
func PartitionDevice(disk string, n int) string {
	if endsInDigit(disk) {
		return fmt.Sprintf("%sp%d", disk, n)
	}
	return fmt.Sprintf("%s%d", disk, n)
}

func endsInDigit(s string) bool { return s != "" && s[len(s)-1] >= '0' && s[len(s)-1] <= '9' }

// IsPartitionOf is true for sda1 of sda and nvme0n1p1 of nvme0n1 (with or
// without /dev/). As the kernel names them, a disk whose name ends in a
// digit has partitions <disk>p<N>, any other <disk><N>: nvme0n11 is a
// namespace, not partition 1 of nvme0n1, and sdap1 is a partition of sdap.
func IsPartitionOf(part, disk string) bool {
	rest, ok := strings.CutPrefix(part, disk)
	if !ok || disk == "" {
		return false
	}
	if endsInDigit(disk) {
		if rest, ok = strings.CutPrefix(rest, "p"); !ok {
			return false
		}
	}
	if rest == "" || rest[0] < '1' || rest[0] > '9' {
		return false
	}
	_, err := strconv.ParseUint(rest, 10, 32)
	return err == nil
}

// Mounted finds a file system mounted from disk (a /dev path) or one of its
// partitions in the mount table at mounts (/proc/mounts), and says which
// device is mounted where; "" when none is.
func Mounted(mounts, disk string) (string, error) {
	data, err := os.ReadFile(mounts)
	if err != nil {
		return "", fmt.Errorf("read the mount table: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && (f[0] == disk || IsPartitionOf(f[0], disk)) {
			return f[0] + " is mounted on " + f[1], nil
		}
	}
	return "", nil
}
