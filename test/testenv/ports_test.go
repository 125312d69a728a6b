package testenv

import (
	"fmt"
	"net"
	"testing"
)

// The ports are distinct, outside the ephemeral range that connect() and
// listens on :0 draw from, and free to listen on.
func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	low, high := unreservedPorts()
	if high == low {
		t.Skip("the ephemeral range leaves too few ports below 30000 on this machine")
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d given twice", p)
		}
		seen[p] = true
		if p < low || p >= high {
			t.Errorf("port %d is outside %d-%d", p, low, high)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		l.Close()
	}
	// An ephemeral port is never in the range.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := l.Addr().(*net.TCPAddr).Port; p >= low && p < high {
		t.Errorf("the kernel gave ephemeral port %d, inside %d-%d", p, low, high)
	}
}
