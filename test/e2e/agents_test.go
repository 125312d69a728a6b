//go:build e2e

package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/vm"
)

// (a) A VM boots the InfraEnv's ISO from CD on the lab network; its Agent
// appears with an inventory that matches the VM, and the approval patch
// makes it ready.
func TestLabDiscoveryFromISO(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 2, MinMemoryMiB: 1400}
	})
	iso := download(t, ie.Status.ISODownloadURL)
	const mac = "52:54:00:1a:b0:01"
	// Two vCPUs on one TCG thread (test/vm says why: such guests froze
	// twice in CI with a thread each, once in kvm_destroy_vm after the
	// agent's KVM probe on the emulated SVM). Without SVM as well, as a
	// precaution: the probe's verdicts are the subject of
	// TestLabVirtualizationVerdicts, on one-vCPU guests.
	v := bootVM(t, vm.Options{Name: "lab-a", CDROM: iso, Boot: "d", MAC: mac, CPUs: 2, CPU: "qemu64,-svm", MemoryMB: 1536, Disks: []string{sparseDisk(t, 150_000_000_000)}})
	a := agents(t, ie.Namespace, 1, v)[0]
	registered(t, "ISO, BIOS (SeaBIOS), DHCP (dnsmasq)", v, a)

	inv := a.Status.Inventory
	require.Equal(t, int64(2), inv.CPU.Count, "vCPUs")
	require.InDelta(t, 1536<<20, inv.Memory.PhysicalBytes, 64<<20, "memory")
	var found bool
	for _, i := range inv.Interfaces {
		if i.MacAddress == mac {
			found = true
			require.NotEmpty(t, i.IPV4Addresses, "DHCP from the lab's dnsmasq")
			require.Contains(t, i.IPV4Addresses[0], "198.18.0.")
		}
	}
	require.True(t, found, "NIC %s in %+v", mac, inv.Interfaces)
	var disk *v1beta1.HostDisk
	for i := range inv.Disks {
		if inv.Disks[i].Name == "vda" {
			disk = &inv.Disks[i]
		}
	}
	require.NotNil(t, disk)
	require.Equal(t, int64(150_000_000_000), disk.SizeBytes)
	require.Equal(t, "QEMU", inv.SystemVendor.Manufacturer)

	_, err := s.Env.Kubectl(ctx, "", "-n", ie.Namespace, "patch", "agent", a.Name, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, client.ObjectKeyFromObject(&a), &a) != nil {
			return false
		}
		return conditions.IsTrue(a.Status.Conditions, v1beta1.RequirementsMetCondition)
	}, 2*time.Minute, time.Second, "RequirementsMet: %+v", a.Status.Conditions)
}

// (b) One VM's CPU has AMD-V, the other's does not: the agent tells them
// apart by what KVM can do inside each.
func TestLabVirtualizationVerdicts(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	iso := download(t, ie.Status.ISODownloadURL)
	with := bootVM(t, vm.Options{Name: "lab-svm", CDROM: iso, Boot: "d", MAC: "52:54:00:1b:00:01", CPU: "qemu64,+svm", MemoryMB: 1024})
	without := bootVM(t, vm.Options{Name: "lab-nosvm", CDROM: iso, Boot: "d", MAC: "52:54:00:1b:00:02", CPU: "qemu64,-svm", MemoryMB: 1024})
	byMAC := map[string]*v1beta1.HostVirtualization{}
	for _, a := range agents(t, ie.Namespace, 2, with, without) {
		for _, i := range a.Status.Inventory.Interfaces {
			byMAC[i.MacAddress] = a.Status.Inventory.Virtualization
		}
	}
	svm, nosvm := byMAC["52:54:00:1b:00:01"], byMAC["52:54:00:1b:00:02"]
	require.NotNil(t, svm)
	require.NotNil(t, nosvm)
	t.Logf("with svm: %+v", svm)
	t.Logf("without svm: %+v", nosvm)
	require.Equal(t, v1beta1.VirtVirtualMachineWithoutNested, nosvm.Verdict)
	require.Contains(t, nosvm.Reason, "no vmx or svm")
	require.Empty(t, nosvm.CPUFlag)
	require.Equal(t, "svm", svm.CPUFlag, "the kernel shows the flag qemu gave")
	if vm.Accelerators()[0] == "tcg" {
		// qemu's TCG emulates AMD-V well enough for KVM inside the guest.
		require.Equal(t, v1beta1.VirtSupported, svm.Verdict)
		require.Equal(t, "enabled", svm.Nested)
	}
	if svm.KVMUsable {
		require.Equal(t, v1beta1.VirtSupported, svm.Verdict)
	} else {
		require.Equal(t, v1beta1.VirtVirtualMachineWithoutNested, svm.Verdict)
		require.Contains(t, svm.Reason, "offers AMD-V (svm) but KVM cannot run a guest")
	}
}

// (c) Two VMs with the same SMBIOS UUID are two Agents.
func TestLabSameUUIDTwoAgents(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	iso := download(t, ie.Status.ISODownloadURL)
	const uuid = "2b0d6a31-7c1e-4a9b-9d3e-5f8a2c4e6b10"
	one := bootVM(t, vm.Options{Name: "lab-twin1", CDROM: iso, Boot: "d", MAC: "52:54:00:1c:00:01", UUID: uuid, MemoryMB: 1024})
	two := bootVM(t, vm.Options{Name: "lab-twin2", CDROM: iso, Boot: "d", MAC: "52:54:00:1c:00:02", UUID: uuid, MemoryMB: 1024})
	list := agents(t, ie.Namespace, 2, one, two)
	names := map[string]bool{list[0].Name: true, list[1].Name: true}
	require.Len(t, names, 2)
	require.True(t, names[uuid], "the first keeps the SMBIOS UUID as its ID")
}
