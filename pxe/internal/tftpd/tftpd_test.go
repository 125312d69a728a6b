package tftpd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"
)

// serve runs a server on a socket listening on every address and
// returns it and its port.
func serve(t *testing.T, cfg Config) (*Server, int) {
	t.Helper()
	cfg.Log = testr.New(t)
	s, err := New(cfg)
	require.NoError(t, err)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{})
	require.NoError(t, err)
	// Serve asks for each datagram's destination; a request queued before
	// it does would arrive without it.
	require.NoError(t, ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst, true))
	done := make(chan error, 1)
	go func() { done <- s.Serve(conn) }()
	t.Cleanup(func() {
		s.Shutdown()
		require.NoError(t, <-done)
		_ = conn.Close()
	})
	return s, conn.LocalAddr().(*net.UDPAddr).Port
}

// rawClient speaks TFTP packet by packet, to see addresses and options.
type rawClient struct {
	t    *testing.T
	conn *net.UDPConn
	buf  []byte
}

func newRawClient(t *testing.T) *rawClient {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &rawClient{t: t, conn: conn, buf: make([]byte, 70000)}
}

func (c *rawClient) send(to *net.UDPAddr, p []byte) {
	_, err := c.conn.WriteToUDP(p, to)
	require.NoError(c.t, err)
}

func (c *rawClient) recv() ([]byte, *net.UDPAddr) {
	require.NoError(c.t, c.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, from, err := c.conn.ReadFromUDP(c.buf)
	require.NoError(c.t, err)
	return c.buf[:n], from
}

func rrq(file string, opts ...string) []byte {
	p := []byte{0, 1}
	for _, s := range append([]string{file, "octet"}, opts...) {
		p = append(append(p, s...), 0)
	}
	return p
}

func ack(block uint16) []byte { return binary.BigEndian.AppendUint16([]byte{0, 4}, block) }

// oack parses an option acknowledgement.
func oack(t *testing.T, p []byte) map[string]string {
	require.GreaterOrEqual(t, len(p), 2)
	require.Equal(t, uint16(6), binary.BigEndian.Uint16(p), "OACK, got %q", p)
	fields := bytes.Split(bytes.TrimSuffix(p[2:], []byte{0}), []byte{0})
	require.Zero(t, len(fields)%2, "option pairs in %q", p)
	opts := map[string]string{}
	for i := 0; i < len(fields); i += 2 {
		opts[string(fields[i])] = string(fields[i+1])
	}
	return opts
}

// A client that sent its request to one of the host's addresses gets every
// answer from that address, with and without single-port mode, and the
// block size is capped at MaxBlockSize whatever the client asks for.
func TestAnswersFromTheAddressAskedWithCappedBlocks(t *testing.T) {
	dir := t.TempDir()
	want := make([]byte, 10_000)
	for i := range want {
		want[i] = byte(i * 7)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ipxe.efi"), want, 0o644))
	for _, singlePort := range []bool{false, true} {
		t.Run(fmt.Sprintf("single-port=%v", singlePort), func(t *testing.T) {
			_, port := serve(t, Config{Dir: dir, Files: []string{"ipxe.efi"}, SinglePort: singlePort, MaxBlockSize: 1468, Timeout: time.Second})
			c := newRawClient(t)
			// 127.0.0.2 is local, not the client's address: an answer the
			// kernel sources by route would come from 127.0.0.1.
			server := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port}
			c.send(server, rrq("ipxe.efi", "blksize", "8192", "tsize", "0"))
			p, from := c.recv()
			require.True(t, from.IP.Equal(server.IP), "answer from %s, want from %s", from, server.IP)
			if singlePort {
				require.Equal(t, port, from.Port, "single-port mode answers from the listening port")
			} else {
				require.NotEqual(t, port, from.Port, "a transfer gets its own port")
			}
			require.Equal(t, map[string]string{"blksize": "1468", "tsize": strconv.Itoa(len(want))}, oack(t, p))

			var got []byte
			c.send(from, ack(0))
			for block := uint16(1); ; block++ {
				p, dfrom := c.recv()
				require.Equal(t, from.String(), dfrom.String(), "block %d from the transfer's address", block)
				require.GreaterOrEqual(t, len(p), 4)
				require.Equal(t, []byte{0, 3}, p[:2], "DATA, got %q", p)
				require.Equal(t, block, binary.BigEndian.Uint16(p[2:]))
				require.LessOrEqual(t, len(p)-4, 1468)
				got = append(got, p[4:]...)
				c.send(from, ack(block))
				if len(p)-4 < 1468 {
					break
				}
			}
			require.Equal(t, want, got)
		})
	}
}

func TestMaxBlockSizeOutOfRange(t *testing.T) {
	for _, n := range []int{512, 65465, -1} {
		_, err := New(Config{MaxBlockSize: n})
		require.ErrorContains(t, err, "maximum block size", "%d", n)
	}
}

// files writes the served files and returns the directory.
func files(t testing.TB) (string, map[string][]byte) {
	dir := t.TempDir()
	want := map[string][]byte{"ipxe.efi": content(100_000), "undionly.kpxe": content(74213), "text.cfg": []byte("a\nb\rc\n")}
	for name, data := range want {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	return dir, want
}

func config(dir string, singlePort bool) Config {
	return Config{Dir: dir, Files: []string{"ipxe.efi", "undionly.kpxe", "text.cfg"}, SinglePort: singlePort,
		Timeout: 100 * time.Millisecond, Retries: 3, Registerer: prometheus.NewRegistry()}
}

func forBothModes(t *testing.T, test func(t *testing.T, singlePort bool)) {
	for _, singlePort := range []bool{false, true} {
		t.Run(fmt.Sprintf("single-port=%v", singlePort), func(t *testing.T) { test(t, singlePort) })
	}
}

func localhost(port int) *net.UDPAddr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port} }

