package tftpd

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Names outside Files come from the Source, fetched off the loop: the
// client gets the content the Source returned, asked by its name without
// the leading slash; the listed files never reach the Source.
func TestSourceServesOtherNames(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		dynamic := content(300_000)
		var mu sync.Mutex
		var asked []string
		var clients []netip.Addr
		s, port := serve(t, Config{Dir: dir, Files: []string{"ipxe.efi"}, SinglePort: singlePort, Timeout: time.Second,
			Source: func(_ context.Context, name string, client netip.Addr) ([]byte, error) {
				mu.Lock()
				defer mu.Unlock()
				asked, clients = append(asked, name), append(clients, client)
				return dynamic, nil
			}})
		c := newRawClient(t)
		require.Equal(t, dynamic, fetch(t, c, localhost(port), "/agentboot/boot.grub?mac=52:54:00:aa:00:01&arch=arm64", 1468))
		require.Equal(t, want["ipxe.efi"], fetch(t, c, localhost(port), "ipxe.efi", 1468))
		mu.Lock()
		require.Equal(t, []string{"agentboot/boot.grub?mac=52:54:00:aa:00:01&arch=arm64"}, asked)
		require.Equal(t, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, clients)
		mu.Unlock()
		waitFor(t, s.m.transfers.WithLabelValues(resultOK), 2)
	})
}

// A Source's errors reach the client as TFTP errors: not found as code 1,
// anything else with its message.
func TestSourceErrors(t *testing.T) {
	dir, _ := files(t)
	s, port := serve(t, Config{Dir: dir, Timeout: time.Second,
		Source: func(_ context.Context, name string, _ netip.Addr) ([]byte, error) {
			if name == "missing" {
				return nil, ErrNotFound
			}
			return nil, errors.New("image service: 503 Service Unavailable")
		}})
	c := newRawClient(t)
	c.send(localhost(port), rrq("missing"))
	p, _ := c.recv()
	code, msg := errorPacket(t, p)
	require.Equal(t, uint16(errNotFound), code)
	require.Equal(t, "file not found", msg)
	c.send(localhost(port), rrq("agentboot/boot.grub?mac=x"))
	p, _ = c.recv()
	code, msg = errorPacket(t, p)
	require.Equal(t, uint16(errUndefined), code)
	require.Equal(t, "image service: 503 Service Unavailable", msg)
	waitFor(t, s.m.transfers.WithLabelValues(resultNotFound), 1)
	waitFor(t, s.m.transfers.WithLabelValues(resultError), 1)
}

