package virt

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/test/vm"
)

func TestVerdicts(t *testing.T) {
	broken := errors.New("KVM_RUN: internal error (emulation failure) in the test guest")
	cases := map[string]struct {
		facts  Facts
		want   string
		reason string
	}{
		"bare metal, KVM runs":               {Facts{CPUIDVirt: "vmx", FlagVirt: "vmx", KVMDevice: true}, agentwire.VirtSupported, "Intel VT-x"},
		"nested VM that works":               {Facts{CPUIDVirt: "svm", FlagVirt: "svm", Hypervisor: true, KVMDevice: true}, agentwire.VirtSupported, "AMD-V"},
		"VT-x disabled in firmware":          {Facts{CPUIDVirt: "vmx", KVMDevice: false}, agentwire.VirtDisabledInFirmware, "enable virtualization in the firmware setup"},
		"flag present, KVM refuses":          {Facts{CPUIDVirt: "vmx", FlagVirt: "vmx", KVMDevice: true, KVMErr: broken}, agentwire.VirtDisabledInFirmware, "emulation failure"},
		"no extension on bare metal":         {Facts{}, agentwire.VirtNotSupportedByCPU, "neither"},
		"VM without nesting":                 {Facts{Hypervisor: true}, agentwire.VirtVirtualMachineWithoutNested, "does not offer nested"},
		"VM with /dev/kvm that cannot run":   {Facts{Hypervisor: true, KVMDevice: true, KVMErr: broken}, agentwire.VirtVirtualMachineWithoutNested, "does not offer nested"},
		"VM offering svm, KVM still refuses": {Facts{Hypervisor: true, CPUIDVirt: "svm", KVMDevice: true, KVMErr: broken}, agentwire.VirtVirtualMachineWithoutNested, "emulation failure"},
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

func TestArmVerdicts(t *testing.T) {
	broken := errors.New("KVM_RUN: the hardware refused to enter the guest")
	for name, tc := range map[string]struct {
		facts        Facts
		want, reason string
	}{
		"server at EL2, VHE":      {Facts{Arm: true, EL: "EL2", HypMode: "VHE", KVMDevice: true}, agentwire.VirtSupported, "KVM runs guests (the kernel runs at EL2, VHE)"},
		"started at EL1":          {Facts{Arm: true, EL: "EL1"}, agentwire.VirtDisabledInFirmware, "did not hand EL2 to the OS (no /dev/kvm)"},
		"EL2, KVM fails":          {Facts{Arm: true, EL: "EL2", KVMDevice: true, KVMErr: broken}, agentwire.VirtDisabledInFirmware, "refused to enter"},
		"guest without EL2":       {Facts{Arm: true, Hypervisor: true, EL: "EL1"}, agentwire.VirtVirtualMachineWithoutNested, "does not give it EL2"},
		"guest with EL2 (nested)": {Facts{Arm: true, Hypervisor: true, EL: "EL2", KVMDevice: true, Nested: "disabled"}, agentwire.VirtSupported, "EL2"},
		"nothing logged, no KVM":  {Facts{Arm: true}, agentwire.VirtNotSupportedByCPU, "no sign of EL2"},
	} {
		t.Run(name, func(t *testing.T) {
			v := Verdict(tc.facts)
			require.Equal(t, tc.want, v.Verdict)
			require.Contains(t, v.Reason, tc.reason)
			require.Empty(t, v.CPUFlag, "Arm has no vmx/svm flag")
		})
	}
}

func TestArmBootFacts(t *testing.T) {
	for log, want := range map[string][2]string{
		"[    0.04] CPU: All CPU(s) started at EL2\n[    0.51] kvm [1]: VHE mode initialized successfully\n":            {"EL2", "VHE"},
		"[    0.04] CPU: All CPU(s) started at EL2\n[    0.51] kvm [1]: Hyp nVHE mode initialized successfully\n":       {"EL2", "nVHE"},
		"[    0.04] CPU: All CPU(s) started at EL2\n[    0.51] kvm [1]: Protected nVHE mode initialized successfully\n": {"EL2", "protected nVHE"},
		"[    0.04] CPU: All CPU(s) started at EL1\n[    0.51] kvm [1]: HYP mode not available\n":                       {"EL1", ""},
		"[    0.04] CPU: CPUs started in inconsistent modes\n":                                                          {"EL1", ""},
		"": {"", ""},
	} {
		el, mode := armBootFacts(log)
		require.Equal(t, want, [2]string{el, mode}, log)
	}
}

// On this machine the agent must agree with the test harness about KVM: the
// harness uses KVM only after the agent's own test guest ran and a real
// guest booted under qemu's KVM, so a harness on KVM with an agent calling
// it unusable (or the reverse, where qemu itself failed) is a probe that
// misses something.
func TestProbeAgreesWithQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 not found: install qemu-system-x86 (.ci/packages)")
	}
	t.Setenv(vm.EnvAccel, "")
	harness := vm.Choose()
	got := Verdict(Probe("/"))
	t.Logf("this machine: %+v; harness: %s", got, harness)
	switch harness.Evidence {
	case vm.KVMRan:
		require.True(t, got.KVMUsable, "qemu ran a guest under KVM but the agent says %+v", got)
	case vm.NoKVM:
		require.False(t, got.KVMUsable, "the harness found KVM unusable (%s) but the agent says %+v", harness.Reason, got)
		require.NotEqual(t, agentwire.VirtSupported, got.Verdict)
	case vm.QEMUFailed:
		require.False(t, got.KVMUsable, "qemu failed under KVM (%s) but the agent's test guest says KVM is usable: the agent's probe misses what qemu hit", harness.Reason)
	default:
		t.Fatalf("the harness has no evidence either way (%s): delete the memo named there and run again on a quieter machine", harness)
	}
}
