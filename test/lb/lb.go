// Package lb is a TCP load balancer for benchmarks and tests: what a
// Kubernetes Service does in front of several replicas, on loopback.
package lb

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Serve forwards each connection ln accepts to the next backend that takes
// it, round robin, until ln is closed. A backend that is gone refuses the
// dial and the next one is tried; connections already forwarded to it end
// with it.
func Serve(ln net.Listener, backends []string) {
	var next atomic.Uint64
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			first := int(next.Add(1))
			var b net.Conn
			for i := range backends {
				if b, err = net.DialTimeout("tcp", backends[(first+i)%len(backends)], time.Second); err == nil {
					break
				}
			}
			if b == nil {
				return
			}
			defer b.Close()
			go func() {
				_, _ = io.Copy(b, c)
				_ = b.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(c, b)
		}()
	}
}
