package dhcp

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/agentboot/agentboot/internal/clip"
)

// NotServedIPv6 is why a DHCPv6 network-boot client gets no answer, in the
// log and in its boot trace.
const NotServedIPv6 = "agentboot pxe answers DHCP over IPv4 only: an IPv6 network boot needs the site's DHCPv6 server to give the boot file (docs/pxe.md#ipv6)"

// Unserved6 is told of a DHCPv6 packet from peer (the sender's address)
// on the boot network. This service does not answer DHCPv6; a client that
// is network booting (it sends its architecture, vendor class PXEClient or
// HTTPClient, user class iPXE, or asks for a boot file URL) is logged
// once an hour per MAC with the reason, counted as dropped
// (ipv6-not-served) and, when Observe is set and its MAC is known,
// observed for its boot trace, so that a host trying IPv6 network boot
// is seen going nowhere; unless it was sent a boot file over DHCPv4
// lately (then it is only counted). Other DHCPv6 traffic (an installed system's, the site server's own) is
// ignored. Packets are rate-limited per MAC as IPv4 ones are.
func (h *Handler) Unserved6(packet []byte, peer netip.Addr) {
	d, err := dhcpv6.FromBytes(packet)
	if err != nil {
		h.drop("malformed-dhcpv6")
		return
	}
	var relayed bool
	msg, ok := d.(*dhcpv6.Message)
	if !ok {
		relay, _ := d.(*dhcpv6.RelayMessage)
		if relay == nil || relay.Type() != dhcpv6.MessageTypeRelayForward {
			return // a relay's reply, not a client's request
		}
		if msg, err = relay.GetInnerMessage(); err != nil {
			h.drop("malformed-dhcpv6")
			return
		}
		relayed = true
	}
	switch msg.Type() {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeInformationRequest,
		dhcpv6.MessageTypeConfirm, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeRenew:
	default:
		return
	}
	f, booting := identify6(msg)
	if !booting {
		return
	}
	mac := mac6(msg, peer, relayed)
	// A limit of its own: made-up DHCPv6 packets naming a MAC must not use
	// up that MAC's DHCPv4 allowance.
	if ok, why := h.allow("v6 " + mac); !ok {
		h.drop(why)
		return
	}
	h.drop("ipv6-not-served")
	if h.servedOverIPv4(mac) {
		// A dual-stack client (iPXE configures both families at once)
		// that is booting over IPv4: not stuck, and its trace's DHCP
		// hop is the IPv4 answer.
		return
	}
	detail := clip.Text("DHCPv6 "+msg.Type().String()+", "+f, 120)
	if h.cfg.Observe != nil && mac != "unknown" {
		h.cfg.Observe(Observation{MAC: mac, Outcome: "not answered: " + NotServedIPv6, Detail: detail})
	}
	if h.firstUnserved(mac, "ipv6") {
		h.cfg.Log.Info("DHCPv6 network boot client not answered: "+NotServedIPv6, "mac", mac, "from", peer.String(), "request", detail)
	}
}

// firstUnserved says whether mac is not yet logged as a client not
// answered for reason this hour, and notes it: each such client is
// logged once an hour. The record is bounded: full of this hour's
// clients (maxTrackedMACs), it logs no new one, so that a flood of
// made-up MACs cannot flood the log.
func (h *Handler) firstUnserved(mac, reason string) bool {
	now, key := h.cfg.Now(), reason+" "+mac
	h.mu.Lock()
	defer h.mu.Unlock()
	if last, seen := h.unserved[key]; seen && now.Sub(last) < time.Hour {
		return false
	}
	if len(h.unserved) >= maxTrackedMACs {
		for k, at := range h.unserved {
			if now.Sub(at) >= time.Hour {
				delete(h.unserved, k)
			}
		}
		if len(h.unserved) >= maxTrackedMACs {
			// Full of this hour's clients: more are counted, not
			// logged, so a flood of made-up MACs cannot flood the log.
			h.metrics.Dropped.WithLabelValues("unserved-log-suppressed").Inc()
			return false
		}
	}
	h.unserved[key] = now
	return true
}

// servedOverIPv4 says whether mac was sent a boot file over DHCPv4 in the
// last ten minutes.
func (h *Handler) servedOverIPv4(mac string) bool {
	at, ok := h.served4.Get(mac) // the cache has a lock of its own
	return ok && h.cfg.Now().Sub(at.(time.Time)) < 10*time.Minute
}

// identify6 describes a DHCPv6 client's firmware (the first of each kind
// of option that says so) and says whether it is network booting.
func identify6(m *dhcpv6.Message) (string, bool) {
	var parts []string
	booting := m.IsNetboot()
	if archs := m.Options.ArchTypes(); len(archs) > 0 {
		parts = append(parts, iana.Arch(archs[0]).String())
		booting = true
	}
vendor:
	for _, vc := range m.Options.VendorClasses() {
		for _, d := range vc.Data {
			if s := string(d); strings.HasPrefix(s, "PXEClient") || strings.HasPrefix(s, "HTTPClient") {
				parts = append(parts, clip.Text(s, 40))
				booting = true
				break vendor
			}
		}
	}
	if slices.ContainsFunc(m.Options.UserClasses(), func(uc []byte) bool { return string(uc) == "iPXE" }) {
		parts = append(parts, "iPXE")
		booting = true
	}
	if len(parts) == 0 {
		parts = append(parts, "asks for a boot file URL")
	}
	return strings.Join(parts, ", "), booting
}

// mac6 is the client's MAC as well as DHCPv6 tells it: the link-layer
// address in its DUID (DUID-LL, DUID-LLT of Ethernet), else, when it
// asked from its own link-local address formed from its MAC (EUI-64), that
// MAC; else "unknown". Clients choose both, so the MAC only names the
// client in the log and the boot trace, as a DHCPv4 chaddr does.
func mac6(m *dhcpv6.Message, peer netip.Addr, relayed bool) string {
	switch d := m.Options.ClientID().(type) {
	case *dhcpv6.DUIDLL:
		if d.HWType == iana.HWTypeEthernet && len(d.LinkLayerAddr) == 6 {
			return d.LinkLayerAddr.String()
		}
	case *dhcpv6.DUIDLLT:
		if d.HWType == iana.HWTypeEthernet && len(d.LinkLayerAddr) == 6 {
			return d.LinkLayerAddr.String()
		}
	}
	if !relayed && peer.Is6() && peer.IsLinkLocalUnicast() {
		b := peer.As16()
		if b[11] == 0xff && b[12] == 0xfe {
			return net.HardwareAddr{b[8] ^ 2, b[9], b[10], b[13], b[14], b[15]}.String()
		}
	}
	return "unknown"
}
