// Package boot_test boots what the image service serves in real virtual
// machines (qemu, TCG when KVM is unusable) on qemu's user-mode network, so it
// needs no root: the ISO from a CD with BIOS (x86_64) and UEFI (aarch64),
// the minimal ISO with UEFI, and network boot through qemu's own iPXE
// firmware; then installation to disk, the boot from it, and disk
// sanitization. The dev OS image's init reports on the serial console what
// it found and did. A boot under TCG costs 10-35 CPU seconds: a test
// that boots a VM checks everything that boot shows.
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
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// qemu's user network reaches the host's loopback at 10.0.2.2.
const hostFromGuest = "10.0.2.2"

var s *stack.Stack

func TestMain(m *testing.M) {
	stack.MainWith(m, stack.Options{AdvertiseHost: hostFromGuest, AgentArm64: true}, &s)
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
func appliedDiscoveryIgnition() []string { return appliedDiscoveryIgnitionFor("x86_64") }

func appliedDiscoveryIgnitionFor(arch string) []string {
	agentURL, err := s.Settings.AgentBinaryURL(arch)
	if err != nil {
		panic(err) // the stack serves the x86_64 and aarch64 agents
	}
	return []string{
		`devinit: ignition: found /config.ign`,
		regexp.QuoteMeta(fmt.Sprintf("devinit: ignition: wrote /usr/local/bin/agent (")) + `\d+ bytes, from ` + regexp.QuoteMeta(agentURL) + `, sha512 verified\)`,
		`devinit: ignition: user core: 1 SSH keys`,
		`devinit: starting agent.service: /usr/local/bin/agent run --config /etc/agentboot/agent.json`,
	}
}

// waitAgent waits for the namespace's one Agent to satisfy ok.
func waitAgent(t *testing.T, v *vm.VM, ns, what string, ok func(*v1beta1.Agent) bool) v1beta1.Agent {
	t.Helper()
	var list v1beta1.AgentList
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for deadline := time.Now().Add(bootTimeout); time.Now().Before(deadline); <-tick.C {
		if s.Client.List(context.Background(), &list, client.InNamespace(ns)) == nil && len(list.Items) == 1 && ok(&list.Items[0]) {
			return list.Items[0]
		}
		if err := v.Err(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	t.Fatalf("%s: not within %s (Agents: %d); serial log:\n%s", what, bootTimeout, len(list.Items), v.Tail(30))
	return v1beta1.Agent{}
}

// diskNamed is the inventory's disk name.
func diskNamed(t *testing.T, inv v1beta1.HostInventory, name string) *v1beta1.HostDisk {
	t.Helper()
	for i := range inv.Disks {
		if inv.Disks[i].Name == name {
			return &inv.Disks[i]
		}
	}
	t.Fatalf("no disk %s in the inventory: %+v", name, inv.Disks)
	return nil
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
