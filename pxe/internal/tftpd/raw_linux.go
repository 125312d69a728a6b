package tftpd

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loop's system calls, made without telling the Go scheduler. Each of
// them returns at once: the sockets are non-blocking, sends and receives
// pass MSG_DONTWAIT and epoll_wait a zero timeout, so none can hold a
// thread. Announced to the scheduler (syscall.Syscall), every call would
// also wake the runtime's monitor thread, which then polls every 20 µs for
// a millisecond at least: with a call per block that was 14% of the loop's
// CPU in make bench-pxe.

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func rawSocket() (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	return int(fd), errnoErr(e)
}

func rawBind(fd int, sa *unix.RawSockaddrInet4) error {
	_, _, e := unix.RawSyscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(sa)), unix.SizeofSockaddrInet4)
	return errnoErr(e)
}

// rawConnect connects a UDP socket, which only records the peer.
func rawConnect(fd int, sa *unix.RawSockaddrInet4) error {
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(sa)), unix.SizeofSockaddrInet4)
	return errnoErr(e)
}

func rawEpollAdd(ep, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(ep), unix.EPOLL_CTL_ADD, uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	return errnoErr(e)
}

// rawEpollPoll returns the ready events without waiting. It is
// epoll_pwait with no signal mask, as newer architectures (arm64) have no
// epoll_wait.
func rawEpollPoll(ep int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	return int(n), errnoErr(e)
}

// rawClose closes a UDP socket, which never lingers.
func rawClose(fd int) {
	unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

func rawRead(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), errnoErr(e)
}

func rawWrite(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), errnoErr(e)
}

func rawRecvmmsg(fd int, msgs []unix.Mmsghdr) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), errnoErr(e)
}

func rawSendmmsg(fd int, msgs []unix.Mmsghdr) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), errnoErr(e)
}
