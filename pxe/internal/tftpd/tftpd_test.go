package tftpd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"
)

// serve runs a server on a socket listening on every address and
// returns its port.
func serve(t *testing.T, cfg Config) int {
	t.Helper()
	cfg.Log = testr.New(t)
	s, err := New(cfg)
	require.NoError(t, err)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{})
	require.NoError(t, err)
	// Serve asks for each datagram's destination and interface; a request
	// queued before it does would arrive without them.
	require.NoError(t, ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true))
	done := make(chan error, 1)
	go func() { done <- s.Serve(conn) }()
	t.Cleanup(func() {
		s.Shutdown() // closes conn once the transfers ended
		<-done
		_ = conn.Close()
	})
	return conn.LocalAddr().(*net.UDPAddr).Port
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
			port := serve(t, Config{Dir: dir, Files: []string{"ipxe.efi"}, SinglePort: singlePort, MaxBlockSize: 1468, Timeout: time.Second})
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
