//go:build !amd64 && !arm64

package kvmguest

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// runGuest checks the API version and creates a VM; running a test guest is
// implemented for x86_64 and arm64 only.
func runGuest(dev string, _ *atomic.Bool) error {
	kvm, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(kvm)
	v, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(kvm), 0xAE00, 0)
	if e != 0 || v != 12 {
		return fmt.Errorf("KVM_GET_API_VERSION: %d, %v", v, e)
	}
	vm, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(kvm), 0xAE01, 0)
	if e != 0 {
		return fmt.Errorf("KVM_CREATE_VM: %v", e)
	}
	unix.Close(int(vm))
	return nil
}
