// Package boot_test boots what the image service serves in real virtual
// machines (qemu, TCG when KVM is unusable) on qemu's user-mode network, so it
// needs no root: the ISO from a CD with BIOS, the minimal ISO with UEFI, and
// network boot through qemu's own iPXE firmware. The dev OS image's init
// reports on the serial console what it found and did.
package boot_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// qemu's user network reaches the host's loopback at 10.0.2.2.
const hostFromGuest = "10.0.2.2"

var s *stack.Stack

func TestMain(m *testing.M) {
	var stop func()
	var err error
	s, stop, err = stack.StartMain(stack.Options{AdvertiseHost: hostFromGuest})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// bootTimeout is generous: a loaded two-core machine under TCG is slow.
const bootTimeout = 6 * time.Minute

func infraEnv(t *testing.T, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	return s.CreateInfraEnv(t, "boot", "env", change)
}

func download(t *testing.T, url string) string { return s.Download(t, url) }

// expect waits for each line in order of appearance.
func expect(t *testing.T, v *vm.VM, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		_, err := v.WaitFor(context.Background(), regexp.MustCompile(p), bootTimeout)
		require.NoError(t, err)
	}
}

// appliedDiscoveryIgnition are the lines of a host that found and applied its
// discovery Ignition and started the agent fetched from the image service.
func appliedDiscoveryIgnition() []string {
	agentURL, err := s.Settings.AgentBinaryURL("x86_64")
	if err != nil {
		panic(err) // the stack always serves the x86_64 agent
	}
	return []string{
		`devinit: ignition: found /config.ign`,
		regexp.QuoteMeta(fmt.Sprintf("devinit: ignition: wrote /usr/local/bin/agent (")) + `\d+ bytes, from ` + regexp.QuoteMeta(agentURL) + `, sha512 verified\)`,
		`devinit: ignition: user core: 1 SSH keys`,
		`devinit: starting agent.service: /usr/local/bin/agent run --config /etc/agentboot/agent.json`,
	}
}

// The ISO boots, the agent registers, and its Agent describes this VM.
func TestISOBootsWithBIOS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 900}
	})
	iso := download(t, ie.Status.ISODownloadURL)
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, nil, 0o644))
	require.NoError(t, os.Truncate(disk, 120_000_000_000)) // sparse
	const mac = "52:54:00:ab:cd:01"
	v := vm.Start(t, vm.Options{Name: "iso-bios", CDROM: iso, Boot: "d", Net: "user", MAC: mac, MemoryMB: 1024, Disks: []string{disk}})
	expect(t, v, append([]string{`devinit: booted from ISO agentboot-dev-\S+ on /dev/sr0`}, appliedDiscoveryIgnition()...)...)

	var a v1beta1.Agent
	require.Eventually(t, func() bool {
		var list v1beta1.AgentList
		if s.Client.List(ctx, &list, client.InNamespace(ie.Namespace)) != nil || len(list.Items) != 1 {
			return false
		}
		a = list.Items[0]
		return a.Status.Inventory.ReportTime != nil && a.Status.DebugInfo.State == "known-unbound"
	}, bootTimeout, time.Second, "the agent registers and the host becomes known; serial log:\n%s", v.Tail(30))
	inv := a.Status.Inventory
	require.Equal(t, int64(1), inv.CPU.Count)
	require.InDelta(t, 1<<30, inv.Memory.PhysicalBytes, 64<<20)
	require.Equal(t, "QEMU", inv.SystemVendor.Manufacturer)
	require.True(t, inv.SystemVendor.Virtual)
	require.Equal(t, "host-52-54-00-ab-cd-01", inv.Hostname, "no hostname of its own: derived from the MAC")
	macs := map[string]bool{}
	for _, i := range inv.Interfaces {
		macs[i.MacAddress] = true
	}
	require.True(t, macs[mac], "interfaces %+v", inv.Interfaces)
	var vda *v1beta1.HostDisk
	for i := range inv.Disks {
		if inv.Disks[i].Name == "vda" {
			vda = &inv.Disks[i]
		}
	}
	require.NotNil(t, vda, "disks %+v", inv.Disks)
	require.Equal(t, int64(120_000_000_000), vda.SizeBytes)
	require.True(t, vda.InstallationEligibility.Eligible, "%+v", vda.InstallationEligibility)
	require.NotNil(t, inv.Virtualization)
	require.Equal(t, "bios", inv.Boot.CurrentBootMode)

	_, err := s.Env.Kubectl(ctx, "", "-n", ie.Namespace, "patch", "agent", a.Name, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, client.ObjectKeyFromObject(&a), &a) != nil {
			return false
		}
		c := conditions.Find(a.Status.Conditions, v1beta1.RequirementsMetCondition)
		return c != nil && c.Status == "True"
	}, time.Minute, 500*time.Millisecond, "RequirementsMet after approval")
}

func TestMinimalISOBootsWithUEFI(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Spec.ImageType = v1beta1.ImageTypeMinimalISO })
	iso := download(t, ie.Status.ISODownloadURL)
	v := vm.Start(t, vm.Options{Name: "minimal-uefi", CDROM: iso, Boot: "d", Net: "user", UEFI: true})
	expect(t, v, append([]string{`devinit: fetched root filesystem from ` + regexp.QuoteMeta(ie.Status.BootArtifacts.RootfsURL) + ` \(\d+ bytes, sha256 verified\)`}, appliedDiscoveryIgnition()...)...)
}

// qemu's DHCP hands iPXE the script URL as its boot file: the firmware's iPXE
// fetches the script, kernel and initrd; the kernel unpacks the served initrd
// (base plus the appended config archive) and the OS fetches the rootfs.
func TestNetworkBootWithIPXE(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	// qemu's DHCP takes boot file names of up to 127 bytes: a TFTP-served
	// script chains the InfraEnv's longer URL, as a site's PXE server would.
	tftp := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(tftp, "boot.ipxe"), []byte("#!ipxe\nchain "+ie.Status.BootArtifacts.IpxeScriptURL+"\n"), 0o644))
	v := vm.Start(t, vm.Options{Name: "ipxe", Boot: "n", Net: "user,tftp=" + tftp + ",bootfile=boot.ipxe", MAC: "52:54:00:12:34:56"})
	expect(t, v, append([]string{`devinit: fetched root filesystem from ` + regexp.QuoteMeta(ie.Status.BootArtifacts.RootfsURL)}, appliedDiscoveryIgnition()...)...)
	cmdline, err := v.WaitFor(context.Background(), regexp.MustCompile(`Kernel command line:`), time.Second)
	require.NoError(t, err)
	require.Contains(t, cmdline, "BOOTIF=01-52-54-00-12-34-56", "iPXE expanded the booting MAC")
}
