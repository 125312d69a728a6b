package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// DHCPv6 is not answered: a network-boot client is logged once (per MAC
// an hour) with the reason, counted and observed for its boot trace, as
// OVMF's PXE over IPv6 and iPXE send it; anything else on DHCPv6 is left
// alone.
func TestUnserved6(t *testing.T) {
	var (
		mu    sync.Mutex
		lines []string
		obs   []Observation
	)
	h := newHandler(t, Proxy, func(c *Config) {
		c.Log = funcr.New(func(prefix, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
		c.Observe = func(o Observation) { mu.Lock(); obs = append(obs, o); mu.Unlock() }
	})
	ovmfMAC, _ := net.ParseMAC("52:54:00:26:18:01")
	ovmf := func(t *testing.T) *dhcpv6.Message { // as OVMF sends it (DUID-LLT, arch, vendor class)
		t.Helper()
		m, err := dhcpv6.NewMessage(dhcpv6.WithClientID(&dhcpv6.DUIDLLT{HWType: iana.HWTypeEthernet, Time: 1, LinkLayerAddr: ovmfMAC}),
			dhcpv6.WithArchType(iana.EFI_X86_64), dhcpv6.WithRequestedOptions(dhcpv6.OptionBootfileURL),
			dhcpv6.WithOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: [][]byte{[]byte("PXEClient:Arch:00007:UNDI:003016")}}))
		require.NoError(t, err)
		return m
	}
	ipxe := func(t *testing.T) *dhcpv6.Message { // as iPXE sends it (DUID-UUID of zeros, user class)
		t.Helper()
		m, err := dhcpv6.NewMessage(dhcpv6.WithClientID(&dhcpv6.DUIDUUID{}), dhcpv6.WithUserClass([]byte("iPXE")),
			dhcpv6.WithRequestedOptions(dhcpv6.OptionBootfileURL))
		require.NoError(t, err)
		return m
	}
	linkLocal := netip.MustParseAddr("fe80::5054:ff:fe26:1802")
	reset := func() { mu.Lock(); lines, obs = nil, nil; mu.Unlock() }

	t.Run("firmware", func(t *testing.T) {
		reset()
		h.Unserved6(ovmf(t).ToBytes(), netip.MustParseAddr("fe80::1"))
		h.Unserved6(ovmf(t).ToBytes(), netip.MustParseAddr("fe80::1"))
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, lines, 1, "logged once: %v", lines)
		require.Contains(t, lines[0], "answers DHCP over IPv4 only")
		require.Contains(t, lines[0], `"mac"="52:54:00:26:18:01"`)
		require.Len(t, obs, 2, "every request is a hop of its boot trace")
		require.Equal(t, "52:54:00:26:18:01", obs[0].MAC)
		require.False(t, obs[0].Answered)
		require.Equal(t, "not answered: "+NotServedIPv6, obs[0].Outcome)
		require.Equal(t, "DHCPv6 SOLICIT, EFI x86-64, PXEClient:Arch:00007:UNDI:003016", obs[0].Detail)
	})
	t.Run("ipxe-mac-from-link-local", func(t *testing.T) {
		reset()
		h.Unserved6(ipxe(t).ToBytes(), linkLocal)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, obs, 1)
		require.Equal(t, "52:54:00:26:18:02", obs[0].MAC, "EUI-64 link-local source")
		require.Equal(t, "DHCPv6 SOLICIT, iPXE", obs[0].Detail)
		require.Len(t, lines, 1)
	})
	t.Run("relayed", func(t *testing.T) {
		reset()
		relay, err := dhcpv6.EncapsulateRelay(ipxe(t), dhcpv6.MessageTypeRelayForward, net.ParseIP("2001:2:0:19::1"), net.IP(linkLocal.AsSlice()))
		require.NoError(t, err)
		h.Unserved6(relay.ToBytes(), netip.MustParseAddr("fe80::5054:ff:fe00:0001")) // the relay's own link-local address
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, obs, "the sender is the relay: its address names no client, and no trace is kept for none")
		require.Len(t, lines, 1)
		require.Contains(t, lines[0], `"mac"="unknown"`)
	})
	t.Run("not-booting", func(t *testing.T) {
		reset()
		before := testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("ipv6-not-served"))
		plain, err := dhcpv6.NewSolicit(ovmfMAC) // an OS's own DHCPv6 client
		require.NoError(t, err)
		h.Unserved6(plain.ToBytes(), linkLocal)
		adv, err := dhcpv6.NewAdvertiseFromSolicit(ovmf(t), dhcpv6.WithServerID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: ovmfMAC}))
		require.NoError(t, err)
		h.Unserved6(adv.ToBytes(), linkLocal) // another server's answer
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, obs)
		require.Empty(t, lines)
		require.Equal(t, before, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("ipv6-not-served")))
	})
	t.Run("malformed", func(t *testing.T) {
		before := testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("malformed-dhcpv6"))
		h.Unserved6([]byte{1, 2}, linkLocal)
		require.Equal(t, before+1, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("malformed-dhcpv6")))
		require.False(t, strings.Contains(strings.Join(lines, "\n"), "not answered"))
	})
	t.Run("long-classes", func(t *testing.T) {
		reset()
		var classes [][]byte
		for range 500 {
			classes = append(classes, []byte("PXEClient:"+strings.Repeat("x", 100)))
		}
		m, err := dhcpv6.NewMessage(dhcpv6.WithClientID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: net.HardwareAddr{0x52, 0x54, 0, 0x26, 0x18, 0x03}}),
			dhcpv6.WithOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: classes}))
		require.NoError(t, err)
		h.Unserved6(m.ToBytes(), linkLocal)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, obs, 1)
		require.LessOrEqual(t, len(obs[0].Detail), 130, "a packet's size is not the detail's")
		require.Less(t, len(lines[0]), 1000)
	})
	// A dual-stack iPXE booting over IPv4 also solicits over DHCPv6: not
	// stuck, so neither logged nor observed.
	t.Run("booting-over-ipv4", func(t *testing.T) {
		reset()
		ipv4, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithHwAddr(net.HardwareAddr{0x52, 0x54, 0, 0x26, 0x18, 0x04}),
			dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE")))
		require.NoError(t, err)
		require.NotNil(t, h.Respond(ipv4, 67), "iPXE gets its script over IPv4")
		h.Unserved6(ipxe(t).ToBytes(), netip.MustParseAddr("fe80::5054:ff:fe26:1804"))
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, lines)
		for _, o := range obs {
			require.NotEqual(t, "not answered: "+NotServedIPv6, o.Outcome, "%+v", o)
		}
	})
}

