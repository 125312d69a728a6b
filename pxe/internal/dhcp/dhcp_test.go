package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/pxe/internal/leases"
)

var server = netip.MustParseAddr("198.18.0.1")

func newHandler(t testing.TB, mode Mode, change ...func(*Config)) *Handler {
	t.Helper()
	cfg := Config{
		Mode: mode, ServerIP: server, BootScriptURL: "http://198.18.0.1:8080/boot.ipxe",
		HTTPBase: "http://198.18.0.1:8070", BIOSBinary: "undionly.kpxe", EFIBinary: "ipxe.efi",
		Subnet: netip.MustParsePrefix("198.18.0.0/24"), Relays: []netip.Addr{netip.MustParseAddr("198.18.1.1")},
		Log: testr.NewWithInterface(t, testr.Options{}),
	}
	if mode == Authoritative {
		db, err := leases.Open(leases.Config{Pool: leases.Pool{First: netip.MustParseAddr("198.18.0.100"), Last: netip.MustParseAddr("198.18.0.110")}, File: filepath.Join(t.TempDir(), "leases.json")})
		require.NoError(t, err)
		cfg.Leases, cfg.Netmask, cfg.Router = db, net.CIDRMask(24, 32), server
		cfg.DNS = []netip.Addr{server}
	}
	for _, c := range change {
		c(&cfg)
	}
	h, err := New(cfg, nil)
	require.NoError(t, err)
	return h
}

type client struct {
	mac   string
	class string
	arch  *iana.Arch
	ipxe  bool
}

func (c client) packet(t *testing.T, typ dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	hw, err := net.ParseMAC(c.mac)
	require.NoError(t, err)
	all := []dhcpv4.Modifier{dhcpv4.WithMessageType(typ), dhcpv4.WithHwAddr(hw)}
	if c.class != "" {
		all = append(all, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(c.class)))
	}
	if c.arch != nil {
		all = append(all, dhcpv4.WithOption(dhcpv4.OptClientArch(*c.arch)))
	}
	if c.ipxe {
		all = append(all, dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")), dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e}))
	}
	p, err := dhcpv4.New(append(all, mods...)...)
	require.NoError(t, err)
	// Round-trip through bytes, as the server receives it.
	p, err = dhcpv4.FromBytes(p.ToBytes())
	require.NoError(t, err)
	return p
}

func arch(a iana.Arch) *iana.Arch { return &a }

