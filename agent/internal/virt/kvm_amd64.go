package virt

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KVM ioctls and exit reasons (linux/kvm.h, x86).
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmRun                 = 0xAE80
	kvmGetSregs            = 0x8138AE83
	kvmSetSregs            = 0x4138AE84
	kvmSetRegs             = 0x4090AE82

	kvmExitIO            = 2
	kvmExitHLT           = 5
	kvmExitShutdown      = 8
	kvmExitFailEntry     = 9
	kvmExitInternalError = 17

	kvmAPIVersion = 12
	sregsSize     = 312
	regsSize      = 144
	guestAddr     = 0x1000
	testPort      = 0x10
	testValue     = 0x42
)

// guest is real-mode code: write a byte to an I/O port, initialise and wait
// on the FPU (instructions some broken nested setups cannot emulate), halt.
var guest = []byte{
	0xb0, testValue, // mov al, 0x42
	0xe6, testPort, // out 0x10, al
	0xdb, 0xe3, // fninit
	0x9b, // fwait
	0xf4, // hlt
}

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

// tryKVM creates a VM and runs the test guest to its halt. A /dev/kvm that
// answers the API but cannot run code is not usable.
func tryKVM(dev string) error {
	done := make(chan error, 1)
	go func() { done <- runGuest(dev) }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		return errors.New("KVM_RUN did not return within 5s")
	}
}

func runGuest(dev string) error {
	kvm, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(kvm)
	if v, err := ioctl(kvm, kvmGetAPIVersion, 0); err != nil || v != kvmAPIVersion {
		return fmt.Errorf("KVM_GET_API_VERSION: %d, %v", v, err)
	}
	vmfd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	vm := int(vmfd)
	defer unix.Close(vm)
	mem, err := unix.Mmap(-1, 0, 0x1000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	copy(mem, guest)
	region := memoryRegion{guestPhys: guestAddr, size: 0x1000, userMemory: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if _, err := ioctl(vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return fmt.Errorf("KVM_SET_USER_MEMORY_REGION: %w", err)
	}
	cpufd, err := ioctl(vm, kvmCreateVCPU, 0)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VCPU: %w", err)
	}
	cpu := int(cpufd)
	defer unix.Close(cpu)
	size, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return fmt.Errorf("KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	run, err := unix.Mmap(cpu, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(run)

	var sregs [sregsSize]byte
	if _, err := ioctl(cpu, kvmGetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_GET_SREGS: %w", err)
	}
	// cs (the first kvm_segment): base 0, selector 0, so CS:IP = 0:0x1000.
	*(*uint64)(unsafe.Pointer(&sregs[0])) = 0
	*(*uint16)(unsafe.Pointer(&sregs[12])) = 0
	if _, err := ioctl(cpu, kvmSetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_SREGS: %w", err)
	}
	var regs [regsSize]byte
	*(*uint64)(unsafe.Pointer(&regs[128])) = guestAddr // rip
	*(*uint64)(unsafe.Pointer(&regs[136])) = 0x2       // rflags
	if _, err := ioctl(cpu, kvmSetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_REGS: %w", err)
	}
	sawIO := false
	for i := 0; i < 16; i++ {
		if _, err := ioctl(cpu, kvmRun, 0); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("KVM_RUN: %w", err)
		}
		switch reason := *(*uint32)(unsafe.Pointer(&run[8])); reason {
		case kvmExitIO:
			// struct kvm_run.io: direction, size, port, count, data_offset.
			port := *(*uint16)(unsafe.Pointer(&run[34]))
			off := *(*uint64)(unsafe.Pointer(&run[40]))
			if port != testPort || off >= uint64(len(run)) || run[off] != testValue {
				return fmt.Errorf("KVM_RUN: unexpected I/O exit on port %#x", port)
			}
			sawIO = true
		case kvmExitHLT:
			if !sawIO {
				return errors.New("KVM_RUN: the guest halted without running its code")
			}
			return nil
		case kvmExitInternalError:
			return errors.New("KVM_RUN: internal error (emulation failure) in the test guest")
		case kvmExitFailEntry:
			return errors.New("KVM_RUN: the hardware refused to enter the guest")
		case kvmExitShutdown:
			return errors.New("KVM_RUN: the test guest shut down (triple fault)")
		default:
			return fmt.Errorf("KVM_RUN: unexpected exit reason %d", reason)
		}
	}
	return errors.New("KVM_RUN: the test guest never halted")
}
