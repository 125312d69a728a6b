// Package virt answers "can this host run virtual machines?" by asking the
// hardware and KVM rather than trusting CPU flags: CPUID (which firmware
// settings do not hide), the kernel's flags, /dev/kvm, and a tiny guest that
// KVM must actually run.
package virt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentboot/agentboot/internal/agentapi"
)

// Facts are the observations a verdict is made from.
type Facts struct {
	// CPUIDVirt is what CPUID says the processor supports: "vmx", "svm" or "".
	CPUIDVirt string
	// FlagVirt is the flag /proc/cpuinfo shows: "vmx", "svm" or "" (the
	// kernel hides it when firmware disabled the extension).
	FlagVirt string
	// Hypervisor is true inside a virtual machine.
	Hypervisor bool
	// KVMDevice is true when /dev/kvm exists.
	KVMDevice bool
	// KVMErr is nil when KVM ran a test guest, else why it could not.
	KVMErr error
	// Nested is "enabled", "disabled" or "" (KVM module not loaded).
	Nested      string
	IOMMUGroups int64
}

// Verdict turns facts into the report.
func Verdict(f Facts) agentapi.Virtualization {
	v := agentapi.Virtualization{
		CPUFlag:          f.FlagVirt,
		KVMDevicePresent: f.KVMDevice,
		KVMUsable:        f.KVMDevice && f.KVMErr == nil,
		Nested:           f.Nested,
		IOMMUGroups:      f.IOMMUGroups,
	}
	if f.KVMErr != nil {
		v.KVMError = f.KVMErr.Error()
	}
	ext := f.CPUIDVirt
	if ext == "" {
		ext = f.FlagVirt
	}
	name := map[string]string{"vmx": "Intel VT-x (vmx)", "svm": "AMD-V (svm)"}[ext]
	switch {
	case v.KVMUsable:
		v.Verdict = agentapi.VirtSupported
		v.Reason = "KVM runs guests"
		if name != "" {
			v.Reason += " with " + name
		}
	case f.Hypervisor:
		v.Verdict = agentapi.VirtVirtualMachineWithoutNested
		switch {
		case ext == "":
			v.Reason = "this is a virtual machine and its hypervisor does not offer nested virtualization (no vmx or svm)"
		default:
			v.Reason = fmt.Sprintf("this is a virtual machine whose hypervisor offers %s but KVM cannot run a guest: %s", name, kvmProblem(f))
		}
	case ext != "":
		v.Verdict = agentapi.VirtDisabledInFirmware
		v.Reason = fmt.Sprintf("the CPU supports %s but KVM cannot use it (%s): enable virtualization in the firmware setup", name, kvmProblem(f))
	default:
		v.Verdict = agentapi.VirtNotSupportedByCPU
		v.Reason = "the CPU has neither Intel VT-x (vmx) nor AMD-V (svm)"
	}
	return v
}

func kvmProblem(f Facts) string {
	switch {
	case !f.KVMDevice:
		return "no /dev/kvm"
	case f.KVMErr != nil:
		return f.KVMErr.Error()
	}
	return "unknown"
}

// Probe gathers the facts of this host; root is "/" except in tests.
func Probe(root string) Facts {
	f := Facts{}
	f.CPUIDVirt, f.Hypervisor = cpuidVirt()
	flags := cpuFlags(filepath.Join(root, "proc/cpuinfo"))
	switch {
	case flags["vmx"]:
		f.FlagVirt = "vmx"
	case flags["svm"]:
		f.FlagVirt = "svm"
	}
	f.Hypervisor = f.Hypervisor || flags["hypervisor"]
	if _, err := os.Stat(filepath.Join(root, "dev/kvm")); err == nil {
		f.KVMDevice = true
		f.KVMErr = tryKVM(filepath.Join(root, "dev/kvm"))
	}
	for _, mod := range []string{"kvm_intel", "kvm_amd"} {
		raw, err := os.ReadFile(filepath.Join(root, "sys/module", mod, "parameters/nested"))
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(raw)) {
		case "Y", "1":
			f.Nested = "enabled"
		default:
			f.Nested = "disabled"
		}
	}
	groups, _ := os.ReadDir(filepath.Join(root, "sys/kernel/iommu_groups"))
	f.IOMMUGroups = int64(len(groups))
	return f
}

func cpuFlags(path string) map[string]bool {
	raw, _ := os.ReadFile(path)
	flags := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			break
		}
	}
	return flags
}
