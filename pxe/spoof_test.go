package pxe

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv6"

	"github.com/agentboot/agentboot/test/netns"
)

// serverAndClient creates two network namespaces, <prefix><pid>-s and -c,
// gone when the test ends (and those of earlier runs whose process is gone
// before); the test is skipped without root.
func serverAndClient(t *testing.T, prefix string) (srv, cli *netns.NS) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	netns.RemoveStale(prefix)
	id := fmt.Sprintf("%s%d", prefix, os.Getpid())
	srv, err := netns.New(id + "-s")
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	cli, err = netns.New(id + "-c")
	require.NoError(t, err)
	t.Cleanup(cli.Close)
	return srv, cli
}

// listenDHCPIn opens the DHCP sockets in namespace ns.
func listenDHCPIn(ns *netns.NS) func(string, int) (net.PacketConn, error) {
	return func(iface string, p int) (c net.PacketConn, err error) {
		err = ns.Do(func() (err error) {
			c, err = server4.NewIPv4UDPConn(iface, &net.UDPAddr{Port: p})
			return err
		})
		return c, err
	}
}

// A host on the boot network sends made-up DHCP packets, through real
// sockets on a veth pair, to agentboot in authoritative mode: a DECLINE of
// another client's address, a request through a relay that does not
// exist, an INIT-REBOOT for an address nobody offered it. The victim keeps
// its lease, nothing is written to disk, and nothing is sent for the
// relay. Root only (network namespaces); CI runs it as root.
func TestSpoofedDHCPOnVeth(t *testing.T) {
	srv, cli := serverAndClient(t, "abspoof")
	require.NoError(t, srv.IP("link", "add", "s0", "type", "veth", "peer", "name", "c0", "netns", cli.Name))
	require.NoError(t, srv.IP("addr", "add", "198.18.7.1/24", "dev", "s0"))
	require.NoError(t, srv.IP("link", "set", "s0", "up"))
	require.NoError(t, cli.IP("addr", "add", "198.18.7.2/24", "dev", "c0"))
	require.NoError(t, cli.IP("link", "set", "c0", "up"))

	dir, _ := binaries(t)
	leaseFile := filepath.Join(t.TempDir(), "leases.json")
	cfg := Config{
		Interface: "s0", ServerIP: netip.MustParseAddr("198.18.7.1"), PrefixLen: 24, Mode: Authoritative,
		PoolStart: netip.MustParseAddr("198.18.7.100"), PoolEnd: netip.MustParseAddr("198.18.7.110"), LeaseFile: leaseFile,
		BootScriptURL: "http://198.18.7.1:8080/boot.ipxe", TFTPDir: dir, TFTPAddr: "198.18.7.1:69", HTTPAddr: "198.18.7.1:8070",
		ListenDHCP:   listenDHCPIn(srv),
		ListenPacket: srv.ListenPacket, Listen: srv.Listen,
		Log: testr.New(t),
	}
	var s *Server
	require.NoError(t, srv.Do(func() (err error) {
		s, err = New(cfg) // reads the interface, which is in the namespace
		return err
	}))
	runUntilCleanup(t, s)

	// The client side: port 68, replies broadcast to it.
	conn, err := cli.ListenPacket("udp4", "0.0.0.0:68")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	server := &net.UDPAddr{IP: net.ParseIP("198.18.7.1"), Port: 67}
	// exchange sends p and returns the server's answer to it, or nil.
	exchange := func(p *dhcpv4.DHCPv4, wait time.Duration) *dhcpv4.DHCPv4 {
		t.Helper()
		_, err := conn.WriteTo(p.ToBytes(), server)
		require.NoError(t, err)
		buf := make([]byte, 1500)
		deadline := time.Now().Add(wait)
		for {
			require.NoError(t, conn.SetReadDeadline(deadline))
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return nil // nothing came
			}
			if r, err := dhcpv4.FromBytes(buf[:n]); err == nil && r.TransactionID == p.TransactionID {
				return r
			}
		}
	}
	packet := func(mac string, t2 dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
		t.Helper()
		hw, err := net.ParseMAC(mac)
		require.NoError(t, err)
		p, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(t2), dhcpv4.WithBroadcast(true)}, mods...)...)
		require.NoError(t, err)
		return p
	}
	serverID := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("198.18.7.1")))
	const victim, attacker = "52:54:00:07:00:01", "52:54:00:07:00:66"

	// The victim's exchange, over the wire; the server is up when it answers.
	var offer *dhcpv4.DHCPv4
	require.Eventually(t, func() bool {
		offer = exchange(packet(victim, dhcpv4.MessageTypeDiscover), 500*time.Millisecond)
		return offer != nil
	}, 20*time.Second, 100*time.Millisecond, "no OFFER")
	ip := offer.YourIPAddr
	ack := exchange(packet(victim, dhcpv4.MessageTypeRequest, serverID, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip))), 2*time.Second)
	require.NotNil(t, ack)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	journal := func() []byte {
		raw, err := os.ReadFile(leaseFile + ".journal")
		require.NoError(t, err)
		return raw
	}
	before := journal()
	require.Equal(t, 1, bytes.Count(before, []byte("\n")), "the victim's lease")
	dropped := func(reason string) float64 {
		return testutil.ToFloat64(s.handler.Metrics().Dropped.WithLabelValues(reason))
	}

	// A DECLINE of the victim's address from another MAC.
	require.Nil(t, exchange(packet(attacker, dhcpv4.MessageTypeDecline, serverID, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip))), 500*time.Millisecond))
	require.Eventually(t, func() bool { return dropped("decline-refused") == 1 }, 5*time.Second, 50*time.Millisecond)

	// A DISCOVER naming a relay agent nobody configured: no reply, to it or
	// anyone.
	require.Nil(t, exchange(packet(attacker, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.ParseIP("10.0.0.53"))), time.Second))
	require.Equal(t, 1.0, dropped("unknown-relay"))

	// An INIT-REBOOT for a free address nobody offered this MAC: a NAK,
	// and nothing written.
	nak := exchange(packet(attacker, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("198.18.7.109")))), 2*time.Second)
	require.NotNil(t, nak)
	require.Equal(t, dhcpv4.MessageTypeNak, nak.MessageType())

	// The victim renews: still its address, and early renewals write
	// nothing.
	renew := exchange(packet(victim, dhcpv4.MessageTypeRequest, serverID, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip))), 2*time.Second)
	require.NotNil(t, renew)
	require.Equal(t, dhcpv4.MessageTypeAck, renew.MessageType())
	require.True(t, renew.YourIPAddr.Equal(ip))
	require.Equal(t, before, journal(), "nothing written for the attacker's packets or the early renewal")
}

