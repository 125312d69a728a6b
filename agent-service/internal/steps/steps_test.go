package steps

import (
	"testing"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

func disk(name, driveType string, size int64, eligible bool, reasons ...string) v1beta1.HostDisk {
	return v1beta1.HostDisk{ID: "/dev/disk/by-id/" + name, Name: name, Path: "/dev/" + name, ByPath: "/dev/disk/by-path/" + name, DriveType: driveType, SizeBytes: size,
		InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: eligible, NotEligibleReasons: reasons}}
}

func TestChooseDisk(t *testing.T) {
	disks := []v1beta1.HostDisk{
		disk("sda", "HDD", 200e9, true),
		disk("sdb", "SSD", 900e9, true),
		disk("sdc", "SSD", 300e9, true),
		disk("sdd", "SSD", 20e9, false, "Disk is too small (20 GB, 100 GB required)"),
		disk("sr0", "ODD", 1e9, false, "Disk is removable"),
	}
	agent := func(id, path string) *v1beta1.Agent {
		a := &v1beta1.Agent{}
		a.Spec.InstallationDiskID, a.Spec.InstallationDiskPath = id, path
		a.Status.Inventory.Disks = disks
		return a
	}
	for _, c := range []struct {
		name, id, path, want, err string
	}{
		{name: "best: smallest solid-state disk", want: "sdc"},
		{name: "by id", id: "/dev/disk/by-id/sda", want: "sda"},
		{name: "by path", path: "/dev/disk/by-path/sdb", want: "sdb"},
		{name: "id not eligible", id: "/dev/disk/by-id/sdd", err: `spec.installation_disk_id "/dev/disk/by-id/sdd" is not eligible for installation: Disk is too small`},
		{name: "unknown id", id: "/dev/disk/by-id/nvme9", err: `is not a disk of this host (it has sda, sdb, sdc, sdd (not eligible: Disk is too small`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := ChooseDisk(agent(c.id, c.path))
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, d.Name)
		})
	}
	none := &v1beta1.Agent{}
	none.Status.Inventory.Disks = disks[3:]
	_, err := ChooseDisk(none)
	require.ErrorContains(t, err, "no eligible installation disk among sdd (not eligible: Disk is too small (20 GB, 100 GB required)), sr0 (not eligible: Disk is removable)")
	_, err = ChooseDisk(&v1beta1.Agent{})
	require.ErrorContains(t, err, "no eligible installation disk among no disks")
}
