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
