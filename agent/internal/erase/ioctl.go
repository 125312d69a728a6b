package erase

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlIdentifier asks the device through the kernel.
type ioctlIdentifier struct{}

// nvmeAdminCmd is the kernel's struct nvme_passthru_cmd (linux/nvme_ioctl.h).
type nvmeAdminCmd struct {
	opcode      uint8
	flags       uint8
	rsvd1       uint16
	nsid        uint32
	cdw2, cdw3  uint32
	metadata    uint64
	addr        uint64
	metadataLen uint32
	dataLen     uint32
	cdw10       uint32
	cdw11       uint32
	cdw12       uint32
	cdw13       uint32
	cdw14       uint32
	cdw15       uint32
	timeoutMs   uint32
	result      uint32
}

const (
	// _IOWR('N', 0x41, struct nvme_passthru_cmd).
	nvmeIoctlAdminCmd = 0xc0484e41
	nvmeOpIdentify    = 0x06
	// HDIO_GET_IDENTITY: libata answers it with IDENTIFY DEVICE.
	hdioGetIdentity = 0x030d
)

func (ioctlIdentifier) NVMe(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, nvmeIdentifySize)
	cmd := nvmeAdminCmd{opcode: nvmeOpIdentify, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), dataLen: nvmeIdentifySize, cdw10: 1} // CNS 01h: the controller
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&cmd)))
	// The command holds buf's address as a number: keep buf alive until
	// the kernel has written it.
	runtime.KeepAlive(buf)
	if errno != 0 {
		return nil, fmt.Errorf("identify controller: %w", errno)
	}
	return buf, nil
}

func (ioctlIdentifier) ATA(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, ataIdentifySize)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), hdioGetIdentity, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return nil, errno
	}
	return buf, nil
}
