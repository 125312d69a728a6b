//go:build e2e

package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/test/vm"
)

// validationOf returns the Agent's validation id.
func validationOf(a v1beta1.Agent, id string) v1beta1.ValidationResult {
	for _, list := range a.Status.ValidationsInfo {
		for _, v := range list {
			if v.ID == id {
				return v
			}
		}
	}
	return v1beta1.ValidationResult{}
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
