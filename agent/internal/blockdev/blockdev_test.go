package blockdev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPartitionDevice(t *testing.T) {
	require.Equal(t, "/dev/sda1", PartitionDevice("/dev/sda", 1))
	require.Equal(t, "/dev/nvme0n1p2", PartitionDevice("/dev/nvme0n1", 2))
	require.True(t, IsPartitionOf(PartitionDevice("/dev/mmcblk0", 3), "/dev/mmcblk0"), "the two rules agree")
}

func TestIsPartitionOf(t *testing.T) {
	for _, tc := range []struct {
		part, disk string
		want       bool
	}{
		{"/dev/sda1", "/dev/sda", true}, {"sda12", "sda", true}, {"/dev/nvme0n1p1", "/dev/nvme0n1", true},
		{"/dev/mmcblk0p2", "/dev/mmcblk0", true},
		{"/dev/sda", "/dev/sda", false}, {"/dev/sdab1", "/dev/sda", false}, {"/dev/sdap1", "/dev/sda", false},
		{"/dev/sda+1", "/dev/sda", false}, {"/dev/sda0", "/dev/sda", false}, {"/dev/sdb1", "/dev/sda", false},
		{"/dev/nvme0n1", "/dev/nvme0n1", false}, {"/dev/nvme0n11", "/dev/nvme0n1", false}, {"/dev/nvme0n1p", "/dev/nvme0n1", false},
		{"/dev/nvme0n11p1", "/dev/nvme0n1", false}, {"/dev/sda1", "", false},
	} {
		require.Equal(t, tc.want, IsPartitionOf(tc.part, tc.disk), "%s of %s", tc.part, tc.disk)
	}
}

func TestMounted(t *testing.T) {
	mounts := filepath.Join(t.TempDir(), "mounts")
	require.NoError(t, os.WriteFile(mounts, []byte("/dev/sr0 /run/media/iso iso9660 ro 0 0\n/dev/nvme0n1p3 /var xfs rw 0 0\n"), 0o644))
	got, err := Mounted(mounts, "/dev/nvme0n1")
	require.NoError(t, err)
	require.Equal(t, "/dev/nvme0n1p3 is mounted on /var", got)
	got, err = Mounted(mounts, "/dev/sda")
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = Mounted(filepath.Join(t.TempDir(), "nope"), "/dev/sda")
	require.ErrorContains(t, err, "read the mount table")
}
