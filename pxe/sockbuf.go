package pxe

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// receiveBuffer is what each UDP socket of the service asks to queue: a
// thousand DISCOVERs (or TFTP requests) arriving together, about 2 KiB of
// kernel memory each. The kernel's default (net.core.rmem_default, 208
// KiB) holds a hundred; the rest would be lost, and firmware asks again
// only 4 s later.
const receiveBuffer = 4 << 20

// growReceiveBuffer asks for receiveBuffer on conn: beyond
// net.core.rmem_max when the process may (CAP_NET_ADMIN), else up to it.
// It returns the size the kernel reports: twice what it granted, the
// doubling its own bookkeeping.
func growReceiveBuffer(conn net.PacketConn) (int, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, errors.New("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	err = raw.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, receiveBuffer) != nil {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, receiveBuffer); serr != nil {
				return
			}
		}
		got, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	if err != nil {
		return 0, err
	}
	return got, serr
}
