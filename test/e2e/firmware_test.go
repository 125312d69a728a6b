//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// validationOf returns the Agent's validation id.
func validationOf(a v1beta1.Agent, id string) v1beta1.ValidationResult {
	return stack.Validation(&a, id)
}

// UEFI Secure Boot: OVMF with Microsoft's keys enrolled and Secure Boot
// enforced boots the discovery ISO through Debian's signed shim, signed
// GRUB and signed kernel, registers, and reports Secure Boot enabled; the
// same ISO on firmware without Secure Boot reports it disabled and, since
// the InfraEnv requires Secure Boot, fails the secure-boot-enabled
// validation with the reason.
func TestLabSecureBoot(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 1024, MinDiskSizeGB: 10, SecureBoot: true}
	})
	iso := download(t, ie.Status.ISODownloadURL)

	t.Run("enforced", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2e:50:01"
		v := bootVM(t, vm.Options{Name: "secureboot", UEFI: true, SecureBoot: true, CDROM: iso, Boot: "d", MAC: mac, MemoryMB: 1536,
			Disks: []string{sparseDisk(t, 20_000_000_000)}})
		a := agentWithMAC(t, ie.Namespace, mac, v)
		registered(t, "ISO, UEFI Secure Boot enforced (shim, GRUB, kernel signed)", v, a)
		require.Equal(t, "uefi", a.Status.Inventory.Boot.CurrentBootMode)
		require.Equal(t, "Enabled", a.Status.Inventory.Boot.SecureBootState)
		requireSerial(t, v, "Secure boot enabled")
		a = waitAgentState(t, a, func(a v1beta1.Agent) bool { return validationOf(a, "secure-boot-enabled").Status == "success" })
		require.Equal(t, "The host booted with Secure Boot enabled", validationOf(a, "secure-boot-enabled").Message)
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2e:50:02"
		v := bootVM(t, vm.Options{Name: "secureboot-off", UEFI: true, CDROM: iso, Boot: "d", MAC: mac, MemoryMB: 1536,
			Disks: []string{sparseDisk(t, 20_000_000_000)}})
		a := agentWithMAC(t, ie.Namespace, mac, v)
		registered(t, "ISO, UEFI without Secure Boot (same shim chain)", v, a)
		require.Equal(t, "Disabled", a.Status.Inventory.Boot.SecureBootState)
		a = waitAgentState(t, a, func(a v1beta1.Agent) bool { return validationOf(a, "secure-boot-enabled").Status == "failure" })
		require.Contains(t, validationOf(a, "secure-boot-enabled").Message, "Secure Boot is Disabled; the InfraEnv requires hosts that boot with Secure Boot enabled")
	})
}

// waitAgentState waits until the Agent a satisfies ok, and returns it.
func waitAgentState(t *testing.T, a v1beta1.Agent, ok func(v1beta1.Agent) bool) v1beta1.Agent {
	t.Helper()
	var cur v1beta1.Agent
	require.Eventually(t, func() bool {
		return s.Client.Get(context.Background(), client.ObjectKeyFromObject(&a), &cur) == nil && ok(cur)
	}, time.Minute, time.Second, "Agent %s: %+v", a.Name, cur.Status.ValidationsInfo)
	return cur
}

// Network boot with Secure Boot enforced: `agentboot pxe --secure-boot`
// sends OVMF's PXE Debian's signed shim over TFTP, the shim the signed
// network GRUB, which reads its config from the PXE service and asks the
// image service, through it, what the host boots; the signed kernel starts
// and the host registers with Secure Boot enabled. Alone on its segment
// (authoritative) and next to the site's DHCP server (proxy).
func TestLabPXESecureBoot(t *testing.T) {
	ie := infraEnv(t, nil)
	for n, mode := range map[int]string{14: "authoritative", 15: "proxy"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			seg, err := theLab.Segment(n)
			require.NoError(t, err)
			mac := fmt.Sprintf("52:54:00:2e:50:%02x", n)
			declareHost(t, ie, "sb-pxe-"+mode, mac)
			args := []string{"--secure-boot"}
			if mode == "authoritative" {
				args = append(args, "--mode", "authoritative", "--pool", seg.Prefix+".100-"+seg.Prefix+".150",
					"--router", seg.HostIP, "--lease-file", theLab.Dir+"/pxe-secureboot-leases.json")
			} else {
				require.NoError(t, theLab.Dnsmasq("sb-dnsmasq", seg.Bridge, seg.HostIP, seg.Prefix))
			}
			name := "pxe-secureboot-" + mode
			startPXE(t, name, seg.Bridge, seg.HostIP, args...)
			v := bootVMOn(t, seg.Bridge, vm.Options{Name: name, UEFI: true, SecureBoot: true, NoNICROM: true, Boot: "n", MAC: mac, MemoryMB: 1536})
			a := agentWithMAC(t, ie.Namespace, mac, v)
			registered(t, "IPv4 UEFI PXE with Secure Boot enforced, agentboot "+mode+" (signed shim, GRUB, kernel)", v, a)
			require.Equal(t, "Enabled", a.Status.Inventory.Boot.SecureBootState)
			requireSerial(t, v, "NBP filename is shimx64.efi", "agentboot: network boot through "+seg.HostIP, "agentboot: loading the discovery kernel", "Secure boot enabled")
			require.Regexp(t, `msg="TFTP transfer ended" logger=pxe/tftp client=\S+ file=grubx64.efi result=ok`, theLab.Log(name+".out"))
		})
	}
}
