// Package address parses BareMetalHost BMC addresses (metal3's syntax) into
// what the driver needs: the protocol, the endpoint and whether the BMC can
// boot the host from virtual media.
package address

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Protocol is how agentboot talks to a BMC.
type Protocol string

// Protocols.
const (
	IPMI    Protocol = "ipmi"
	Redfish Protocol = "redfish"
)

// Address is a parsed BMC address.
type Address struct {
	// Scheme as written, such as redfish-virtualmedia+http.
	Scheme   string
	Protocol Protocol
	// VirtualMedia is true for the *-virtualmedia schemes: the host boots
	// the InfraEnv ISO as a virtual CD; otherwise it network-boots.
	VirtualMedia bool
	// Host is a name or an IP address (without brackets).
	Host string
	// Port is the BMC's port: 623 for IPMI, 443 or 80 for Redfish unless
	// the address says otherwise.
	Port int
	// HTTPS is false only for the +http Redfish schemes.
	HTTPS bool
	// SystemID is the last element of a /redfish/v1/Systems/<id> path.
	SystemID string
}

// Endpoint is host:port.
func (a Address) Endpoint() string {
	return net.JoinHostPort(a.Host, strconv.Itoa(a.Port))
}

// BaseURL is the Redfish service's scheme://host (without the port).
func (a Address) BaseURL() string {
	scheme := "https"
	if !a.HTTPS {
		scheme = "http"
	}
	h := a.Host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	return scheme + "://" + h
}

// schemes maps each supported base scheme to its protocol and whether it
// boots from virtual media.
var schemes = map[string]struct {
	protocol     Protocol
	virtualMedia bool
}{
	"ipmi":                 {IPMI, false},
	"redfish":              {Redfish, false},
	"redfish-virtualmedia": {Redfish, true},
	"idrac-virtualmedia":   {Redfish, true},
	"ilo5-virtualmedia":    {Redfish, true},
}

// Supported lists the accepted schemes, for error messages and docs.
const Supported = "ipmi://, redfish://, redfish-virtualmedia://, idrac-virtualmedia://, ilo5-virtualmedia:// (Redfish ones with optional +http or +https)"

// Parse reads a BareMetalHost spec.bmc.address. An address without a
// scheme is IPMI, as in metal3.
func Parse(s string) (Address, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Address{}, fmt.Errorf("BMC address is empty")
	}
	if !strings.Contains(s, "://") {
		s = "ipmi://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return Address{}, fmt.Errorf("BMC address is not a URL: %w", unwrapURL(err))
	}
	if u.User != nil {
		return Address{}, fmt.Errorf("BMC address must not contain credentials: put them in the Secret named by credentialsName")
	}
	base, transport, _ := strings.Cut(u.Scheme, "+")
	kind, ok := schemes[base]
	if !ok {
		return Address{}, fmt.Errorf("unknown BMC address scheme %q: supported are %s", u.Scheme, Supported)
	}
	a := Address{Scheme: u.Scheme, Protocol: kind.protocol, VirtualMedia: kind.virtualMedia, HTTPS: true}
	switch {
	case transport == "":
	case kind.protocol == IPMI:
		return Address{}, fmt.Errorf("BMC address scheme %q: ipmi takes no +%s", u.Scheme, transport)
	case transport == "http":
		a.HTTPS = false
	case transport == "https":
	default:
		return Address{}, fmt.Errorf("BMC address scheme %q: unknown transport +%s (use +http or +https)", u.Scheme, transport)
	}
	if a.Host = u.Hostname(); a.Host == "" {
		return Address{}, fmt.Errorf("BMC address %q has no host", s)
	}
	if strings.ContainsAny(a.Host, " \t/\\") {
		return Address{}, fmt.Errorf("BMC address %q: %q is not a host name", s, a.Host)
	}
	if strings.HasPrefix(u.Host, "[") {
		if _, err := netip.ParseAddr(a.Host); err != nil {
			return Address{}, fmt.Errorf("BMC address %q: %q is not an IPv6 address", s, a.Host)
		}
	}
	switch p := u.Port(); {
	case p != "":
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Address{}, fmt.Errorf("BMC address %q: port %q is not 1-65535", s, p)
		}
		a.Port = n
	case a.Protocol == IPMI:
		a.Port = 623
	case a.HTTPS:
		a.Port = 443
	default:
		a.Port = 80
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Address{}, fmt.Errorf("BMC address %q: a query or fragment is not allowed", s)
	}
	path := strings.TrimSuffix(u.Path, "/")
	switch {
	case path == "":
	case a.Protocol == IPMI:
		return Address{}, fmt.Errorf("BMC address %q: an ipmi address takes no path", s)
	default:
		rest, ok := strings.CutPrefix(path, "/redfish/v1/Systems/")
		if !ok || rest == "" || strings.Contains(rest, "/") {
			return Address{}, fmt.Errorf("BMC address %q: the path must be /redfish/v1/Systems/<id>", s)
		}
		a.SystemID = rest
	}
	return a, nil
}

// unwrapURL drops url.Error's repetition of the whole input.
func unwrapURL(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}