// errorPacket parses an ERROR packet into its code and message.
func errorPacket(t *testing.T, p []byte) (uint16, string) {
	t.Helper()
	require.GreaterOrEqual(t, len(p), 5, "%q", p)
	require.Equal(t, uint16(opERROR), binary.BigEndian.Uint16(p), "ERROR, got %q", p)
	require.Equal(t, byte(0), p[len(p)-1], "NUL-terminated message")
	return binary.BigEndian.Uint16(p[2:]), string(p[4 : len(p)-1])
}

func counter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// waitFor waits until the loop has counted want on c.
func waitFor(t *testing.T, c prometheus.Collector, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return testutil.ToFloat64(c) == want }, 10*time.Second, 10*time.Millisecond, "count %v", want)
}

// Many concurrent pin/tftp clients, an independent implementation, get
// every file intact in both modes, with and without options.
func TestConcurrentClients(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		s, port := serve(t, config(dir, singlePort))
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := []string{"ipxe.efi", "undionly.kpxe"}[i%2]
				c, err := tftp.NewClient(localhost(port).String())
				if err != nil {
					errs <- err
					return
				}
				c.SetTimeout(5 * time.Second)
				if i%3 != 0 {
					c.SetBlockSize([]int{1468, 8192, 600}[i%3])
					c.RequestTSize(true)
				}
				wt, err := c.Receive(name, "octet")
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				var got bytes.Buffer
				if _, err := wt.WriteTo(&got); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				if !bytes.Equal(got.Bytes(), want[name]) {
					errs <- fmt.Errorf("client %d: %s differs (%d bytes)", i, name, got.Len())
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		waitFor(t, s.m.transfers.WithLabelValues(resultOK), 32)
		require.Zero(t, counter(t, s.m.active))
		// Bytes sent count resends, which a loaded machine causes.
		if counter(t, s.m.resent) == 0 {
			require.Equal(t, float64(16*(100_000+74213)), counter(t, s.m.bytes))
		} else {
			require.Greater(t, counter(t, s.m.bytes), float64(16*(100_000+74213)))
		}
	})
}