// The record of clients logged as not answered is bounded: full of this
// hour's, a new one is counted, not logged; an hour later there is room.
func TestUnservedBounded(t *testing.T) {
	now := time.Now()
	h := newHandler(t, Proxy, func(c *Config) { c.Now = func() time.Time { return now } })
	for i := range maxTrackedMACs {
		require.True(t, h.firstUnserved(fmt.Sprint(i), "ipv6"))
	}
	require.False(t, h.firstUnserved("0", "ipv6"), "logged this hour")
	require.False(t, h.firstUnserved("new", "ipv6"), "full")
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("unserved-log-suppressed")))
	now = now.Add(time.Hour)
	require.True(t, h.firstUnserved("new", "ipv6"), "the hour is over: room again")
	require.True(t, h.firstUnserved("0", "ipv6"), "logged again an hour later")
}

// FuzzUnserved6 feeds arbitrary packets from the boot network to the
// DHCPv6 watch: nothing panics, and what it keeps stays bounded.
func FuzzUnserved6(f *testing.F) {
	hw, _ := net.ParseMAC("52:54:00:26:18:01")
	sol, err := dhcpv6.NewSolicit(hw, dhcpv6.WithArchType(iana.EFI_X86_64), dhcpv6.WithNetboot,
		dhcpv6.WithOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: [][]byte{[]byte("PXEClient:Arch:00007:UNDI:003016")}}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sol.ToBytes())
	relay, err := dhcpv6.EncapsulateRelay(sol, dhcpv6.MessageTypeRelayForward, net.ParseIP("2001:2::1"), net.ParseIP("fe80::1"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(relay.ToBytes())
	twice, err := dhcpv6.EncapsulateRelay(relay, dhcpv6.MessageTypeRelayForward, net.ParseIP("2001:2::2"), net.ParseIP("fe80::2"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(twice.ToBytes())
	h := newHandler(f, Proxy, func(c *Config) { c.Observe, c.Log = func(Observation) {}, logr.Discard() })
	peers := []netip.Addr{netip.MustParseAddr("fe80::5054:ff:fe26:1801"), netip.MustParseAddr("2001:2::9"), {}}
	f.Fuzz(func(t *testing.T, packet []byte) {
		for _, p := range peers {
			h.Unserved6(packet, p)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		require.LessOrEqual(t, len(h.unserved), maxTrackedMACs)
	})
}