func TestProxyFirmwareDetection(t *testing.T) {
	cases := map[string]struct {
		c        client
		file     string
		class    string
		discCtrl bool
	}{
		"BIOS PXE":               {client{mac: "52:54:00:00:00:01", class: "PXEClient:Arch:00000:UNDI:002001", arch: arch(iana.INTEL_X86PC)}, "undionly.kpxe", "PXEClient", true},
		"BIOS PXE without 93":    {client{mac: "52:54:00:00:00:02", class: "PXEClient"}, "undionly.kpxe", "PXEClient", true},
		"UEFI x86-64":            {client{mac: "52:54:00:00:00:03", class: "PXEClient:Arch:00007:UNDI:003016", arch: arch(iana.EFI_X86_64)}, "ipxe.efi", "PXEClient", true},
		"UEFI x86-64 (EFI BC)":   {client{mac: "52:54:00:00:00:04", class: "PXEClient:Arch:00009:UNDI:003016", arch: arch(iana.EFI_BC)}, "ipxe.efi", "PXEClient", true},
		"UEFI HTTP boot":         {client{mac: "52:54:00:00:00:05", class: "HTTPClient:Arch:00016:UNDI:003001", arch: arch(iana.EFI_X86_64_HTTP)}, "http://198.18.0.1:8070/ipxe/ipxe.efi", "HTTPClient", false},
		"iPXE":                   {client{mac: "52:54:00:00:00:06", class: "PXEClient:Arch:00000:UNDI:002001", arch: arch(iana.INTEL_X86PC), ipxe: true}, "http://198.18.0.1:8080/boot.ipxe?mac=52:54:00:00:00:06", "PXEClient", false},
		"iPXE without option 60": {client{mac: "52:54:00:00:00:07", ipxe: true}, "http://198.18.0.1:8080/boot.ipxe?mac=52:54:00:00:00:07", "PXEClient", false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHandler(t, Proxy)
			reply := h.Respond(tc.c.packet(t, dhcpv4.MessageTypeDiscover), 67)
			require.NotNil(t, reply)
			require.Equal(t, dhcpv4.MessageTypeOffer, reply.MessageType())
			require.True(t, reply.YourIPAddr.IsUnspecified(), "ProxyDHCP never gives an address")
			require.Equal(t, tc.file, reply.BootFileNameOption())
			if len(tc.file) < 128 {
				require.Equal(t, tc.file, reply.BootFileName, "the BOOTP file field too, for older PXE ROMs")
			}
			require.Equal(t, tc.class, reply.ClassIdentifier())
			require.Equal(t, server.String(), reply.ServerIdentifier().String())
			// iPXE drops a ProxyDHCP answer without next-server.
			require.Equal(t, server.String(), reply.ServerIPAddr.String())
			if tc.discCtrl {
				require.Equal(t, []byte{6, 1, 8, 255}, reply.GetOneOption(dhcpv4.OptionVendorSpecificInformation))
			}
			// The ProxyDHCP request on 4011 gets the same boot information.
			ack := h.Respond(tc.c.packet(t, dhcpv4.MessageTypeRequest), 4011)
			require.NotNil(t, ack)
			require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
			require.Equal(t, tc.file, ack.BootFileNameOption())
			require.Equal(t, server.String(), ack.ServerIPAddr.String())
			// A REQUEST on 67 is for the site's server.
			require.Nil(t, h.Respond(tc.c.packet(t, dhcpv4.MessageTypeRequest), 67))
		})
	}
}

func TestProxyIgnoresOthers(t *testing.T) {
	var (
		mu    sync.Mutex
		lines []string
	)
	h := newHandler(t, Proxy, func(c *Config) {
		c.Log = funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
	})
	require.Nil(t, h.Respond(client{mac: "52:54:00:00:01:01"}.packet(t, dhcpv4.MessageTypeDiscover), 67), "a plain DHCP client")
	require.Nil(t, h.Respond(client{mac: "52:54:00:00:01:02", class: "PXEClient", arch: arch(iana.EFI_ARM64)}.packet(t, dhcpv4.MessageTypeDiscover), 67), "arm64 without an arm64 binary")
	require.Nil(t, h.Respond(client{mac: "52:54:00:00:01:02", class: "PXEClient", arch: arch(iana.EFI_ARM64)}.packet(t, dhcpv4.MessageTypeDiscover), 67), "its retransmission")
	require.Nil(t, h.Respond(client{mac: "52:54:00:00:01:03", class: "PXEClient", arch: arch(iana.EFI_IA32)}.packet(t, dhcpv4.MessageTypeDiscover), 67), "32-bit UEFI")
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("not-pxe")))
	require.Equal(t, 3.0, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("unsupported-arch")))
	// Each firmware not served is logged once, with the reason; a plain
	// DHCP client is not.
	mu.Lock()
	require.Len(t, lines, 2, "%v", lines)
	require.Contains(t, lines[0], `"msg"="network boot client not answered: its firmware's architecture (option 93) is one this PXE service has no boot file for" "mac"="52:54:00:00:01:02" "request"="DISCOVER on port 67, EFI ARM64, PXEClient"`)
	require.Contains(t, lines[1], `"mac"="52:54:00:00:01:03"`)
	mu.Unlock()

	h.cfg.ARM64Binary = "grubnetaa64.efi"
	reply := h.Respond(client{mac: "52:54:00:00:01:04", class: "PXEClient", arch: arch(iana.EFI_ARM64)}.packet(t, dhcpv4.MessageTypeDiscover), 67)
	require.NotNil(t, reply)
	require.Equal(t, "grubnetaa64.efi", reply.BootFileNameOption())
	require.Nil(t, h.Respond(client{mac: "52:54:00:00:01:05", class: "HTTPClient", arch: arch(iana.EFI_ARM64_HTTP)}.packet(t, dhcpv4.MessageTypeDiscover), 67),
		"arm64 HTTP boot: GRUB 2.06 would find no network")
}

