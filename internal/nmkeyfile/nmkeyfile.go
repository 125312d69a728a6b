// Package nmkeyfile turns an NMStateConfig's nmstate document into
// NetworkManager keyfiles for the discovery initramfs, where CoreOS's
// NetworkManager applies them before Ignition fetches anything: what a host
// on a network without DHCP needs to reach the image service at all.
// coreos-installer's --network-keyfile puts keyfiles in the same place
// (etc/coreos-firstboot-network/ of the live initramfs).
//
// Every profile is bound to its host by MAC address, never by interface
// name: an Ethernet profile matches its MAC (ethernet.mac-address), and a
// VLAN's parent is that profile's UUID. One discovery image carries the
// configs of every host of its InfraEnv, and a host activates only its own.
//
// The nmstate subset converted: Ethernet and VLAN interfaces in state up,
// with MTU, static IPv4/IPv6 addresses or DHCP/autoconf, or the family
// disabled; routes (destination, next-hop-address, next-hop-interface,
// metric, the main table); dns-resolver servers and search domains. A
// config beyond it (another interface type, a field this package does not
// know, an interface without a MAC) is not converted: Unsupported says so,
// and that config applies only once the host's own OS runs. A value that
// cannot work (an address without a prefix, a route whose next hop is on
// none of its interface's networks) is an error naming it.
//
// With any keyfile in the initramfs, CoreOS removes the profiles
// NetworkManager would generate (DHCP on every NIC), so Fallback, a DHCP
// profile for every Ethernet device no MAC-bound profile takes, goes with
// them.
package nmkeyfile

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Dir is where the keyfiles go in the initramfs.
const Dir = "etc/coreos-firstboot-network"

// File is one keyfile.
type File struct {
	Name string // <config>_<interface>.nmconnection
	Data []byte
	// MAC is the NIC an Ethernet profile binds (lower case), "" for others.
	MAC string
}

// Unsupported is a config that is valid nmstate but uses what this package
// does not convert; its hosts get no network profile in the initramfs.
type Unsupported struct {
	Config string
	Why    string
}

func (u *Unsupported) Error() string {
	return fmt.Sprintf("NMStateConfig %s applies after boot only (%s): its hosts need DHCP to fetch the agent", u.Config, u.Why)
}

type document struct {
	Interfaces []iface      `json:"interfaces"`
	Routes     *routes      `json:"routes,omitempty"`
	DNS        *dnsResolver `json:"dns-resolver,omitempty"`
}

