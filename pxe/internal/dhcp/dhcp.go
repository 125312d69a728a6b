// Package dhcp answers DHCP for network boot. In proxy mode it answers PXE,
// UEFI HTTP boot and iPXE clients with boot information only, never an
// address, so it lives next to the site's DHCP server; in authoritative mode
// it also hands out addresses from a pool. It decides the boot file from the
// client's firmware: option 60 (PXEClient or HTTPClient), option 93 (its
// architecture) and options 77/175 (iPXE).
package dhcp

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/utils/lru"

	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/pxe/internal/leases"
)

// Mode of the server.
type Mode string

// Modes.
const (
	Proxy         Mode = "proxy"
	Authoritative Mode = "authoritative"
)

// Config of the handler.
type Config struct {
	Mode Mode
	// ServerIP is this server's address on the boot network: server
	// identifier, next-server (TFTP) and, for HTTP boot, the host in URLs.
	ServerIP netip.Addr
	// BootScriptURL is where iPXE fetches its script; the client's MAC is
	// appended as ?mac=.
	BootScriptURL string
	// HTTPBase serves the iPXE binaries for UEFI HTTP boot (http://ip:port).
	HTTPBase string
	// Binaries for each firmware.
	BIOSBinary string // undionly.kpxe
	EFIBinary  string // ipxe.efi or snponly.efi
	// EFIPXEBinary, when set, goes to x86-64 UEFI PXE clients instead of
	// EFIBinary: the signed shim of the Secure Boot path. UEFI HTTP boot
	// clients keep EFIBinary.
	EFIPXEBinary string
	ARM64Binary  string // agentboot's netboot GRUB; empty: arm64 clients are not answered
	// Authoritative mode.
	Leases    *leases.DB
	Netmask   net.IPMask
	Router    netip.Addr
	DNS       []netip.Addr
	LeaseTime time.Duration
	// Subnet is the boot network (the server's address and prefix), when
	// known: replies go only to addresses in it (a request's source on
	// port 4011, its ciaddr), never to whatever address a packet names.
	Subnet netip.Prefix
	// Relays are the DHCP relay agents (giaddr) whose requests are
	// answered; a request naming any other relay is dropped, so that
	// made-up packets cannot send replies to arbitrary addresses.
	Relays []netip.Addr
	// NewClientRate is how many packets a second MACs not seen lately
	// may send together (50), and NewClientBurst how many of them may come
	// at once (1000; at least a second's worth). Clients holding a lease
	// or a reservation are not counted.
	NewClientRate  float64
	NewClientBurst int
	// Observe, when set, is told of each request from a network-boot
	// client (PXE, HTTP boot or iPXE), for its boot trace: whether it was
	// answered with a boot file and, when not, why; the address the
	// client has or asks for, when it says.
	Observe func(Observation)
	Log     logr.Logger
	Now     func() time.Time
}

// Observation is what Respond did with a client's request.
type Observation struct {
	MAC string
	// Answered: a reply with a boot file went out.
	Answered bool
	// Outcome says what was sent, or why nothing was.
	Outcome string
	// Detail describes the request: message type, port, firmware.
	Detail string
	// Addr is the address the client uses or asks for, if any.
	Addr netip.Addr
}

// Handler turns requests into replies.
type Handler struct {
	cfg      Config
	mu       sync.Mutex
	limiters *lru.Cache // MAC → *rate.Limiter, the most recently seen
	// newClients limits the packets of MACs without a limiter yet, so
	// that rotating MACs buys no fresh burst beyond it.
	newClients *rate.Limiter
	others     map[string]time.Time // other DHCP servers seen, for the log
	unserved   map[string]time.Time // boot clients not answered, logged, by reason and MAC
	served4    *lru.Cache           // MAC → time.Time of its last DHCPv4 boot file
	metrics    *Metrics
}

// Metrics count what the handler did.
type Metrics struct {
	Packets *prometheus.CounterVec // by message type and outcome
	Dropped *prometheus.CounterVec // by reason
	Others  prometheus.Counter
	// Hops counts offers of a boot file (agentboot_boot_path_total); the
	// PXE service registers it.
	Hops *prometheus.CounterVec
}

