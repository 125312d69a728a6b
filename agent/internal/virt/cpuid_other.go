//go:build !amd64

package virt

// cpuidVirt has no CPUID to read outside x86; the kernel's flags decide.
func cpuidVirt() (string, bool) { return "", false }
