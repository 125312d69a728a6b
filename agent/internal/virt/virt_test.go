package virt

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentapi"
	"github.com/agentboot/agentboot/test/vm"
)

func TestVerdicts(t *testing.T) {
	broken := errors.New("KVM_RUN: internal error (emulation failure) in the test guest")
	cases := map[string]struct {
		facts  Facts
		want   string
		reason string
	}{
		"bare metal, KVM runs":               {Facts{CPUIDVirt: "vmx", FlagVirt: "vmx", KVMDevice: true}, agentapi.VirtSupported, "Intel VT-x"},
		"nested VM that works":               {Facts{CPUIDVirt: "svm", FlagVirt: "svm", Hypervisor: true, KVMDevice: true}, agentapi.VirtSupported, "AMD-V"},
		"VT-x disabled in firmware":          {Facts{CPUIDVirt: "vmx", KVMDevice: false}, agentapi.VirtDisabledInFirmware, "enable virtualization in the firmware setup"},
		"flag present, KVM refuses":          {Facts{CPUIDVirt: "vmx", FlagVirt: "vmx", KVMDevice: true, KVMErr: broken}, agentapi.VirtDisabledInFirmware, "emulation failure"},
		"no extension on bare metal":         {Facts{}, agentapi.VirtNotSupportedByCPU, "neither"},
		"VM without nesting":                 {Facts{Hypervisor: true}, agentapi.VirtVirtualMachineWithoutNested, "does not offer nested"},
		"VM with /dev/kvm that cannot run":   {Facts{Hypervisor: true, KVMDevice: true, KVMErr: broken}, agentapi.VirtVirtualMachineWithoutNested, "does not offer nested"},
		"VM offering svm, KVM still refuses": {Facts{Hypervisor: true, CPUIDVirt: "svm", KVMDevice: true, KVMErr: broken}, agentapi.VirtVirtualMachineWithoutNested, "emulation failure"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := Verdict(tc.facts)
			require.Equal(t, tc.want, v.Verdict)
			require.Contains(t, v.Reason, tc.reason)
			require.Equal(t, tc.facts.KVMDevice && tc.facts.KVMErr == nil, v.KVMUsable)
		})
	}
}

// On this machine the agent must agree with qemu about KVM: if qemu cannot
// run a guest with KVM, the agent must not call KVM usable, and vice versa.
func TestProbeAgreesWithQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 not found: install qemu-system-x86 (.ci/packages)")
	}
	t.Setenv("AGENTBOOT_QEMU_ACCEL", "")
	qemuKVM := vm.Accelerators()[0] == "kvm"
	got := Verdict(Probe("/"))
	require.Equal(t, qemuKVM, got.KVMUsable, "agent says %+v", got)
	if !qemuKVM {
		require.NotEqual(t, agentapi.VirtSupported, got.Verdict)
	}
	t.Logf("this machine: %+v", got)
}