// NewMetrics registers the handler's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Packets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_dhcp_replies_total", Help: "DHCP replies sent, by type."}, []string{"type"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_dhcp_dropped_total", Help: "DHCP packets dropped, by reason."}, []string{"reason"}),
		Others:  prometheus.NewCounter(prometheus.CounterOpts{Name: "agentboot_dhcp_other_servers_seen_total", Help: "Client requests naming another DHCP server."}),
	}
	if reg != nil {
		reg.MustRegister(m.Packets, m.Dropped, m.Others)
	}
	return m
}

// New returns a handler.
func New(cfg Config, m *Metrics) (*Handler, error) {
	if !cfg.ServerIP.Is4() {
		return nil, errors.New("DHCP: the server's IPv4 address is required")
	}
	if cfg.Mode == Authoritative && cfg.Leases == nil {
		return nil, errors.New("DHCP: authoritative mode needs a lease database")
	}
	if cfg.LeaseTime == 0 {
		cfg.LeaseTime = 12 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	if cfg.NewClientRate <= 0 {
		cfg.NewClientRate = newClientRate
	}
	if cfg.NewClientBurst <= 0 {
		cfg.NewClientBurst = newClientBurst
	}
	burst := max(cfg.NewClientBurst, int(math.Ceil(cfg.NewClientRate)))
	return &Handler{cfg: cfg, limiters: lru.New(maxTrackedMACs), newClients: rate.NewLimiter(rate.Limit(cfg.NewClientRate), burst),
		others: map[string]time.Time{}, unserved: map[string]time.Time{}, served4: lru.New(maxTrackedMACs), metrics: m}, nil
}

// Per-MAC limit: real clients retransmit every few seconds; a burst of 10
// covers a whole DORA exchange with retries.
const (
	macRate  = 5
	macBurst = 10
	// MACs not seen lately: a thousand machines powering on together for
	// the first time (a row of racks, or a whole site after a power cut
	// in proxy mode, where nobody holds a lease) are served at once, then
	// 50 new clients a second. Clients holding a lease or a reservation
	// are exempt: a flood of made-up MACs delays new clients (which
	// retransmit), never the ones already served.
	newClientRate  = 50
	newClientBurst = 1000
	// maxTrackedMACs bounds the per-MAC state; the least recently seen
	// MAC is forgotten first.
	maxTrackedMACs = 65536
)

// firmware is what a client is.
type firmware struct {
	ipxe   bool
	arch   iana.Arch
	hasArc bool
	class  string // option 60
}

func identify(m *dhcpv4.DHCPv4) firmware {
	f := firmware{class: m.ClassIdentifier()}
	if archs := m.ClientArch(); len(archs) > 0 {
		f.arch, f.hasArc = archs[0], true
	}
	if len(m.GetOneOption(dhcpv4.GenericOptionCode(175))) > 0 || strings.Contains(string(m.GetOneOption(dhcpv4.OptionUserClassInformation)), "iPXE") {
		f.ipxe = true
	}
	return f
}

// bootInfo says what a client should boot, or why it gets nothing.
type bootInfo struct {
	file       string
	viaTFTP    bool
	httpClient bool
}

func (h *Handler) boot(f firmware, mac string) (bootInfo, string) {
	if f.ipxe {
		u := h.cfg.BootScriptURL
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		return bootInfo{file: u + sep + "mac=" + mac}, "" // colons need no escaping in a query
	}
	pxe := strings.HasPrefix(f.class, "PXEClient")
	httpBoot := strings.HasPrefix(f.class, "HTTPClient")
	if !pxe && !httpBoot {
		return bootInfo{}, "not-pxe"
	}
	if !f.hasArc {
		if httpBoot {
			return bootInfo{}, "unsupported-arch"
		}
		f.arch = iana.INTEL_X86PC // the oldest BIOS PXE ROMs omit option 93
	}
	switch f.arch {
	case iana.INTEL_X86PC:
		return bootInfo{file: h.cfg.BIOSBinary, viaTFTP: true}, ""
	case iana.EFI_X86_64, iana.EFI_BC:
		if h.cfg.EFIPXEBinary != "" {
			return bootInfo{file: h.cfg.EFIPXEBinary, viaTFTP: true}, ""
		}
		return bootInfo{file: h.cfg.EFIBinary, viaTFTP: true}, ""
	case iana.EFI_ARM64:
		if h.cfg.ARM64Binary == "" {
			return bootInfo{}, "unsupported-arch"
		}
		return bootInfo{file: h.cfg.ARM64Binary, viaTFTP: true}, ""
	case iana.EFI_X86_64_HTTP:
		return bootInfo{file: h.cfg.HTTPBase + "/ipxe/" + h.cfg.EFIBinary, httpClient: true}, ""
	case iana.EFI_ARM64_HTTP:
		// Not answered: the arm64 boot loader is GRUB 2.06, which
		// configures its network from the firmware's PXE state, absent
		// under HTTP boot; the firmware moves on (to PXE, arch 11, on
		// servers that offer both).
		return bootInfo{}, "unsupported-arch"
	}
	return bootInfo{}, "unsupported-arch"
}

// Respond returns the reply to req (received on port 67, or 4011 for
// ProxyDHCP requests), or nil when req gets none.
func (h *Handler) Respond(req *dhcpv4.DHCPv4, port int) *dhcpv4.DHCPv4 {
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		h.drop("malformed")
		return nil
	}
	reply, why, booting := h.respond(req, port)
	if why != "" {
		h.drop(why)
	}
	if booting && (h.cfg.Observe != nil || why == "unsupported-arch") {
		o := observation(req, port, reply, why)
		if h.cfg.Observe != nil {
			h.cfg.Observe(o)
		}
		// A firmware this service has no boot file for is answered with
		// nothing, and said so once: otherwise it only retries, then
		// moves on, with nothing in the log to say why.
		if why == "unsupported-arch" && h.firstUnserved(o.MAC, why) {
			h.cfg.Log.Info("network boot client not answered: "+whyText(why), "mac", o.MAC, "request", o.Detail)
		}
	}
	return reply
}

