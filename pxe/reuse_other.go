//go:build !unix

package pxe

import "errors"

func setReuseAddr(uintptr) error {
	return errors.New("sharing the DHCPv6 port is not supported on this system")
}