// netascii mode converts line ends, and tsize is the converted size.
func TestNetascii(t *testing.T) {
	dir, _ := files(t)
	_, port := serve(t, config(dir, false))
	c := newRawClient(t)
	c.send(localhost(port), rrqMode("text.cfg", "netascii", "tsize", "0"))
	p, from := c.recv()
	require.Equal(t, map[string]string{"tsize": "9"}, oack(t, p))
	c.send(from, ack(0))
	p, _ = c.recv()
	require.Equal(t, "\x00\x03\x00\x01a\r\nb\r\x00c\r\n", string(p))
	c.send(from, ack(1))
}

// rrqMode is a read request with another transfer mode.
func rrqMode(file, mode string, opts ...string) []byte {
	p := rrq(file, opts...)
	return bytes.Replace(p, []byte("\x00octet\x00"), []byte("\x00"+mode+"\x00"), 1)
}

func TestRefusals(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, _ := files(t)
		s, port := serve(t, config(dir, singlePort))
		for name, tc := range map[string]struct {
			packet []byte
			code   uint16
			msg    string
			result string
		}{
			"write request":          {packet: append([]byte{0, 2}, rrq("ipxe.efi")[2:]...), code: errAccess, msg: "read-only server", result: resultRefused},
			"name not allowed":       {packet: rrq("secret.txt"), code: errNotFound, msg: "file not found", result: resultNotFound},
			"path traversal":         {packet: rrq("../ipxe.efi"), code: errNotFound, msg: "file not found", result: resultNotFound},
			"a directory":            {packet: rrq("/"), code: errNotFound, msg: "file not found", result: resultNotFound},
			"mail mode":              {packet: rrqMode("ipxe.efi", "mail"), code: errIllegalOp, msg: "transfer mode mail not supported: use octet", result: resultRefused},
			"control bytes in mode":  {packet: rrqMode("ipxe.efi", "oc\x1btet"), code: errIllegalOp, msg: "transfer mode oc?tet not supported: use octet", result: resultRefused},
			"allowed name, any case": {packet: rrq("IPXE.EFI"), code: errNotFound, msg: "file not found", result: resultNotFound},
		} {
			t.Run(name, func(t *testing.T) {
				before := counter(t, s.m.transfers.WithLabelValues(tc.result))
				c := newRawClient(t)
				c.send(localhost(port), tc.packet)
				p, from := c.recv()
				require.Equal(t, port, from.Port, "refusals come from the listening port")
				code, msg := errorPacket(t, p)
				require.Equal(t, tc.code, code)
				require.Equal(t, tc.msg, msg)
				require.Equal(t, before+1, counter(t, s.m.transfers.WithLabelValues(tc.result)))
			})
		}
		require.Zero(t, counter(t, s.m.active), "no transfer started")
	})
}

// Packets that are no request are dropped unanswered and counted; the
// server goes on serving.
func TestMalformedPacketsAreDropped(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		s, port := serve(t, config(dir, singlePort))
		c := newRawClient(t)
		for _, p := range [][]byte{{}, {0}, {0, 1}, []byte("\x00\x01ipxe.efi"), []byte("\x00\x09x\x00octet\x00"), []byte("GET / HTTP/1.0\r\n\r\n"), make([]byte, 3000)} {
			c.send(localhost(port), p)
		}
		c.send(localhost(port), ack(7)) // no transfer to acknowledge
		require.Eventually(t, func() bool {
			return counter(t, s.m.dropped.WithLabelValues("malformed")) == 7 && counter(t, s.m.dropped.WithLabelValues("no-transfer")) == 1
		}, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		_, _, err := c.conn.ReadFromUDP(c.buf)
		require.Error(t, err, "no answer to a malformed packet")

		got := fetch(t, c, localhost(port), "undionly.kpxe", 1468)
		require.Equal(t, want["undionly.kpxe"], got)
	})
}

// fetch runs a lock-step transfer with c and returns the content.
func fetch(t *testing.T, c *rawClient, server *net.UDPAddr, file string, blksize int) []byte {
	t.Helper()
	c.send(server, rrq(file, "blksize", strconv.Itoa(blksize)))
	p, from := c.recv()
	require.Equal(t, strconv.Itoa(blksize), oack(t, p)["blksize"])
	c.send(from, ack(0))
	var got []byte
	for block := uint16(1); ; block++ {
		p, _ := c.recv()
		require.Equal(t, block, binary.BigEndian.Uint16(p[2:]))
		got = append(got, p[4:]...)
		c.send(from, ack(block))
		if len(p)-4 < blksize {
			return got
		}
	}
}