// observation describes what Respond did, for the client's boot trace.
func observation(req *dhcpv4.DHCPv4, port int, reply *dhcpv4.DHCPv4, why string) Observation {
	f := identify(req)
	o := Observation{MAC: req.ClientHWAddr.String(), Detail: fmt.Sprintf("%s on port %d", req.MessageType(), port)}
	switch {
	case f.ipxe:
		o.Detail += ", iPXE"
	case f.hasArc:
		o.Detail += ", " + f.arch.String()
	}
	if f.class != "" {
		o.Detail += ", " + clip.Text(f.class, 40)
	}
	if ip := addr(req.ClientIPAddr); ip.IsValid() {
		o.Addr = ip
	} else if ip, ok := netip.AddrFromSlice(req.RequestedIPAddress().To4()); ok && req.RequestedIPAddress() != nil {
		o.Addr = ip
	}
	switch {
	case reply != nil && reply.BootFileName != "":
		o.Answered, o.Outcome = true, reply.MessageType().String()+" with boot file "+reply.BootFileName
		if yi := addr(reply.YourIPAddr); yi.IsValid() {
			o.Addr = yi
			o.Outcome += ", address " + yi.String()
		}
	case reply != nil:
		if f := reply.GetOneOption(dhcpv4.OptionBootfileName); len(f) > 0 {
			o.Answered, o.Outcome = true, reply.MessageType().String()+" with boot file "+clip.Text(string(f), 200)
		} else {
			o.Answered, o.Outcome = true, reply.MessageType().String()+" without a boot file"
		}
	case why != "":
		o.Outcome = "not answered: " + whyText(why)
	case req.MessageType() == dhcpv4.MessageTypeRequest && port != 4011:
		o.Answered, o.Outcome = true, "a request for the site's DHCP server, seen"
	default:
		o.Outcome = "not answered"
	}
	return o
}

