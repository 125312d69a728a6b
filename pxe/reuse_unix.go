//go:build unix

package pxe

import "golang.org/x/sys/unix"

// setReuseAddr lets a socket share its port with others that set it too.
func setReuseAddr(fd uintptr) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
}
