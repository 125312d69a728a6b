package tftpd

import (
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzServerPackets sends arbitrary datagrams to running servers, both to
// the listening port and from a client in the middle of a transfer, and
// then checks that each server still answers a request: a packet can
// neither crash the loop nor stop it.
func FuzzServerPackets(f *testing.F) {
	for _, seed := range seeds(f) {
		f.Add(seed)
	}
	f.Add([]byte{0, opACK, 0, 0})
	f.Add([]byte{0, opERROR, 0, 0, 0})
	f.Add([]byte{0, opDATA, 0, 1, 'x'})
	dir, _ := files(f)
	var servers []*net.UDPAddr
	// The probe that checks a server still answers keeps its port for the
	// whole run: a fresh socket could get the port of a closed client and
	// with it an answer meant for that client.
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { probe.Close() })
	for _, singlePort := range []bool{false, true} {
		cfg := config(dir, singlePort)
		cfg.Timeout, cfg.Retries, cfg.Log, cfg.Registerer = 20*time.Millisecond, 1, logr.Discard(), prometheus.NewRegistry()
		s, err := New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			f.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(conn) }()
		f.Cleanup(func() {
			s.Shutdown()
			if err := <-done; err != nil {
				f.Error(err)
			}
			conn.Close()
		})
		servers = append(servers, conn.LocalAddr().(*net.UDPAddr))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, server := range servers {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			// Start a transfer, then send p to the listening port and to
			// the transfer's.
			_, _ = c.WriteToUDP(rrq("undionly.kpxe", "blksize", "1468"), server)
			buf := make([]byte, 2048)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			targets := []*net.UDPAddr{server}
			if _, from, err := c.ReadFromUDP(buf); err == nil && from.Port != server.Port {
				targets = append(targets, from)
			}
			for _, to := range targets {
				_, _ = c.WriteToUDP(p, to)
			}
			c.Close()

			_, _ = probe.WriteToUDP(rrq("nothing-here"), server)
			_ = probe.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := probe.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("no answer after %q: %v", p, err)
			}
			if from.Port != server.Port || string(buf[:n]) != string(appendError(nil, errNotFound, "file not found")) {
				t.Fatalf("after %q, %s answered %q", p, from, buf[:n])
			}
		}
	})
}