func TestRateLimitPerMAC(t *testing.T) {
	h := newHandler(t, Proxy)
	c := client{mac: "52:54:00:00:02:01", class: "PXEClient", arch: arch(iana.INTEL_X86PC)}
	answered := 0
	for i := 0; i < 30; i++ {
		if h.Respond(c.packet(t, dhcpv4.MessageTypeDiscover), 67) != nil {
			answered++
		}
	}
	require.LessOrEqual(t, answered, macBurst+1)
	require.Positive(t, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("rate-limited")))
	// Another MAC is not affected.
	require.NotNil(t, h.Respond(client{mac: "52:54:00:00:02:02", class: "PXEClient", arch: arch(iana.INTEL_X86PC)}.packet(t, dhcpv4.MessageTypeDiscover), 67))
}

func TestAuthoritativeDORA(t *testing.T) {
	h := newHandler(t, Authoritative)
	c := client{mac: "52:54:00:00:03:01", class: "PXEClient", arch: arch(iana.EFI_X86_64)}
	offer := h.Respond(c.packet(t, dhcpv4.MessageTypeDiscover), 67)
	require.NotNil(t, offer)
	given := offer.YourIPAddr.String()
	require.True(t, strings.HasPrefix(given, "198.18.0.1"), "an address of the pool: %s", given)
	require.Equal(t, "ipxe.efi", offer.BootFileNameOption())
	require.Equal(t, net.IPMask(net.CIDRMask(24, 32)), offer.SubnetMask())
	require.Equal(t, 12*time.Hour, offer.IPAddressLeaseTime(0))

	req := c.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(server.AsSlice()))))
	ack := h.Respond(req, 67)
	require.NotNil(t, ack)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	require.Equal(t, given, ack.YourIPAddr.String())
	require.Equal(t, "198.18.0.1", ack.Router()[0].String())
	require.Equal(t, "198.18.0.1", ack.DNS()[0].String())

	// Another client asking for that address is refused.
	other := client{mac: "52:54:00:00:03:02"}
	nak := h.Respond(other.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr))), 67)
	require.NotNil(t, nak)
	require.Equal(t, dhcpv4.MessageTypeNak, nak.MessageType())

	// A plain client gets an address but no boot file.
	plain := h.Respond(other.packet(t, dhcpv4.MessageTypeDiscover), 67)
	require.NotNil(t, plain)
	require.NotEqual(t, given, plain.YourIPAddr.String())
	require.False(t, plain.YourIPAddr.IsUnspecified())
	require.Empty(t, plain.BootFileNameOption())

	// A request naming another server is its business; the server notices.
	third := client{mac: "52:54:00:00:03:03"}
	require.Nil(t, h.Respond(third.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("198.18.0.200"))), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("198.18.0.254")))), 67))
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.Others))
}