// While the Source works, a client asking again is not sent a second
// transfer and other clients are served.
func TestSlowSource(t *testing.T) {
	dir, want := files(t)
	release := make(chan struct{})
	s, port := serve(t, Config{Dir: dir, Files: []string{"ipxe.efi"}, Timeout: time.Second,
		Source: func(ctx context.Context, _ string, _ netip.Addr) ([]byte, error) {
			select {
			case <-release:
				return []byte("slow content"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	slow := newRawClient(t)
	slow.send(localhost(port), rrq("slow"))
	slow.send(localhost(port), rrq("slow"))
	waitFor(t, s.m.dropped.WithLabelValues("duplicate-request"), 1)
	require.Equal(t, want["ipxe.efi"], fetch(t, newRawClient(t), localhost(port), "ipxe.efi", 1468), "others are served meanwhile")

	close(release)
	p, from := slow.recv()
	require.Equal(t, "slow content", string(p[4:]))
	slow.send(from, ack(1))
	waitFor(t, s.m.transfers.WithLabelValues(resultOK), 2)
}

// Shutdown does not wait for a Source that hangs: its context ends.
func TestShutdownEndsSource(t *testing.T) {
	dir, _ := files(t)
	asked, cancelled := make(chan struct{}), make(chan struct{})
	s, err := New(Config{Dir: dir, Timeout: time.Second, Source: func(ctx context.Context, _ string, _ netip.Addr) ([]byte, error) {
		close(asked)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}})
	require.NoError(t, err)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer conn.Close()
	done := make(chan error, 1)
	go func() { done <- s.Serve(conn) }()
	newRawClient(t).send(conn.LocalAddr().(*net.UDPAddr), rrq("never"))
	<-asked
	start := time.Now()
	s.Shutdown()
	require.NoError(t, <-done)
	require.Less(t, time.Since(start), 2*time.Second)
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the Source's context did not end with the server")
	}
}

// Logged names lose their query: the image service's URLs carry tokens.
func TestLogNameDropsQuery(t *testing.T) {
	require.Equal(t, "agentboot/images/u/v/initrd.img?…", logName("agentboot/images/u/v/initrd.img?token=secret"))
	require.Equal(t, "ipxe.efi", logName("ipxe.efi"))
}

// A client that starts over asking for another file while the first is
// still being fetched gets the file it asked for last, never the other.
func TestSourceClientStartsOver(t *testing.T) {
	dir, _ := files(t)
	release := make(chan struct{})
	s, port := serve(t, Config{Dir: dir, Timeout: time.Second,
		Source: func(ctx context.Context, name string, _ netip.Addr) ([]byte, error) {
			if name == "first" {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return []byte("content of " + name), nil
		}})
	c := newRawClient(t)
	c.send(localhost(port), rrq("first"))
	waitFor(t, s.m.active, 0)
	c.send(localhost(port), rrq("second"))
	p, from := c.recv()
	require.Equal(t, "content of second", string(p[4:]))
	c.send(from, ack(1))
	close(release)
	waitFor(t, s.m.transfers.WithLabelValues(resultOK), 1)
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, _, err := c.conn.ReadFromUDP(c.buf)
	require.Error(t, err, "the abandoned file is never sent")
}

// Proxied content is sent as it is (no netascii copy per request), and a
// client's timeout above 10 s is not acknowledged for it.
func TestSourceOptions(t *testing.T) {
	dir, _ := files(t)
	_, port := serve(t, Config{Dir: dir, Timeout: time.Second,
		Source: func(context.Context, string, netip.Addr) ([]byte, error) { return []byte("big file"), nil }})
	c := newRawClient(t)
	p := []byte{0, 1}
	for _, f := range []string{"proxied", "netascii"} {
		p = append(append(p, f...), 0)
	}
	c.send(localhost(port), p)
	reply, _ := c.recv()
	code, msg := errorPacket(t, reply)
	require.Equal(t, uint16(errIllegalOp), code)
	require.Contains(t, msg, "use octet")

	c.send(localhost(port), rrq("proxied", "timeout", "255", "tsize", "0"))
	reply, _ = c.recv()
	require.Equal(t, map[string]string{"tsize": "8"}, oack(t, reply), "timeout 255 is not acknowledged")
	c2 := newRawClient(t)
	c2.send(localhost(port), rrq("proxied2", "timeout", "5"))
	reply, _ = c2.recv()
	require.Equal(t, map[string]string{"timeout": "5"}, oack(t, reply))
}

// Transfers hold at most MaxSourceBytes of distinct Source content: content
// many transfers share counts once, and a request past the bound is dropped
// until a transfer ends.
func TestSourceMemoryBound(t *testing.T) {
	dir, _ := files(t)
	shared := content(1000)
	s, port := serve(t, Config{Dir: dir, Timeout: time.Second, MaxSourceBytes: 1500,
		Source: func(_ context.Context, name string, _ netip.Addr) ([]byte, error) {
			if name == "shared" {
				return shared, nil
			}
			return content(1000), nil // a copy of its own
		}})
	a, b, c := newRawClient(t), newRawClient(t), newRawClient(t)
	a.send(localhost(port), rrq("shared", "blksize", "512"))
	first, fromA := a.recv()
	require.Equal(t, 512, len(first)-4, "a holds the shared content, unacknowledged")
	b.send(localhost(port), rrq("shared", "blksize", "512"))
	_, fromB := b.recv()
	c.send(localhost(port), rrq("own"))
	waitFor(t, s.m.dropped.WithLabelValues("source-memory"), 1)

	for _, x := range []struct {
		c    *rawClient
		from *net.UDPAddr
	}{{a, fromA}, {b, fromB}} {
		x.c.send(x.from, ack(1))
		p, _ := x.c.recv()
		x.c.send(x.from, ack(2))
		require.Equal(t, 1000-512, len(p)-4)
	}
	waitFor(t, s.m.transfers.WithLabelValues(resultOK), 2)
	require.Equal(t, content(1000), fetch(t, c, localhost(port), "own", 1468), "once they ended, there is room")
}
