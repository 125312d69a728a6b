package virt

// cpuid executes the CPUID instruction (cpuid_amd64.s).
func cpuid(leaf, subleaf uint32) (eax, ebx, ecx, edx uint32)

// cpuidVirt reads the virtualization extension and the hypervisor bit from
// CPUID: unlike /proc/cpuinfo they stay set when firmware disables VT-x.
func cpuidVirt() (ext string, hypervisor bool) {
	_, _, ecx, _ := cpuid(1, 0)
	hypervisor = ecx&(1<<31) != 0
	if ecx&(1<<5) != 0 {
		return "vmx", hypervisor
	}
	if maxExt, _, _, _ := cpuid(0x80000000, 0); maxExt >= 0x80000001 {
		if _, _, ecx, _ := cpuid(0x80000001, 0); ecx&(1<<2) != 0 {
			return "svm", hypervisor
		}
	}
	return "", hypervisor
}