// DHCPv6 is watched through a raw socket, never answered, and takes no
// port: a client on the boot network (another namespace, over a veth)
// soliciting a boot file is logged once with the reason; a packet to the
// server's own address, and one on another interface, are not the boot
// network's clients'; and a DHCPv6 server starting afterwards binds port
// 547 on every address without address reuse, as dnsmasq does by default.
// Root only (network namespaces, raw sockets); CI runs it as root.
func TestDHCPv6WatchOnVeth(t *testing.T) {
	srv, cli := serverAndClient(t, "abwatch6")
	const clientMAC = "52:54:00:26:1a:01"
	for _, c := range []struct {
		ns  *netns.NS
		cmd []string
	}{
		{srv, []string{"link", "add", "s0", "type", "veth", "peer", "name", "c0", "netns", cli.Name}},
		{srv, []string{"link", "add", "other", "type", "veth", "peer", "name", "c1", "netns", cli.Name}},
		{srv, []string{"addr", "add", "198.18.7.1/24", "dev", "s0"}},
		{srv, []string{"addr", "add", "fe80::1/64", "dev", "s0", "nodad"}},
		{srv, []string{"link", "set", "s0", "up"}},
		{srv, []string{"link", "set", "other", "up"}},
		{cli, []string{"link", "set", "c0", "address", clientMAC}},
		{cli, []string{"addr", "add", "fe80::5054:ff:fe26:1a01/64", "dev", "c0", "nodad"}},
		{cli, []string{"addr", "add", "fe80::5054:ff:fe26:1a02/64", "dev", "c1", "nodad"}},
		{cli, []string{"link", "set", "c0", "up"}},
		{cli, []string{"link", "set", "c1", "up"}},
	} {
		require.NoError(t, c.ns.IP(c.cmd...))
	}
	var (
		mu    sync.Mutex
		lines []string
	)
	dir, _ := binaries(t)
	cfg := Config{
		Interface: "s0", ServerIP: netip.MustParseAddr("198.18.7.1"), Mode: ProxyDHCP,
		BootScriptURL: "http://198.18.7.1:8080/boot.ipxe", TFTPDir: dir, TFTPAddr: "198.18.7.1:69", HTTPAddr: "198.18.7.1:8070",
		ListenDHCP: listenDHCPIn(srv),
		ListenDHCP6: func(iface string) (c *ipv6.PacketConn, err error) {
			err = srv.Do(func() (err error) { c, err = listenDHCP6(iface); return err })
			return c, err
		},
		ListenPacket: srv.ListenPacket, Listen: srv.Listen,
		Log: funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{}),
	}
	var s *Server
	require.NoError(t, srv.Do(func() (err error) { s, err = New(cfg); return err }))
	runUntilCleanup(t, s)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(lines, "\n"), "PXE service running")
	}, 10*time.Second, 20*time.Millisecond)

	// The site's DHCPv6 server, started afterwards: [::]:547, no reuse.
	site, err := srv.ListenPacket("udp6", "[::]:547")
	require.NoError(t, err, "the watch must not hold port 547")
	t.Cleanup(func() { site.Close() })

	hw, _ := net.ParseMAC(clientMAC)
	solicit, err := dhcpv6.NewSolicit(hw, dhcpv6.WithArchType(iana.EFI_X86_64), dhcpv6.WithNetboot,
		dhcpv6.WithClientID(&dhcpv6.DUIDUUID{})) // the MAC only from the link-local source, as from iPXE
	require.NoError(t, err)
	send := func(from, to string, solicit *dhcpv6.Message) {
		t.Helper()
		c, err := cli.ListenPacket("udp6", from)
		require.NoError(t, err)
		defer c.Close()
		dst, err := net.ResolveUDPAddr("udp6", to)
		require.NoError(t, err)
		// The kernel routes multicast on a link a moment after it is up.
		require.Eventually(t, func() bool { _, err = c.WriteTo(solicit.ToBytes(), dst); return err == nil }, 5*time.Second, 50*time.Millisecond,
			"send to %s: %v", to, err)
	}
	send("[fe80::5054:ff:fe26:1a02%c1]:546", "[ff02::1:2%c1]:547", solicit) // another interface of the server
	send("[fe80::5054:ff:fe26:1a01%c0]:546", "[fe80::1%c0]:547", solicit)   // the server's own address: not the group
	send("[fe80::5054:ff:fe26:1a01%c0]:546", "[ff02::1:2%c0]:547", solicit)
	send("[fe80::5054:ff:fe26:1a01%c0]:546", "[ff02::1:2%c0]:547", solicit) // a retransmission
	// Last, a client of another MAC (in its DUID): one reader takes the
	// packets in turn, so once its line is there every packet before it
	// has been looked at.
	const markerMAC = "52:54:00:26:1a:ff"
	mhw, _ := net.ParseMAC(markerMAC)
	marker, err := dhcpv6.NewSolicit(mhw, dhcpv6.WithArchType(iana.EFI_X86_64), dhcpv6.WithNetboot,
		dhcpv6.WithClientID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: mhw}))
	require.NoError(t, err)
	send("[fe80::5054:ff:fe26:1a01%c0]:546", "[ff02::1:2%c0]:547", marker)
	const want = `"msg"="DHCPv6 network boot client not answered: agentboot pxe answers DHCP over IPv4 only`
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(lines, "\n"), `"mac"="`+markerMAC+`"`)
	}, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, 3.0, testutil.ToFloat64(s.handler.Metrics().Dropped.WithLabelValues("ipv6-not-served")),
		"the two sent to the group on s0, and the marker")
	mu.Lock()
	defer mu.Unlock()
	logged := 0
	for _, l := range lines {
		if strings.Contains(l, want) && !strings.Contains(l, markerMAC) {
			logged++
			require.Contains(t, l, `"mac"="`+clientMAC+`" "from"="fe80::5054:ff:fe26:1a01"`)
		}
	}
	require.Equal(t, 1, logged)

	// An interface without IPv6 is said to be one.
	require.NoError(t, netns.Run("ip", "netns", "exec", srv.Name, "sysctl", "-q", "-w", "net.ipv6.conf.other.disable_ipv6=1"))
	err = srv.Do(func() error {
		c, err := listenDHCP6("other")
		if err == nil {
			c.Close()
		}
		return err
	})
	require.ErrorContains(t, err, "IPv6 is disabled on other (net.ipv6.conf.other.disable_ipv6=1)")
}