// An unacknowledged block is sent again after the timeout, Retries times;
// then the transfer ends with an error packet.
func TestResendThenTimeout(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		s, port := serve(t, config(dir, singlePort))
		c := newRawClient(t)
		c.send(localhost(port), rrq("undionly.kpxe"))
		first, from := c.recv()
		require.Equal(t, append([]byte{0, 3, 0, 1}, want["undionly.kpxe"][:512]...), first)
		start := time.Now()
		for try := 1; try <= 3; try++ {
			p, again := c.recv()
			require.Equal(t, first, p, "block 1 again, try %d", try)
			require.Equal(t, from.String(), again.String())
		}
		p, _ := c.recv()
		code, msg := errorPacket(t, p)
		require.Equal(t, uint16(errUndefined), code)
		require.Equal(t, "timeout", msg)
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "three timeouts of 100 ms")
		waitFor(t, s.m.transfers.WithLabelValues(resultTimeout), 1)
		require.Equal(t, float64(3), counter(t, s.m.resent))
		require.Zero(t, counter(t, s.m.active))
	})
}

// A request sent again before the first answer arrived does not start a
// second transfer.
func TestRepeatedRequestIsOneTransfer(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, _ := files(t)
		s, port := serve(t, config(dir, singlePort))
		c := newRawClient(t)
		c.send(localhost(port), rrq("ipxe.efi", "tsize", "0"))
		c.send(localhost(port), rrq("ipxe.efi", "tsize", "0"))
		p, from := c.recv()
		require.Equal(t, "100000", oack(t, p)["tsize"])
		waitFor(t, s.m.dropped.WithLabelValues("duplicate-request"), 1)
		require.Equal(t, float64(1), counter(t, s.m.active))
		// The only other packet is the OACK sent again after the timeout.
		p, again := c.recv()
		require.Equal(t, "100000", oack(t, p)["tsize"])
		require.Equal(t, from.String(), again.String())
	})
}

// An error packet from the client ends the transfer at once.
// A request sent again before the first answer arrived may be read after
// the acknowledgement of that answer (they come on different sockets): it
// is still the same transfer, which goes on.
func TestLateRepeatedRequestIsOneTransfer(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		cfg := config(dir, singlePort)
		cfg.Timeout = time.Hour
		s, port := serve(t, cfg)
		c := newRawClient(t)
		c.send(localhost(port), rrq("ipxe.efi", "blksize", "1468"))
		_, from := c.recv()
		c.send(from, ack(0))
		p, _ := c.recv()
		require.Equal(t, want["ipxe.efi"][:1468], p[4:])
		c.send(localhost(port), rrq("ipxe.efi", "blksize", "1468"))
		waitFor(t, s.m.dropped.WithLabelValues("duplicate-request"), 1)
		c.send(from, ack(1))
		p, again := c.recv()
		require.Equal(t, from.String(), again.String())
		require.Equal(t, []byte{0, 3, 0, 2}, p[:4], "block 2 of the running transfer")
		require.Equal(t, want["ipxe.efi"][1468:2*1468], p[4:])
		require.Zero(t, counter(t, s.m.transfers.WithLabelValues(resultAborted)))
	})
}

// A client's timeout option applies once it acknowledged something: a
// request from a forged source asking for 255 s holds its transfer only
// for the server's own retries.
func TestClientTimeoutOnlyOnceAnswered(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, _ := files(t)
		s, port := serve(t, config(dir, singlePort)) // 100 ms, 3 retries
		c := newRawClient(t)
		c.send(localhost(port), rrq("ipxe.efi", "timeout", "255"))
		p, _ := c.recv()
		require.Equal(t, "255", oack(t, p)["timeout"])
		waitFor(t, s.m.transfers.WithLabelValues(resultTimeout), 1)
		require.Equal(t, float64(3), counter(t, s.m.resent), "the OACK, every 100 ms")
	})
}