// whyText says a drop reason in words.
func whyText(why string) string {
	switch why {
	case "unsupported-arch":
		return "its firmware's architecture (option 93) is one this PXE service has no boot file for"
	}
	return why
}

// respond answers req, or says why not; booting says whether req is a hop
// of a boot path (for the boot trace): not from a client that is not
// network booting (an installed system, the live system's own DHCP, which
// authoritative mode answers with an address), nor a packet dropped before
// it was looked at (rate limits, an unknown relay), which anyone can send
// from any MAC.
func (h *Handler) respond(req *dhcpv4.DHCPv4, port int) (reply *dhcpv4.DHCPv4, why string, booting bool) {
	mac := req.ClientHWAddr.String()
	if gw := addr(req.GatewayIPAddr); gw.IsValid() && !slices.Contains(h.cfg.Relays, gw) {
		return nil, "unknown-relay", false
	}
	if ok, why := h.allow(mac); !ok {
		return nil, why, false
	}
	h.noticeOtherServer(req)
	f := identify(req)
	bi, why := h.boot(f, mac)
	bootable := why == ""
	booting = why != "not-pxe"

	if h.cfg.Mode == Authoritative && port != 4011 {
		return h.authoritative(req, mac, f, bi, bootable), "", booting
	}
	if !bootable {
		return nil, why, booting
	}
	var t dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		t = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeInform:
		if port != 4011 {
			// On port 67 a REQUEST is for the site's DHCP server.
			return nil, "", booting
		}
		t = dhcpv4.MessageTypeAck
	default:
		return nil, "", booting
	}
	reply, err := h.reply(req, t, netip.Addr{}, f, bi)
	if err != nil {
		return nil, "reply-error", booting
	}
	return reply, "", booting
}

// reply builds a reply with the boot information; ip is the address given
// (none in proxy mode).
func (h *Handler) reply(req *dhcpv4.DHCPv4, t dhcpv4.MessageType, ip netip.Addr, f firmware, bi bootInfo) (*dhcpv4.DHCPv4, error) {
	server := net.IP(h.cfg.ServerIP.AsSlice())
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(t),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)),
	}
	if ip.IsValid() {
		mods = append(mods, dhcpv4.WithYourIP(net.IP(ip.AsSlice())))
	}
	if bi.file != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptBootFileName(bi.file)))
		if len(bi.file) < 128 {
			// Many PXE ROMs read only the BOOTP file field.
			mods = append(mods, func(d *dhcpv4.DHCPv4) { d.BootFileName = bi.file })
		}
		class := "PXEClient"
		if bi.httpClient {
			class = "HTTPClient"
		}
		// Option 60 marks a ProxyDHCP offer (an offer without an address)
		// as one firmware, and iPXE, must take boot information from.
		if !f.ipxe || h.cfg.Mode == Proxy {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)))
		}
		// Next-server: the TFTP server, and for iPXE, which drops a
		// ProxyDHCP answer without next-server and file name, this
		// server.
		mods = append(mods, dhcpv4.WithServerIP(server))
		if !f.ipxe && !bi.httpClient {
			// PXE_DISCOVERY_CONTROL: boot the file named here, no menu or
			// boot server discovery.
			mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}))
		}
		if uuid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); len(uuid) > 0 {
			mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, uuid))
		}
	}
	reply, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, err
	}
	h.metrics.Packets.WithLabelValues(t.String()).Inc()
	if bi.file != "" {
		h.served4.Add(req.ClientHWAddr.String(), h.cfg.Now())
	}
	if t == dhcpv4.MessageTypeOffer && bi.file != "" && h.metrics.Hops != nil {
		h.metrics.Hops.WithLabelValues(bootpath.DHCPOffer).Inc()
	}
	if log := h.cfg.Log.V(1); log.Enabled() {
		given := "none"
		if ip.IsValid() {
			given = ip.String()
		}
		log.Info("reply", "type", t.String(), "mac", req.ClientHWAddr.String(), "ipxe", f.ipxe, "arch", f.arch.String(), "address", given, "file", bi.file)
	}
	return reply, nil
}

