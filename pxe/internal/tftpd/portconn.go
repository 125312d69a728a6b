package tftpd

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
)

// portConn is the listening socket as pin/tftp's single-port mode sees it,
// where every transfer runs on the one socket. Given a *net.UDPConn, pin/tftp
// looks up the receiving interface, a netlink dump of every link on the host,
// for each datagram, which made single-port transfers 5 to 14 times slower
// than per-transfer sockets (make bench-pxe). portConn is not a *net.UDPConn, so
// pin/tftp reads and writes through it; it keeps the one thing that lookup was
// for, answering each client from the address its request was sent to
// (the socket usually listens on every address). The block size cap that
// pin/tftp derived from the interface comes from Config.MaxBlockSize.
type portConn struct {
	*net.UDPConn // Close, LocalAddr and the deadlines
	oob          []byte

	mu        sync.Mutex
	sources   map[netip.AddrPort]source
	lastSweep time.Time
}

// source is where a client's request was sent: the address to answer from.
type source struct {
	pktinfo []byte // IP_PKTINFO control message naming it
	seen    time.Time
}

// sourceTTL is how long a client's source is kept after its last datagram
// from us: longer than a transfer waits for an answer (Timeout × retries).
const sourceTTL = 2 * time.Minute

func newPortConn(c *net.UDPConn) (*portConn, error) {
	if err := ipv4.NewPacketConn(c).SetControlMessage(ipv4.FlagDst, true); err != nil {
		return nil, err
	}
	return &portConn{UDPConn: c, oob: ipv4.NewControlMessage(ipv4.FlagDst), sources: map[netip.AddrPort]source{}, lastSweep: time.Now()}, nil
}

// ReadFrom reads a datagram and, for a request that starts a transfer,
// remembers the address it was sent to. pin/tftp calls it from one
// goroutine.
func (c *portConn) ReadFrom(p []byte) (int, net.Addr, error) {
	n, oobn, _, from, err := c.ReadMsgUDP(p, c.oob)
	if err != nil {
		return n, nil, err
	}
	if n >= 2 && p[0] == 0 && (p[1] == 1 || p[1] == 2) { // RRQ or WRQ
		var cm ipv4.ControlMessage
		if cm.Parse(c.oob[:oobn]) == nil {
			c.remember(from, cm.Dst)
		}
	}
	return n, from, nil
}

func (c *portConn) remember(from *net.UDPAddr, dst net.IP) {
	if dst == nil || dst.IsMulticast() || dst.Equal(net.IPv4bcast) {
		return // not an address to answer from: the kernel picks one
	}
	pktinfo := (&ipv4.ControlMessage{Src: dst}).Marshal()
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.lastSweep) > sourceTTL {
		for k, s := range c.sources {
			if now.Sub(s.seen) > sourceTTL {
				delete(c.sources, k)
			}
		}
		c.lastSweep = now
	}
	c.sources[key(from)] = source{pktinfo: pktinfo, seen: now}
}

// WriteTo sends p to addr from the address addr's request was sent to.
func (c *portConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	to, ok := addr.(*net.UDPAddr)
	if !ok {
		return c.UDPConn.WriteTo(p, addr)
	}
	k := key(to)
	c.mu.Lock()
	s, ok := c.sources[k]
	if ok {
		s.seen = time.Now()
		c.sources[k] = s
	}
	c.mu.Unlock()
	n, _, err := c.WriteMsgUDP(p, s.pktinfo, to)
	return n, err
}

// key is addr as a map key, IPv4 in its 4-byte form.
func key(addr *net.UDPAddr) netip.AddrPort {
	ap := addr.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