// Replies go to the client, its relay or broadcast, never to an address a
// made-up packet names: a relay not configured, a source or ciaddr outside
// the boot network, a ciaddr that is not the client's lease.
func TestDestination(t *testing.T) {
	h := newHandler(t, Proxy)
	dest := func(req *dhcpv4.DHCPv4, peer *net.UDPAddr, port int) string {
		d, ok := h.Destination(req, peer, port)
		if !ok {
			return "none"
		}
		return d.String()
	}
	c := client{mac: "52:54:00:00:04:01"}
	d := c.packet(t, dhcpv4.MessageTypeDiscover)
	require.Equal(t, "255.255.255.255:68", dest(d, &net.UDPAddr{IP: net.IPv4zero, Port: 68}, 67))
	r := c.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.ParseIP("198.18.0.5")))
	require.Equal(t, "198.18.0.5:68", dest(r, &net.UDPAddr{IP: net.ParseIP("198.18.0.5"), Port: 68}, 67))
	require.Equal(t, "198.18.0.5:4011", dest(r, &net.UDPAddr{IP: net.ParseIP("198.18.0.5"), Port: 4011}, 4011))
	relayed := c.packet(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.ParseIP("198.18.1.1")))
	require.Equal(t, "198.18.1.1:67", dest(relayed, nil, 67))

	// Made up: another relay, a ciaddr or source elsewhere.
	spoofedRelay := c.packet(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.ParseIP("10.0.0.53")))
	require.Equal(t, "none", dest(spoofedRelay, nil, 67))
	require.Nil(t, h.Respond(spoofedRelay, 67), "a request through an unknown relay is not answered")
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("unknown-relay")))
	elsewhere := c.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.ParseIP("10.0.0.53")))
	require.Equal(t, "255.255.255.255:68", dest(elsewhere, &net.UDPAddr{IP: net.ParseIP("10.0.0.53"), Port: 68}, 67))
	require.Equal(t, "none", dest(elsewhere, &net.UDPAddr{IP: net.ParseIP("10.0.0.53"), Port: 4011}, 4011))

	// Authoritative: ciaddr only when it is the client's lease.
	a := newHandler(t, Authoritative)
	leased := client{mac: "52:54:00:00:04:02"}
	offer := a.Respond(leased.packet(t, dhcpv4.MessageTypeDiscover), 67)
	require.NotNil(t, offer)
	ack := a.Respond(leased.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(server.AsSlice())))), 67)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	renew := leased.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(offer.YourIPAddr))
	got, ok := a.Destination(renew, nil, 67)
	require.True(t, ok)
	require.Equal(t, offer.YourIPAddr.String()+":68", got.String())
	notLeased := leased.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.ParseIP("198.18.0.7")))
	got, _ = a.Destination(notLeased, nil, 67)
	require.Equal(t, "255.255.255.255:68", got.String(), "not its lease: broadcast, not unicast to someone else")
}

// A flood of DISCOVERs from made-up MACs: each new MAC buys no fresh burst
// beyond the new-client limit (the default's, or the one configured), and a
// client holding a lease is still served.
func TestMACFloodIsBounded(t *testing.T) {
	for _, burst := range []int{0, 100} {
		t.Run(fmt.Sprintf("burst %d", burst), func(t *testing.T) {
			h := newHandler(t, Authoritative, func(c *Config) { c.NewClientBurst = burst })
			if burst == 0 {
				burst = newClientBurst
			}
			macFlood(t, h, burst)
		})
	}
}

func macFlood(t *testing.T, h *Handler, burst int) {
	known := client{mac: "52:54:00:00:05:01"}
	offer := h.Respond(known.packet(t, dhcpv4.MessageTypeDiscover), 67)
	require.NotNil(t, offer)
	request := func() *dhcpv4.DHCPv4 {
		return h.Respond(known.packet(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(server.AsSlice())))), 67)
	}
	require.Equal(t, dhcpv4.MessageTypeAck, request().MessageType())

	start := time.Now()
	answered := 0
	const flood = 3000
	for i := range flood {
		c := client{mac: fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff)}
		if h.Respond(c.packet(t, dhcpv4.MessageTypeDiscover), 67) != nil {
			answered++
		}
	}
	allowed := burst + int(time.Since(start).Seconds()*newClientRate) + 1
	require.LessOrEqual(t, answered, allowed, "new MACs are limited together")
	require.GreaterOrEqual(t, answered, burst-1, "a burst of new clients is served at once (less the one the known client took)")
	require.Equal(t, float64(flood-answered), testutil.ToFloat64(h.metrics.Dropped.WithLabelValues("new-client-rate-limited")))
	ack := request()
	require.NotNil(t, ack, "the client holding a lease is served during the flood")
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
}
