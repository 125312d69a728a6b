//go:build amd64 || arm64

package kvmguest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KVM ioctls shared by the architectures (linux/kvm.h).
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmRun                 = 0xAE80

	kvmExitFailEntry     = 9
	kvmExitInternalError = 17

	kvmAPIVersion = 12
)

type memoryRegion struct {
	slot, flags                 uint32
	guestPhys, size, userMemory uint64
}

func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if e != 0 {
		return r, e
	}
	return r, nil
}

// testVM is a VM with one page of guest memory holding the test code at
// guestPhys, and one vCPU whose kvm_run area is mapped.
type testVM struct {
	kvm, vm, cpu int
	// stop is set when the caller gave up on the guest: an interrupted
	// KVM_RUN then returns instead of entering the guest again.
	stop     *atomic.Bool
	mem, run []byte
}

func newTestVM(dev string, stop *atomic.Bool, code []byte, guestPhys uint64) (*testVM, error) {
	t := &testVM{kvm: -1, vm: -1, cpu: -1, stop: stop}
	fail := func(err error) (*testVM, error) {
		t.close()
		return nil, err
	}
	var err error
	if t.kvm, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("open %s: %w", dev, err))
	}
	if v, err := ioctl(t.kvm, kvmGetAPIVersion, 0); err != nil || v != kvmAPIVersion {
		return fail(fmt.Errorf("KVM_GET_API_VERSION: %d, %v", v, err))
	}
	fd, err := ioctl(t.kvm, kvmCreateVM, 0)
	if err != nil {
		return fail(fmt.Errorf("KVM_CREATE_VM: %w", err))
	}
	t.vm = int(fd)
	if t.mem, err = unix.Mmap(-1, 0, 0x1000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS); err != nil {
		return fail(err)
	}
	copy(t.mem, code)
	region := memoryRegion{guestPhys: guestPhys, size: 0x1000, userMemory: uint64(uintptr(unsafe.Pointer(&t.mem[0])))}
	if _, err := ioctl(t.vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return fail(fmt.Errorf("KVM_SET_USER_MEMORY_REGION: %w", err))
	}
	if fd, err = ioctl(t.vm, kvmCreateVCPU, 0); err != nil {
		return fail(fmt.Errorf("KVM_CREATE_VCPU: %w", err))
	}
	t.cpu = int(fd)
	size, err := ioctl(t.kvm, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return fail(fmt.Errorf("KVM_GET_VCPU_MMAP_SIZE: %w", err))
	}
	if t.run, err = unix.Mmap(t.cpu, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(err)
	}
	return t, nil
}

// runOnce runs the vCPU until it exits (retrying interrupted calls) and
// returns the exit reason.
func (t *testVM) runOnce() (uint32, error) {
	for {
		if _, err := ioctl(t.cpu, kvmRun, 0); err != nil {
			if errors.Is(err, unix.EINTR) && !t.stop.Load() {
				continue
			}
			return 0, fmt.Errorf("KVM_RUN: %w", err)
		}
		return *(*uint32)(unsafe.Pointer(&t.run[8])), nil
	}
}

func (t *testVM) close() {
	if t.run != nil {
		unix.Munmap(t.run)
	}
	if t.mem != nil {
		unix.Munmap(t.mem)
	}
	for _, fd := range []int{t.cpu, t.vm, t.kvm} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
