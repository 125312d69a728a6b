//go:build !linux

package tftpd

import (
	"errors"
	"net"
)

type loop struct{}

func newLoop(*Server, net.PacketConn) (*loop, error) {
	return nil, errors.New("the TFTP server runs on Linux only (epoll, recvmmsg)")
}

func (*loop) wakeUp()    {}
func (*loop) run() error { return nil }
