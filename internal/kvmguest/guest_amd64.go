package kvmguest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// KVM ioctls and exit reasons (linux/kvm.h, x86).
const (
	kvmGetSregs = 0x8138AE83
	kvmSetSregs = 0x4138AE84
	kvmSetRegs  = 0x4090AE82

	kvmExitIO       = 2
	kvmExitHLT      = 5
	kvmExitShutdown = 8

	sregsSize = 312
	regsSize  = 144
	guestAddr = 0x1000
	testPort  = 0x10
	testValue = 0x42
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

// runGuest runs the test guest to its halt.
func runGuest(dev string, stop *atomic.Bool) error {
	t, err := newTestVM(dev, stop, guest, guestAddr)
	if err != nil {
		return err
	}
	defer t.close()
	cpu, run := t.cpu, t.run
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
		reason, err := t.runOnce()
		if err != nil {
			return err
		}
		switch reason {
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