func TestClientErrorEndsTransfer(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, _ := files(t)
		s, port := serve(t, config(dir, singlePort))
		c := newRawClient(t)
		c.send(localhost(port), rrq("ipxe.efi", "blksize", "1468"))
		_, from := c.recv()
		c.send(from, appendError(nil, errOptions, "blksize refused"))
		waitFor(t, s.m.transfers.WithLabelValues(resultAborted), 1)
		require.Zero(t, counter(t, s.m.active))
		require.Zero(t, counter(t, s.m.resent), "nothing sent again")
	})
}

// A client that closed its socket is noticed from the ICMP error of the
// next packet sent to it: the transfer is aborted, not left to time out.
func TestClientGoneEndsTransfer(t *testing.T) {
	dir, _ := files(t)
	s, port := serve(t, config(dir, false))
	c := newRawClient(t)
	c.send(localhost(port), rrq("ipxe.efi"))
	c.recv()
	require.NoError(t, c.conn.Close())
	waitFor(t, s.m.transfers.WithLabelValues(resultAborted), 1)
	require.Zero(t, counter(t, s.m.transfers.WithLabelValues(resultTimeout)))
	require.Zero(t, counter(t, s.m.active))
}

// windowsize (RFC 7440): the server sends a window of blocks per
// acknowledgement and starts the next window after the last block the
// client acknowledges.
func TestWindowsize(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		_, port := serve(t, config(dir, singlePort))
		c := newRawClient(t)
		c.send(localhost(port), rrq("ipxe.efi", "blksize", "1000", "windowsize", "8"))
		p, from := c.recv()
		require.Equal(t, map[string]string{"blksize": "1000", "windowsize": "8"}, oack(t, p))
		c.send(from, ack(0))
		blocks := map[uint16][]byte{}
		for k := uint16(1); k <= 8; k++ {
			p, _ := c.recv()
			require.Equal(t, k, binary.BigEndian.Uint16(p[2:]))
			blocks[k] = bytes.Clone(p[4:])
		}
		// Pretend block 6 was lost: acknowledge 5, get 6 to 13.
		c.send(from, ack(5))
		for k := uint16(6); k <= 13; k++ {
			p, _ := c.recv()
			require.Equal(t, k, binary.BigEndian.Uint16(p[2:]), "the window after the last good block")
			blocks[k] = bytes.Clone(p[4:])
		}
		next := uint16(14)
		for {
			c.send(from, ack(next-1))
			last := false
			for k := next; k < next+8; k++ {
				p, _ := c.recv()
				require.Equal(t, k, binary.BigEndian.Uint16(p[2:]))
				blocks[k] = bytes.Clone(p[4:])
				if len(p)-4 < 1000 {
					last = true
					c.send(from, ack(k))
					break
				}
			}
			if last {
				break
			}
			next += 8
		}
		var got []byte
		for k := uint16(1); int(k) <= len(blocks); k++ {
			got = append(got, blocks[k]...)
		}
		require.Equal(t, want["ipxe.efi"], got)
	})
}

// Requests beyond the limits are dropped, so the client asks again later.
func TestTransferLimits(t *testing.T) {
	dir, _ := files(t)
	cfg := config(dir, false)
	cfg.Timeout, cfg.MaxTransfersPerClient, cfg.MaxTransfers = time.Hour, 2, 3
	s, port := serve(t, cfg)
	clients := make([]*rawClient, 4)
	for i := range clients {
		clients[i] = newRawClient(t)
	}
	for _, c := range clients[:3] {
		c.send(localhost(port), rrq("ipxe.efi"))
	}
	clients[0].recv()
	clients[1].recv()
	waitFor(t, s.m.dropped.WithLabelValues("client-busy"), 1)

	// Another address on the same host is another client, up to the total.
	other, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3)})
	require.NoError(t, err)
	defer other.Close()
	third := &rawClient{t: t, conn: other, buf: make([]byte, 70000)}
	third.send(localhost(port), rrq("ipxe.efi"))
	third.recv()
	clients[3].send(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}, rrq("undionly.kpxe"))
	waitFor(t, s.m.dropped.WithLabelValues("busy"), 1)
	require.Equal(t, float64(3), counter(t, s.m.active))
}

