package erase

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernel asks devices, and sends them commands, through the kernel's
// ioctls.
type kernel struct{}

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
	// _IO('N', 0x40): the namespace ID of a namespace block device.
	nvmeIoctlID     = 0x4e40
	nvmeOpIdentify  = 0x06
	nvmeOpFormatNVM = 0x80
	// HDIO_GET_IDENTITY: libata answers it with IDENTIFY DEVICE.
	hdioGetIdentity = 0x030d
)

func (kernel) NVMe(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return identify(f, 0, 1, 0) // CNS 01h: the controller
}

// identify sends Identify with cns for namespace nsid; the kernel waits
// for the answer for timeout (its default admin timeout, 60 s, when 0).
func identify(f *os.File, nsid, cns uint32, timeout time.Duration) ([]byte, error) {
	buf := make([]byte, nvmeIdentifySize)
	cmd := nvmeAdminCmd{opcode: nvmeOpIdentify, nsid: nsid, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), dataLen: nvmeIdentifySize, cdw10: cns,
		timeoutMs: uint32(min(timeout.Milliseconds(), math.MaxUint32))}
	_, err := admin(f, &cmd)
	// The command holds buf's address as a number: keep buf alive until
	// the kernel has written it.
	runtime.KeepAlive(buf)
	if err != nil {
		return nil, fmt.Errorf("identify (CNS %02xh): %w", cns, err)
	}
	return buf, nil
}

// admin sends an NVMe admin command. The ioctl returns a negative errno
// when the kernel could not send it, and the NVMe status (non-zero: the
// controller refused or failed it) otherwise.
func admin(f *os.File, cmd *nvmeAdminCmd) (uint32, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(cmd)))
	if errno != 0 {
		return 0, errno
	}
	return cmd.result, nvmeStatus(int32(r))
}

// nvmeStatus is the error for the status the kernel returns from an NVMe
// passthrough ioctl (the completion's status field without its phase
// bit): nil for success.
func nvmeStatus(status int32) error {
	if status == 0 {
		return nil
	}
	dnr := ""
	if status&0x4000 != 0 {
		dnr = ", do not retry"
	}
	return fmt.Errorf("the controller answered status %#x (type %d, code %#02x%s)", status, status>>8&7, status&0xff, dnr)
}

// namespace returns the ID and Identify Namespace (CNS 00h) of the
// namespace block device open as f.
func namespace(f *os.File, timeout time.Duration) (uint32, []byte, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlID, 0)
	if errno != 0 {
		return 0, nil, fmt.Errorf("namespace ID: %w", errno)
	}
	nsid := uint32(r)
	raw, err := identify(f, nsid, 0, timeout)
	return nsid, raw, err
}

func (kernel) FormatProgress(f *os.File, wait time.Duration) (float64, bool) {
	_, raw, err := namespace(f, wait)
	if err != nil {
		return 0, false
	}
	return parseFormatProgress(raw)
}

func (kernel) FormatNVM(f *os.File, ses uint32, timeout time.Duration) error {
	nsid, raw, err := namespace(f, 0)
	if err != nil {
		return err
	}
	ns, err := parseNVMeNamespace(raw)
	if err != nil {
		return err
	}
	cmd := nvmeAdminCmd{opcode: nvmeOpFormatNVM, nsid: nsid, cdw10: ns.formatCDW10(ses), timeoutMs: uint32(min(timeout.Milliseconds(), math.MaxUint32))}
	if _, err := admin(f, &cmd); err != nil {
		return fmt.Errorf("format NVM (namespace %d, SES %d): %w", nsid, ses, err)
	}
	return nil
}

func (kernel) ATA(path string) ([]byte, error) {
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
