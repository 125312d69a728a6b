// Package kvmguest runs a tiny guest through /dev/kvm and says whether KVM
// ran its code: the one check behind both the on-host agent's
// virtualization report (agent/internal/virt) and the test harness's choice
// of qemu accelerator (test/vm), so the two cannot disagree about a machine.
// It needs no client library and no qemu, only the KVM ioctls; it never
// touches anything but the VM it creates.
package kvmguest