// Shutdown ends transfers with an error packet and returns once Serve has.
func TestShutdownEndsTransfers(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, _ := files(t)
		cfg := config(dir, singlePort)
		cfg.Timeout = time.Hour
		cfg.Log = testr.New(t)
		s, err := New(cfg)
		require.NoError(t, err)
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer conn.Close()
		done := make(chan error, 1)
		go func() { done <- s.Serve(conn) }()
		c := newRawClient(t)
		c.send(conn.LocalAddr().(*net.UDPAddr), rrq("ipxe.efi"))
		_, from := c.recv()
		s.Shutdown()
		// Shutdown returns once Serve has finished; the goroutine that
		// called it may still be on its way to the channel (under -race
		// on a loaded machine it was, once), so a moment is allowed.
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after Shutdown")
		}
		p, again := c.recv()
		require.Equal(t, from.String(), again.String())
		code, msg := errorPacket(t, p)
		require.Equal(t, uint16(errUndefined), code)
		require.Equal(t, "server shutting down", msg)
		s.Shutdown() // again: a no-op
		require.NoError(t, s.Serve(conn), "Serve after Shutdown returns at once")
	})
}

func TestServeNeedsIPv4UDP(t *testing.T) {
	s, err := New(Config{})
	require.NoError(t, err)
	c6, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	require.NoError(t, err)
	defer c6.Close()
	require.ErrorContains(t, s.Serve(c6), "must be IPv4")
	require.ErrorContains(t, s.Serve(fakePacketConn{}), "serve on a UDP socket")
}

type fakePacketConn struct{ net.PacketConn }

// A file replaced on disk is served anew within a second.
func TestUpdatedFileIsServed(t *testing.T) {
	dir, want := files(t)
	_, port := serve(t, config(dir, false))
	c := newRawClient(t)
	require.Equal(t, want["undionly.kpxe"], fetch(t, c, localhost(port), "undionly.kpxe", 1468))
	updated := content(5000)
	path := filepath.Join(dir, "undionly.kpxe")
	require.NoError(t, os.WriteFile(path, updated, 0o644))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Minute)))
	require.Eventually(t, func() bool {
		return bytes.Equal(updated, fetch(t, newRawClient(t), localhost(port), "undionly.kpxe", 1468))
	}, 5*time.Second, 200*time.Millisecond)
}

// A client that starts over from the same port, having acknowledged part
// of a transfer or asking for another file, gets a new transfer.
func TestRequestFromSamePortStartsOver(t *testing.T) {
	forBothModes(t, func(t *testing.T, singlePort bool) {
		dir, want := files(t)
		cfg := config(dir, singlePort)
		cfg.Timeout = time.Hour
		s, port := serve(t, cfg)
		c := newRawClient(t)
		// Two blocks of ipxe.efi acknowledged, then the same request again.
		c.send(localhost(port), rrq("ipxe.efi", "blksize", "1468"))
		_, from := c.recv()
		for block := uint16(0); block <= 2; block++ {
			c.send(from, ack(block))
			c.recv() // block+1
		}
		require.Equal(t, want["ipxe.efi"], fetch(t, c, localhost(port), "ipxe.efi", 1468))
		// Nothing of undionly.kpxe acknowledged, then another file.
		c.send(localhost(port), rrq("undionly.kpxe", "blksize", "1468"))
		c.recv() // its OACK
		require.Equal(t, want["text.cfg"], fetch(t, c, localhost(port), "text.cfg", 1468))
		waitFor(t, s.m.transfers.WithLabelValues(resultOK), 2)
		require.Equal(t, float64(2), counter(t, s.m.transfers.WithLabelValues(resultAborted)), "the abandoned transfers")
		require.Zero(t, counter(t, s.m.active))
	})
}
