package pxe

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// A listening socket gets room for a storm's requests: all of it as root
// (beyond net.core.rmem_max), and at least the kernel's default otherwise.
func TestReceiveBufferGrown(t *testing.T) {
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer conn.Close()
	got, err := growReceiveBuffer(conn)
	require.NoError(t, err)
	if os.Geteuid() == 0 {
		require.GreaterOrEqual(t, got, 2*receiveBuffer, "the kernel reports twice what it grants")
	} else {
		require.Positive(t, got)
	}

	_, err = growReceiveBuffer(notASocket{conn})
	require.ErrorContains(t, err, "not a socket")
}

type notASocket struct{ net.PacketConn }