func (h *Handler) drop(reason string) {
	h.metrics.Dropped.WithLabelValues(reason).Inc()
	h.cfg.Log.V(2).Info("dropped a DHCP packet", "reason", reason)
}

func (h *Handler) allow(mac string) (bool, string) {
	now := h.cfg.Now()
	known := h.cfg.Leases != nil && h.cfg.Leases.Known(mac)
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.limiters.Get(mac)
	if !ok {
		if !known && !h.newClients.AllowN(now, 1) {
			return false, "new-client-rate-limited"
		}
		v = rate.NewLimiter(macRate, macBurst)
		h.limiters.Add(mac, v)
	}
	if !v.(*rate.Limiter).AllowN(now, 1) {
		return false, "rate-limited"
	}
	return true, ""
}

// noticeOtherServer logs, once an hour per server, a client request that
// names another DHCP server: in proxy mode that is the site's DHCP server;
// in authoritative mode a second server answering on the same segment.
func (h *Handler) noticeOtherServer(req *dhcpv4.DHCPv4) {
	id := req.ServerIdentifier()
	if id == nil || id.Equal(net.IP(h.cfg.ServerIP.AsSlice())) || req.MessageType() != dhcpv4.MessageTypeRequest {
		return
	}
	h.metrics.Others.Inc()
	h.mu.Lock()
	last, seen := h.others[id.String()]
	now := h.cfg.Now()
	if seen && now.Sub(last) < time.Hour {
		h.mu.Unlock()
		return
	}
	h.others[id.String()] = now
	h.mu.Unlock()
	if h.cfg.Mode == Authoritative {
		h.cfg.Log.Info("another DHCP server answers on this segment: clients may get addresses from it instead", "server", id.String(), "client", req.ClientHWAddr.String())
	} else {
		h.cfg.Log.Info("DHCP server seen on the boot network (proxy mode answers next to it)", "server", id.String())
	}
}

func (h *Handler) authoritative(req *dhcpv4.DHCPv4, mac string, f firmware, bi bootInfo, bootable bool) *dhcpv4.DHCPv4 {
	db := h.cfg.Leases
	if !bootable {
		bi = bootInfo{} // addresses for everyone, boot files for network boot clients
	}
	requested := addr(req.RequestedIPAddress())
	if !requested.IsValid() {
		requested = addr(req.ClientIPAddr)
	}
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		ip, err := db.Offer(mac, requested)
		if err != nil {
			h.cfg.Log.Info("no address to offer", "mac", mac, "err", err)
			h.drop("pool-exhausted")
			return nil
		}
		return h.withLease(req, dhcpv4.MessageTypeOffer, ip, f, bi)
	case dhcpv4.MessageTypeRequest:
		if id := req.ServerIdentifier(); id != nil && !id.Equal(net.IP(h.cfg.ServerIP.AsSlice())) {
			return nil // the client chose another server's offer
		}
		if !requested.IsValid() {
			h.drop("malformed")
			return nil
		}
		l, err := db.Ack(mac, requested, h.cfg.LeaseTime, req.HostName())
		if err != nil {
			h.cfg.Log.Info("refusing a requested address", "mac", mac, "ip", requested.String(), "reason", err.Error())
			nak, err := dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(h.cfg.ServerIP.AsSlice()))))
			if err != nil {
				return nil
			}
			h.metrics.Packets.WithLabelValues(dhcpv4.MessageTypeNak.String()).Inc()
			return nak
		}
		ack := h.withLease(req, dhcpv4.MessageTypeAck, requested, f, bi)
		if ack != nil {
			// A renewal may keep the lease it had: tell its real end.
			ack.UpdateOption(dhcpv4.OptIPAddressLeaseTime(l.Expiry.Sub(h.cfg.Now()).Round(time.Second)))
		}
		return ack
	case dhcpv4.MessageTypeRelease:
		_ = db.Release(mac, addr(req.ClientIPAddr))
	case dhcpv4.MessageTypeDecline:
		if requested.IsValid() {
			if err := db.Decline(mac, requested); err != nil {
				h.drop("decline-refused")
				h.cfg.Log.V(1).Info("ignored a DECLINE", "mac", mac, "ip", requested.String(), "reason", err.Error())
				return nil
			}
			h.cfg.Log.Info("client declined an address (in use on the network?)", "mac", mac, "ip", requested.String())
		}
	case dhcpv4.MessageTypeInform:
		return h.withLease(req, dhcpv4.MessageTypeAck, netip.Addr{}, f, bi)
	}
	return nil
}

