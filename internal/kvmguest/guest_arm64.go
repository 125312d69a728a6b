package kvmguest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// KVM ioctls and exit reasons for arm64 (linux/kvm.h).
const (
	kvmSetOneReg          = 0x4010AEAC // _IOW(KVMIO, 0xac, struct kvm_one_reg)
	kvmArmVCPUInit        = 0x4020AEAE // _IOW(KVMIO, 0xae, struct kvm_vcpu_init)
	kvmArmPreferredTarget = 0x8020AEAF // _IOR(KVMIO, 0xaf, struct kvm_vcpu_init)

	kvmExitMMIO        = 6
	kvmExitSystemEvent = 24

	// regPC is KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE |
	// (offsetof(struct kvm_regs, regs.pc) / 4): pc follows 31 registers
	// and sp, at byte 256.
	regPC = 0x6030000000100040

	guestAddr = 0x10000
	mmioAddr  = 0x20000 // outside guest memory: a store there exits
	testValue = 0x42
)

// guest runs at EL1 with the MMU off, as KVM_ARM_VCPU_INIT leaves it:
// store a value to an address no memory backs (an MMIO exit), then spin.
var guest = []uint32{
	0xd2800840, // movz x0, #0x42
	0xd2a00041, // movz x1, #0x2, lsl #16   (x1 = 0x20000)
	0xf9000020, // str  x0, [x1]
	0x14000000, // b    .
}

type vcpuInit struct {
	target   uint32
	features [7]uint32
}

type oneReg struct {
	id, addr uint64
}

func runGuest(dev string, stop *atomic.Bool) error {
	code := make([]byte, 4*len(guest))
	for i, insn := range guest {
		binary.LittleEndian.PutUint32(code[4*i:], insn)
	}
	t, err := newTestVM(dev, stop, code, guestAddr)
	if err != nil {
		return err
	}
	defer t.close()
	var init vcpuInit
	if _, err := ioctl(t.vm, kvmArmPreferredTarget, uintptr(unsafe.Pointer(&init))); err != nil {
		return fmt.Errorf("KVM_ARM_PREFERRED_TARGET: %w", err)
	}
	if _, err := ioctl(t.cpu, kvmArmVCPUInit, uintptr(unsafe.Pointer(&init))); err != nil {
		return fmt.Errorf("KVM_ARM_VCPU_INIT: %w", err)
	}
	pc := uint64(guestAddr)
	reg := oneReg{id: regPC, addr: uint64(uintptr(unsafe.Pointer(&pc)))}
	if _, err := ioctl(t.cpu, kvmSetOneReg, uintptr(unsafe.Pointer(&reg))); err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG (pc): %w", err)
	}
	reason, err := t.runOnce()
	if err != nil {
		return err
	}
	switch reason {
	case kvmExitMMIO:
		// struct kvm_run.mmio at 32: phys_addr, data[8], len, is_write.
		addr := *(*uint64)(unsafe.Pointer(&t.run[32]))
		data := *(*uint64)(unsafe.Pointer(&t.run[40]))
		if addr != mmioAddr || t.run[52] == 0 || data != testValue {
			return fmt.Errorf("KVM_RUN: unexpected MMIO exit at %#x (data %#x)", addr, data)
		}
		return nil
	case kvmExitInternalError:
		return errors.New("KVM_RUN: internal error in the test guest")
	case kvmExitFailEntry:
		return errors.New("KVM_RUN: the hardware refused to enter the guest")
	case kvmExitSystemEvent:
		return errors.New("KVM_RUN: the test guest reset or shut down")
	}
	return fmt.Errorf("KVM_RUN: unexpected exit reason %d", reason)
}
