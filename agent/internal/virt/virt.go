// Package virt answers "can this host run virtual machines?" by asking the
// hardware and KVM rather than trusting CPU flags: CPUID (which firmware
// settings do not hide), the kernel's flags, /dev/kvm, and a tiny guest that
// KVM must actually run.
package virt

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/kvmguest"
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

	// Arm (aarch64) has no CPU flag for virtualization: KVM needs the
	// kernel to have started at EL2, which the kernel logs.

	// Arm is true on an aarch64 host.
	Arm bool
	// EL is the exception level the kernel says it started at: "EL2",
	// "EL1" or "" (not logged).
	EL string
	// HypMode is how KVM set itself up: "VHE", "nVHE", "protected nVHE",
	// or "" (not logged).
	HypMode string
}

// Verdict turns facts into the report.
func Verdict(f Facts) agentwire.Virtualization {
	v := agentwire.Virtualization{
		CPUFlag:          f.FlagVirt,
		KVMDevicePresent: f.KVMDevice,
		KVMUsable:        f.KVMDevice && f.KVMErr == nil,
		Nested:           f.Nested,
		IOMMUGroups:      f.IOMMUGroups,
	}
	if f.KVMErr != nil {
		v.KVMError = f.KVMErr.Error()
	}
	if f.Arm {
		return armVerdict(f, v)
	}
	ext := f.CPUIDVirt
	if ext == "" {
		ext = f.FlagVirt
	}
	name := map[string]string{"vmx": "Intel VT-x (vmx)", "svm": "AMD-V (svm)"}[ext]
	switch {
	case v.KVMUsable:
		v.Verdict = agentwire.VirtSupported
		v.Reason = "KVM runs guests"
		if name != "" {
			v.Reason += " with " + name
		}
	case f.Hypervisor:
		v.Verdict = agentwire.VirtVirtualMachineWithoutNested
		switch {
		case ext == "":
			v.Reason = "this is a virtual machine and its hypervisor does not offer nested virtualization (no vmx or svm)"
		default:
			v.Reason = fmt.Sprintf("this is a virtual machine whose hypervisor offers %s but KVM cannot run a guest: %s", name, kvmProblem(f))
		}
	case ext != "":
		v.Verdict = agentwire.VirtDisabledInFirmware
		v.Reason = fmt.Sprintf("the CPU supports %s but KVM cannot use it (%s): enable virtualization in the firmware setup", name, kvmProblem(f))
	default:
		v.Verdict = agentwire.VirtNotSupportedByCPU
		v.Reason = "the CPU has neither Intel VT-x (vmx) nor AMD-V (svm)"
	}
	return v
}

// armVerdict is the verdict of an aarch64 host, with the same names as on
// x86: KVM runs a guest, or why not.
func armVerdict(f Facts, v agentwire.Virtualization) agentwire.Virtualization {
	mode := ""
	if f.HypMode != "" {
		mode = ", " + f.HypMode
	}
	switch {
	case v.KVMUsable:
		v.Verdict = agentwire.VirtSupported
		v.Reason = "KVM runs guests (the kernel runs at EL2" + mode + ")"
	case f.Hypervisor:
		v.Verdict = agentwire.VirtVirtualMachineWithoutNested
		v.Reason = "this is a virtual machine and its hypervisor does not give it EL2 (nested virtualization): " + kvmProblem(f)
	case f.EL == "EL1":
		v.Verdict = agentwire.VirtDisabledInFirmware
		v.Reason = "the kernel was started at EL1, so KVM cannot run: the firmware or boot loader did not hand EL2 to the OS (" + kvmProblem(f) + ")"
	case f.EL == "EL2":
		v.Verdict = agentwire.VirtDisabledInFirmware
		v.Reason = "the kernel runs at EL2 but KVM cannot run a guest: " + kvmProblem(f)
	default:
		v.Verdict = agentwire.VirtNotSupportedByCPU
		v.Reason = "no sign of EL2: the kernel did not log starting at EL2, and " + kvmProblem(f)
	}
	return v
}

// armBootFacts reads what an aarch64 kernel logged about its exception
// level and KVM's hypervisor mode.
func armBootFacts(log string) (el, mode string) {
	for _, line := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(line, "CPU: All CPU(s) started at EL2"):
			el = "EL2"
		case strings.Contains(line, "CPU: All CPU(s) started at EL1"):
			el = "EL1"
		case strings.Contains(line, "CPU: CPUs started in inconsistent modes"):
			el = "EL1" // some at EL1: KVM is off
		// kvm_info in arch/arm64/kvm/arm.c; the most specific first.
		case strings.Contains(line, "Protected nVHE mode initialized successfully"):
			mode = "protected nVHE"
		case strings.Contains(line, "Hyp hVHE mode initialized successfully"):
			mode = "hVHE"
		case strings.Contains(line, "Hyp nVHE mode initialized successfully"), strings.Contains(line, "Hyp mode initialized successfully"):
			mode = "nVHE"
		case strings.Contains(line, "VHE mode initialized successfully"):
			mode = "VHE"
		}
	}
	return el, mode
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
		f.KVMErr = kvmguest.Run(filepath.Join(root, "dev/kvm"))
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
	if f.Arm = runtime.GOARCH == "arm64"; f.Arm {
		f.EL, f.HypMode = armBootFacts(kernelLog(root))
		if _, err := os.Stat(filepath.Join(root, "sys/firmware/devicetree/base/hypervisor")); err == nil {
			f.Hypervisor = true
		}
		dmi := ""
		for _, name := range []string{"sys_vendor", "product_name"} {
			raw, _ := os.ReadFile(filepath.Join(root, "sys/class/dmi/id", name))
			dmi += strings.ToLower(string(raw)) + " "
		}
		if strings.Contains(dmi, "qemu") || strings.Contains(dmi, "kvm") || strings.Contains(dmi, "amazon ec2") || strings.Contains(dmi, "google compute") {
			f.Hypervisor = true
		}
		if f.KVMDevice {
			f.Nested = "disabled"
			if cmdline, _ := os.ReadFile(filepath.Join(root, "proc/cmdline")); strings.Contains(string(cmdline), "kvm-arm.mode=nested") {
				f.Nested = "enabled"
			}
		}
	}
	return f
}

// kernelLog is the kernel's log buffer (root may read it); in tests, the
// file root/dmesg.
func kernelLog(root string) string {
	if root != "/" {
		raw, _ := os.ReadFile(filepath.Join(root, "dmesg"))
		return string(raw)
	}
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(3, buf) // SYSLOG_ACTION_READ_ALL
	if err != nil || n < 0 {
		return ""
	}
	return string(buf[:n])
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