func (h *Handler) withLease(req *dhcpv4.DHCPv4, t dhcpv4.MessageType, ip netip.Addr, f firmware, bi bootInfo) *dhcpv4.DHCPv4 {
	reply, err := h.reply(req, t, ip, f, bi)
	if err != nil {
		h.drop("reply-error")
		return nil
	}
	if ip.IsValid() {
		reply.UpdateOption(dhcpv4.OptIPAddressLeaseTime(h.cfg.LeaseTime))
	}
	if h.cfg.Netmask != nil {
		reply.UpdateOption(dhcpv4.OptSubnetMask(h.cfg.Netmask))
	}
	if h.cfg.Router.IsValid() {
		reply.UpdateOption(dhcpv4.OptRouter(net.IP(h.cfg.Router.AsSlice())))
	}
	if len(h.cfg.DNS) > 0 {
		var dns []net.IP
		for _, d := range h.cfg.DNS {
			dns = append(dns, net.IP(d.AsSlice()))
		}
		reply.UpdateOption(dhcpv4.OptDNS(dns...))
	}
	return reply
}

func addr(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip)
	if a = a.Unmap(); !ok || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// Destination says where a reply to req, received from peer, goes: its
// relay agent (one of Relays; Respond drops the others), the client's own
// address, or broadcast. A request's source (port 4011) and ciaddr are
// used only when they lie in the boot network and, in authoritative mode,
// ciaddr only when it is the client's lease: a made-up packet cannot aim
// replies at another address. ok is false when there is nowhere to send.
func (h *Handler) Destination(req *dhcpv4.DHCPv4, peer *net.UDPAddr, port int) (*net.UDPAddr, bool) {
	if gw := addr(req.GatewayIPAddr); gw.IsValid() {
		if !slices.Contains(h.cfg.Relays, gw) {
			return nil, false
		}
		return &net.UDPAddr{IP: net.IP(gw.AsSlice()), Port: dhcpv4.ServerPort}, true // through the relay agent
	}
	local := func(ip netip.Addr) bool { return !h.cfg.Subnet.IsValid() || h.cfg.Subnet.Contains(ip) }
	if port == 4011 {
		// ProxyDHCP: the client already has an address and asked from it.
		if peer == nil {
			return nil, false
		}
		src := addr(peer.IP)
		if !src.IsValid() || !local(src) {
			return nil, false
		}
		return peer, true
	}
	if ip := addr(req.ClientIPAddr); ip.IsValid() && req.MessageType() != dhcpv4.MessageTypeDiscover && local(ip) {
		if h.cfg.Leases == nil {
			return &net.UDPAddr{IP: net.IP(ip.AsSlice()), Port: dhcpv4.ClientPort}, true
		}
		if l, ok := h.cfg.Leases.LeaseOf(req.ClientHWAddr.String()); ok && l.IP == ip {
			return &net.UDPAddr{IP: net.IP(ip.AsSlice()), Port: dhcpv4.ClientPort}, true
		}
	}
	return &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}, true
}

// String describes the configuration for the log.
func (c Config) String() string {
	return fmt.Sprintf("mode=%s server=%s", c.Mode, c.ServerIP)
}

// Dropped counts a packet dropped after Respond, for reason.
func (h *Handler) Dropped(reason string) { h.drop(reason) }

// Malformed counts a packet that did not parse.
func (h *Handler) Malformed() { h.drop("malformed") }

// Metrics returns the handler's counters.
func (h *Handler) Metrics() *Metrics { return h.metrics }