type iface struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	State       string `json:"state,omitempty"`
	Description string `json:"description,omitempty"`
	MACAddress  string `json:"mac-address,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	IPv4        *ip    `json:"ipv4,omitempty"`
	IPv6        *ip    `json:"ipv6,omitempty"`
	VLAN        *vlan  `json:"vlan,omitempty"`
}

type ip struct {
	Enabled  *bool     `json:"enabled,omitempty"`
	DHCP     bool      `json:"dhcp,omitempty"`
	Autoconf *bool     `json:"autoconf,omitempty"`
	Address  []address `json:"address,omitempty"`
}

type address struct {
	IP           string `json:"ip"`
	PrefixLength *int   `json:"prefix-length"`
}

type vlan struct {
	BaseIface string `json:"base-iface"`
	ID        int    `json:"id"`
}

type routes struct {
	Config []route `json:"config"`
}

type route struct {
	Destination      string `json:"destination"`
	NextHopAddress   string `json:"next-hop-address,omitempty"`
	NextHopInterface string `json:"next-hop-interface"`
	Metric           *int   `json:"metric,omitempty"`
	TableID          *int   `json:"table-id,omitempty"`
}

type dnsResolver struct {
	Config struct {
		Server []string `json:"server,omitempty"`
		Search []string `json:"search,omitempty"`
	} `json:"config"`
}

// Convert renders config's nmstate document (JSON), whose interface names
// macs maps to MAC addresses (spec.interfaces), as keyfiles. A document
// beyond the subset returns *Unsupported; a wrong one, an error naming
// what is wrong.
func Convert(config string, state []byte, macs map[string]string) ([]File, error) {
	wrong := func(format string, args ...any) error {
		return fmt.Errorf("NMStateConfig %s: %s", config, fmt.Sprintf(format, args...))
	}
	// Types first: a bond or bridge brings fields of its own, which the
	// strict decoding below would call unknown.
	var loose struct {
		Interfaces []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"interfaces"`
	}
	if err := json.Unmarshal(state, &loose); err != nil {
		return nil, wrong("config is not an nmstate document: %v", err)
	}
	for _, i := range loose.Interfaces {
		if i.Type != "ethernet" && i.Type != "vlan" {
			return nil, &Unsupported{Config: config, Why: fmt.Sprintf("interface %q has type %q; agentboot converts ethernet and vlan", i.Name, i.Type)}
		}
	}
	var doc document
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		// A field left out would silently change the network: the
		// config is left to the nmstate path after boot instead.
		return nil, &Unsupported{Config: config, Why: strings.TrimPrefix(err.Error(), "json: ")}
	}
	if len(doc.Interfaces) == 0 {
		return nil, wrong("config has no interfaces")
	}
	byName := map[string]*iface{}
	for k := range doc.Interfaces {
		i := &doc.Interfaces[k]
		if err := checkName(i.Name); err != nil {
			return nil, wrong("%v", err)
		}
		if byName[i.Name] != nil {
			return nil, wrong("interface %q is listed twice", i.Name)
		}
		byName[i.Name] = i
		if i.State != "" && i.State != "up" {
			return nil, &Unsupported{Config: config, Why: fmt.Sprintf("interface %q has state %q; agentboot converts interfaces that are up", i.Name, i.State)}
		}
		if i.MTU != 0 && (i.MTU < 576 || i.MTU > 65535) {
			return nil, wrong("interface %q: mtu %d is not between 576 and 65535", i.Name, i.MTU)
		}
	}
	conns := map[string]*conn{} // by interface name
	parseMAC := func(name, m string) (string, error) {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 {
			return "", wrong("interface %q: %q is not an Ethernet MAC address", name, m)
		}
		return strings.ToUpper(hw.String()), nil
	}
	mac := func(name string) (string, error) {
		var mapped, own string
		var err error
		if m := macs[name]; m != "" {
			if mapped, err = parseMAC(name, m); err != nil {
				return "", err
			}
		}
		if i := byName[name]; i != nil && i.MACAddress != "" {
			if own, err = parseMAC(name, i.MACAddress); err != nil {
				return "", err
			}
		}
		switch {
		case mapped != "" && own != "" && mapped != own:
			return "", wrong("interface %q has mac-address %s but spec.interfaces maps it to %s", name, own, mapped)
		case mapped == "" && own == "":
			// Bound by name only, it would apply to any host.
			return "", &Unsupported{Config: config, Why: fmt.Sprintf("interface %q has no MAC address in spec.interfaces", name)}
		}
		return cmp.Or(mapped, own), nil
	}
	ethernet := func(name string) (*conn, error) {
		if c := conns[name]; c != nil {
			return c, nil
		}
		m, err := mac(name)
		if err != nil {
			return nil, err
		}
		for other, oc := range conns {
			if oc.mac == m {
				// Two profiles for one NIC: NetworkManager would pick either.
				return nil, &Unsupported{Config: config, Why: fmt.Sprintf("interfaces %q and %q have the same MAC %s", other, name, m)}
			}
		}
		c := newConn(config, name, "ethernet")
		c.mac = m
		conns[name] = c
		return c, nil
	}
	for k := range doc.Interfaces {
		i := &doc.Interfaces[k]
		var c *conn
		switch i.Type {
		case "ethernet":
			if i.VLAN != nil {
				return nil, wrong("interface %q is ethernet but has a vlan section", i.Name)
			}
			var err error
			if c, err = ethernet(i.Name); err != nil {
				return nil, err
			}
		case "vlan":
			if i.VLAN == nil || i.VLAN.BaseIface == "" {
				return nil, wrong("vlan interface %q needs vlan.base-iface and vlan.id", i.Name)
			}
			if err := checkName(i.VLAN.BaseIface); err != nil {
				return nil, wrong("vlan interface %q: base-iface: %v", i.Name, err)
			}
			if i.VLAN.ID < 1 || i.VLAN.ID > 4094 {
				return nil, wrong("vlan interface %q: id %d is not between 1 and 4094", i.Name, i.VLAN.ID)
			}
			if b := byName[i.VLAN.BaseIface]; b != nil && b.Type != "ethernet" {
				return nil, wrong("vlan interface %q: its base %q is a %s, not an ethernet interface", i.Name, i.VLAN.BaseIface, b.Type)
			}
			if i.MACAddress != "" {
				return nil, wrong("vlan interface %q: mac-address is for ethernet interfaces", i.Name)
			}
			c = newConn(config, i.Name, "vlan")
			c.vlanID, c.parentName = i.VLAN.ID, i.VLAN.BaseIface
			conns[i.Name] = c
		}
		c.mtu = i.MTU
		var err error
		if c.v4, err = family(i.Name, "ipv4", i.IPv4, false); errors.Is(err, errNothingToDo) {
			return nil, &Unsupported{Config: config, Why: fmt.Sprintf("interface %q: ipv4 has no address or dhcp", i.Name)}
		} else if err != nil {
			return nil, wrong("%v", err)
		}
		if c.v6, err = family(i.Name, "ipv6", i.IPv6, true); errors.Is(err, errNothingToDo) {
			return nil, &Unsupported{Config: config, Why: fmt.Sprintf("interface %q: ipv6 has no address, dhcp or autoconf", i.Name)}
		} else if err != nil {
			return nil, wrong("%v", err)
		}
	}
	// A VLAN's base interface that the document names only in
	// spec.interfaces carries no addresses of its own.
	for _, c := range sortedConns(conns) {
		if c.kind != "vlan" {
			continue
		}
		base, err := ethernet(c.parentName)
		if err != nil {
			return nil, err
		}
		c.parentUUID = base.uuid
	}
	if doc.Routes != nil {
		for n, r := range doc.Routes.Config {
			var u *Unsupported
			if err := addRoute(conns, r); errors.As(err, &u) {
				u.Config = config
				return nil, u
			} else if err != nil {
				return nil, wrong("routes.config[%d]: %v", n, err)
			}
		}
	}
	if doc.DNS != nil {
		var u *Unsupported
		if err := addDNS(conns, doc.DNS.Config.Server, doc.DNS.Config.Search); errors.As(err, &u) {
			u.Config = config
			return nil, u
		} else if err != nil {
			return nil, wrong("dns-resolver: %v", err)
		}
	}
	var files []File
	for _, c := range sortedConns(conns) {
		data := c.render()
		if err := checkRendered(data); err != nil {
			return nil, wrong("interface %q: %v", c.iface, err)
		}
		files = append(files, File{Name: fileName(config, c.iface), Data: data, MAC: strings.ToLower(c.mac)})
	}
	return files, nil
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	domainRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$`)
)

func checkName(name string) error {
	if !nameRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("interface name %q: want 1 to 15 letters, digits, '.', '-' or '_'", name)
	}
	return nil
}

// fileName is the keyfile's name, <config>_<interface>: a Kubernetes name
// has no '_', so no two pairs share one, and neither has a path separator.
// A name too long for a file is shortened with a digest of the whole.
func fileName(config, name string) string {
	f := config + "_" + name
	if len(f) > 200 {
		h := sha256.Sum256([]byte(f))
		f = fmt.Sprintf("%s-%x_%s", config[:min(len(config), 150)], h[:6], name)
	}
	return f + ".nmconnection"
}

// FallbackName is the file of the Fallback profile; no config's file can
// have its name (theirs hold a '_').
const FallbackName = "agentboot-dhcp.nmconnection"

// Fallback is DHCP (and IPv6 autoconfiguration) on every Ethernet device
// no MAC-bound profile takes: the hosts an image carries no config for,
// and the other NICs of those it does. Its lower autoconnect priority
// leaves a device to its own profile.
func Fallback() File {
	return File{Name: FallbackName, Data: []byte("[connection]\nid=agentboot-dhcp\nuuid=" + uuidFor("", "agentboot-dhcp") +
		"\ntype=ethernet\nautoconnect=true\nautoconnect-priority=-100\nmulti-connect=3\n\n[ipv4]\nmethod=auto\n\n[ipv6]\nmethod=auto\n")}
}

// conn is one NetworkManager connection profile.
type conn struct {
	id, uuid, iface, kind string
	mac                   string // ethernet: the MAC it matches
	mtu                   int
	vlanID                int
	parentName            string
	parentUUID            string
	v4, v6                *familyConfig
}

type familyConfig struct {
	method    string // manual, auto, disabled
	addresses []netip.Prefix
	gateway   netip.Addr
	routes    []routeEntry
	dns       []netip.Addr
	search    []string
}

type routeEntry struct {
	dst    netip.Prefix
	via    netip.Addr
	metric *int
}

func newConn(config, name, kind string) *conn {
	return &conn{id: config + "-" + name, uuid: uuidFor(config, name), iface: name, kind: kind,
		v4: &familyConfig{method: "disabled"}, v6: &familyConfig{method: "disabled"}}
}

// uuidFor is a stable UUID for the profile, so that a VLAN names its parent
// and the same config always renders the same bytes.
func uuidFor(config, name string) string {
	h := sha256.Sum256([]byte("agentboot-nmstate/" + config + "/" + name))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func isTrue(b *bool) bool { return b != nil && *b }

// errNothingToDo is a family section that neither disables it nor gives
// an address, DHCP or (IPv6) autoconf — IPv4 enabled with nothing, or no
// "enabled" at all — which nmstate fills from the interface's current
// state: nothing to convert.
var errNothingToDo = errors.New("no address, dhcp or autoconf")

func family(name, fam string, cfg *ip, six bool) (*familyConfig, error) {
	f := &familyConfig{method: "disabled"}
	if cfg == nil || (cfg.Enabled != nil && !*cfg.Enabled) {
		if cfg != nil && (cfg.DHCP || isTrue(cfg.Autoconf) || len(cfg.Address) > 0) {
			return nil, fmt.Errorf("interface %q: %s is disabled but has dhcp, autoconf or addresses", name, fam)
		}
		return f, nil
	}
	if cfg.Enabled == nil && !cfg.DHCP && !isTrue(cfg.Autoconf) && len(cfg.Address) == 0 {
		return nil, errNothingToDo // nmstate keeps the interface's current state
	}
	// Without enabled, dhcp, autoconf or an address enable the family, as
	// in nmstate.
	if cfg.Autoconf != nil && !six {
		return nil, fmt.Errorf("interface %q: autoconf is an ipv6 setting", name)
	}
	switch {
	case six && cfg.DHCP && cfg.Autoconf != nil && !*cfg.Autoconf:
		f.method = "dhcp" // DHCPv6 without router advertisements' addresses
	case cfg.DHCP || isTrue(cfg.Autoconf):
		f.method = "auto"
	case len(cfg.Address) > 0:
		f.method = "manual"
	case six:
		f.method = "link-local" // nmstate: IPv6 enabled, no address: link-local only
	default:
		return nil, errNothingToDo
	}
	for n, a := range cfg.Address {
		addr, err := netip.ParseAddr(a.IP)
		if err != nil || addr.Is4() == six || addr.Zone() != "" || addr.Is4In6() {
			return nil, fmt.Errorf("interface %q: %s.address[%d].ip %q is not an %s address", name, fam, n, a.IP, map[bool]string{false: "IPv4", true: "IPv6"}[six])
		}
		if a.PrefixLength == nil {
			return nil, fmt.Errorf("interface %q: %s.address[%d] (%s) has no prefix-length", name, fam, n, a.IP)
		}
		if _, err := addr.Prefix(*a.PrefixLength); err != nil || *a.PrefixLength < 1 {
			return nil, fmt.Errorf("interface %q: %s.address[%d]: prefix-length %d does not fit %s", name, fam, n, *a.PrefixLength, a.IP)
		}
		f.addresses = append(f.addresses, netip.PrefixFrom(addr, *a.PrefixLength))
	}
	return f, nil
}

func addRoute(conns map[string]*conn, r route) error {
	if r.TableID != nil && *r.TableID != 0 && *r.TableID != 254 {
		return &Unsupported{Why: fmt.Sprintf("a route in table %d; agentboot converts routes of the main table", *r.TableID)}
	}
	dst, err := netip.ParsePrefix(r.Destination)
	if err != nil {
		return fmt.Errorf("destination %q is not an address with a prefix length (0.0.0.0/0 for the default route)", r.Destination)
	}
	if dst.Masked() != dst {
		return fmt.Errorf("destination %s has host bits set (%s?)", dst, dst.Masked())
	}
	c := conns[r.NextHopInterface]
	if c == nil {
		// nmstate routes through the interface as it is: nothing to bind.
		return &Unsupported{Why: fmt.Sprintf("a route through %q, an interface the config does not configure", r.NextHopInterface)}
	}
	f, fam := c.v4, "ipv4"
	if dst.Addr().Is6() {
		f, fam = c.v6, "ipv6"
	}
	if f.method == "disabled" {
		return fmt.Errorf("route to %s leaves through %q, whose %s is disabled", dst, c.iface, fam)
	}
	e := routeEntry{dst: dst, metric: r.Metric}
	if r.NextHopAddress != "" {
		via, err := netip.ParseAddr(r.NextHopAddress)
		if err != nil || via.Is4() != dst.Addr().Is4() || via.Zone() != "" {
			return fmt.Errorf("next-hop-address %q is not an address of the destination's family", r.NextHopAddress)
		}
		e.via = via
		// With static addresses only, a next hop outside every one of the
		// interface's networks is unreachable: the host would boot and never
		// reach the image service.
		if f.method == "manual" && !slices.ContainsFunc(f.addresses, func(p netip.Prefix) bool { return p.Masked().Contains(via) }) {
			return fmt.Errorf("next hop %s is on none of %s's networks (%s)", via, c.iface, prefixes(f.addresses))
		}
	}
	if r.Metric != nil && (*r.Metric < 0 || *r.Metric > 1<<31-1) {
		return fmt.Errorf("metric %d is out of range", *r.Metric)
	}
	if dst.Bits() == 0 && e.via.IsValid() && e.metric == nil && !f.gateway.IsValid() {
		f.gateway = e.via
		return nil
	}
	f.routes = append(f.routes, e)
	return nil
}

func prefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// addDNS puts the servers of each family on the profiles of that family
// that carry a default route, or else on every profile configuring it.
func addDNS(conns map[string]*conn, servers, search []string) error {
	var v4, v6 []netip.Addr
	for n, s := range servers {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return fmt.Errorf("config.server[%d] %q is not an IP address", n, s)
		}
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	for n, d := range search {
		if !domainRE.MatchString(d) || len(d) > 253 {
			return fmt.Errorf("config.search[%d] %q is not a domain name", n, d)
		}
	}
	place := func(get func(*conn) *familyConfig, addrs []netip.Addr) error {
		if len(addrs) == 0 && len(search) == 0 {
			return nil
		}
		var withDefault, enabled []*familyConfig
		for _, c := range sortedConns(conns) {
			f := get(c)
			if f.method == "disabled" {
				continue
			}
			enabled = append(enabled, f)
			if f.gateway.IsValid() || slices.ContainsFunc(f.routes, func(r routeEntry) bool { return r.dst.Bits() == 0 }) {
				withDefault = append(withDefault, f)
			}
		}
		targets := withDefault
		if len(targets) == 0 {
			targets = enabled
		}
		if len(targets) == 0 && len(addrs) > 0 {
			return &Unsupported{Why: "DNS servers of a family no interface of the config configures"}
		}
		for _, f := range targets {
			f.dns, f.search = addrs, search
		}
		return nil
	}
	if err := place(func(c *conn) *familyConfig { return c.v4 }, v4); err != nil {
		return err
	}
	return place(func(c *conn) *familyConfig { return c.v6 }, v6)
}

func sortedConns(m map[string]*conn) []*conn {
	out := make([]*conn, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].iface < out[j].iface })
	return out
}

var keyfileLine = regexp.MustCompile(`^$|^\[[a-z0-9-]+\]$|^[a-z0-9-]+=[^\x00-\x1f\x7f]*$`)

// checkRendered refuses a keyfile with a line that is no section header or
// key=value, or a section twice: what a value smuggling a line break into
// the file would make. Values are checked where they are read; this keeps
// a slip there from binding a profile to every host.
func checkRendered(data []byte) error {
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if !keyfileLine.MatchString(line) {
			return fmt.Errorf("keyfile line %q is not one NetworkManager reads", line)
		}
		if strings.HasPrefix(line, "[") {
			if seen[line] {
				return fmt.Errorf("keyfile section %s twice", line)
			}
			seen[line] = true
		}
	}
	return nil
}

// render writes the profile in NetworkManager's keyfile format.
func (c *conn) render() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "[connection]\nid=%s\nuuid=%s\ntype=%s\nautoconnect=true\n", c.id, c.uuid, c.kind)
	if c.kind == "vlan" {
		fmt.Fprintf(&b, "interface-name=%s\n", c.iface)
	}
	switch c.kind {
	case "ethernet":
		fmt.Fprintf(&b, "\n[ethernet]\nmac-address=%s\n", c.mac)
		if c.mtu > 0 {
			fmt.Fprintf(&b, "mtu=%d\n", c.mtu)
		}
	case "vlan":
		// NetworkManager has no vlan.mtu: a VLAN's MTU is its wired
		// setting's.
		if c.mtu > 0 {
			fmt.Fprintf(&b, "\n[ethernet]\nmtu=%d\n", c.mtu)
		}
		fmt.Fprintf(&b, "\n[vlan]\nid=%d\nparent=%s\n", c.vlanID, c.parentUUID)
	}
	for _, f := range []struct {
		name string
		cfg  *familyConfig
	}{{"ipv4", c.v4}, {"ipv6", c.v6}} {
		fmt.Fprintf(&b, "\n[%s]\nmethod=%s\n", f.name, f.cfg.method)
		for n, a := range f.cfg.addresses {
			fmt.Fprintf(&b, "address%d=%s\n", n+1, a)
		}
		if f.cfg.gateway.IsValid() {
			fmt.Fprintf(&b, "gateway=%s\n", f.cfg.gateway)
		}
		for n, r := range f.cfg.routes {
			fmt.Fprintf(&b, "route%d=%s", n+1, r.dst)
			if r.via.IsValid() || r.metric != nil {
				// The unspecified address is "no gateway", as
				// NetworkManager writes it.
				via := netip.IPv4Unspecified()
				if r.dst.Addr().Is6() {
					via = netip.IPv6Unspecified()
				}
				if r.via.IsValid() {
					via = r.via
				}
				fmt.Fprintf(&b, ",%s", via)
			}
			if r.metric != nil {
				fmt.Fprintf(&b, ",%d", *r.metric)
			}
			b.WriteString("\n")
		}
		if len(f.cfg.dns) > 0 {
			b.WriteString("dns=")
			for _, d := range f.cfg.dns {
				fmt.Fprintf(&b, "%s;", d)
			}
			b.WriteString("\n")
		}
		if len(f.cfg.search) > 0 {
			fmt.Fprintf(&b, "dns-search=%s;\n", strings.Join(f.cfg.search, ";"))
		}
	}
	return []byte(b.String())
}
