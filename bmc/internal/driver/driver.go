// Package driver talks to BMCs through bmclib: IPMI through its ipmitool
// provider, Redfish (power, boot override, virtual media) through its gofish
// provider. It puts a deadline on every call, normalises what BMCs answer and
// keeps the password out of every error it returns.
package driver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/go-logr/logr"
	"github.com/stmcginnis/gofish/common"

	"github.com/agentboot/agentboot/bmc/internal/address"
)

// Credentials log in to a BMC.
type Credentials struct {
	Username string
	Password string
}

// Options tune how a BMC is driven.
type Options struct {
	// InsecureTLS skips verification of a Redfish BMC's certificate
	// (spec.bmc.disableCertificateVerification).
	InsecureTLS bool
	// RootCAs verify Redfish BMCs; nil means the system pool. The
	// reconciler sets the CA of the BMC's credentials Secret (ca.crt).
	RootCAs *x509.CertPool
	// Pins are the addresses the BMC's name was resolved to and checked at
	// (--bmc-networks), in the resolver's order: every connection goes to
	// the first that answers, so a name that resolves elsewhere at connect
	// time (DNS rebinding) reaches nothing new. Empty dials the name.
	Pins []netip.Addr
	// CallTimeout bounds each power and boot call (30s by default).
	CallTimeout time.Duration
	// MediaTimeout bounds each virtual media call (2m by default: the BMC
	// may fetch the image's first blocks before answering).
	MediaTimeout time.Duration
	// IPMITool is the ipmitool binary ("ipmitool" on PATH by default).
	IPMITool string
}

func (o *Options) defaults() {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 30 * time.Second
	}
	if o.MediaTimeout <= 0 {
		o.MediaTimeout = 2 * time.Minute
	}
	if o.IPMITool == "" {
		o.IPMITool = "ipmitool"
	}
}

// Device is a one-time boot target.
type Device string

// Boot targets, as bmclib names them.
const (
	PXE   Device = "pxe"
	CDROM Device = "cdrom"
	Disk  Device = "disk"
)

// Power is a power state as a BMC reports it.
type Power string

// Power states. IPMI reports only On and Off; Redfish BMCs may report the
// transitions.
const (
	On          Power = "on"
	Off         Power = "off"
	PoweringOn  Power = "powering on"
	PoweringOff Power = "powering off"
)

// IsOn is what status.poweredOn says: a host powering off is on until it
// is off.
func (p Power) IsOn() bool { return p == On || p == PoweringOff }

// Settled is true when no transition is reported.
func (p Power) Settled() bool { return p == On || p == Off }

// ErrBusy is a request the BMC refused because it is busy, mostly with a
// power transition (Redfish 409 Conflict, IPMI "Node busy"): nothing was
// done, ask again later.
var ErrBusy = errors.New("the BMC is busy (it did nothing; ask again later)")

// ErrUnsupported is a request the BMC does not offer (a Redfish reset type
// missing from its allowable values, 400/405/501; an IPMI command it
// rejects as invalid): asking again will not help.
var ErrUnsupported = errors.New("the BMC does not offer this request")

// Override is the boot override a BMC reports.
type Override struct {
	Device Device
	// Persistent is true for an override kept for every boot (Redfish
	// Continuous), which some BMCs report for a one-time request.
	Persistent bool
	// UEFI is true when the BMC reports the override's mode as UEFI (false
	// for Legacy, and for a BMC that does not report the mode).
	UEFI bool
}

// BMC is an open session with one BMC. It is not safe for concurrent use:
// the caller serialises operations per BMC.
//
// The power calls only send: a BMC that accepted a request may take
// seconds to report the new state, and the caller confirms it by reading
// PowerState. An error means the BMC refused the request (or could not be
// asked); ErrBusy (errors.Is) that it was in a transition.
type BMC interface {
	// PowerState reads the power state.
	PowerState(ctx context.Context) (Power, error)
	// PowerOn asks for the host to be on.
	PowerOn(ctx context.Context) error
	// PowerOff asks for the host to be off: soft asks the OS to shut down
	// (Redfish GracefulShutdown, IPMI chassis power soft), otherwise the
	// power is cut.
	PowerOff(ctx context.Context, soft bool) error
	// Reset forces a host that is on to restart.
	Reset(ctx context.Context) error
	// SetOneTimeBoot makes the next boot use dev.
	SetOneTimeBoot(ctx context.Context, dev Device, efi bool) error
	// BootOverride reads the pending boot override; ok is false when the
	// BMC cannot report it (IPMI).
	BootOverride(ctx context.Context) (ov Override, ok bool, err error)
	// InsertMedia mounts the ISO at url as a virtual CD (ejecting first).
	InsertMedia(ctx context.Context, url string) error
	// EjectMedia unmounts the virtual CD.
	EjectMedia(ctx context.Context) error
	// Close ends the session.
	Close()
}

// Open connects to the BMC at a.
func Open(ctx context.Context, a address.Address, c Credentials, o Options) (BMC, error) {
	o.defaults()
	if c.Username == "" || c.Password == "" {
		return nil, errors.New("the credentials Secret needs both username and password")
	}
	var opts = []bmclib.Option{
		bmclib.WithLogger(logr.Discard()), // bmclib logs requests; nothing of it may reach our logs
		bmclib.WithPerProviderTimeout(o.CallTimeout),
	}
	provider := "gofish"
	host := a.Host
	if len(o.Pins) > 0 {
		host = o.Pins[0].String() // ipmitool takes one address
	}
	switch a.Protocol {
	case address.IPMI:
		path, err := exec.LookPath(o.IPMITool)
		if err != nil {
			return nil, fmt.Errorf("ipmi:// needs ipmitool, which is not installed (%s not found)", o.IPMITool)
		}
		provider = "ipmitool"
		opts = append(opts, bmclib.WithIpmitoolPort(fmt.Sprint(a.Port)), bmclib.WithIpmitoolPath(path))
	case address.Redfish:
		host = a.BaseURL()
		// Basic auth: stateless, so no Redfish session to leak or exhaust
		// when a call times out; every Redfish service must accept it.
		opts = append(opts, bmclib.WithRedfishPort(fmt.Sprint(a.Port)), bmclib.WithRedfishUseBasicAuth(true),
			bmclib.WithHTTPClient(redfishClient(o)))
	default:
		return nil, fmt.Errorf("unsupported BMC protocol %q", a.Protocol)
	}
	cl := bmclib.NewClient(host, c.Username, c.Password, opts...)
	cl.Registry.Drivers = cl.Registry.For(provider)
	if len(cl.Registry.Drivers) == 0 {
		return nil, fmt.Errorf("bmclib has no %s provider", provider)
	}
	b := &session{c: cl, secret: c.Password, o: o, redfish: a.Protocol == address.Redfish}
	ctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
	defer cancel()
	register()
	start := time.Now()
	if err := cl.Open(ctx); err != nil {
		err = b.fail("connect", err)
		observe(opConnect, string(a.Protocol), start, err)
		return nil, err
	}
	observe(opConnect, string(a.Protocol), start, nil)
	return measured{BMC: b, protocol: string(a.Protocol)}, nil
}

// MaxAnswerBytes bounds what one connection to a Redfish BMC may carry to
// the manager: the TLS handshake, the headers and the body of one answer
// (keep-alives are off, so a connection carries one). A Redfish answer is
// kilobytes; a BMC answering gigabytes used to grow the manager by as much.
const MaxAnswerBytes = 8 << 20

// ErrAnswerTooLarge is what a call gets when the BMC's answer passes
// MaxAnswerBytes: the connection is closed and nothing more is read.
var ErrAnswerTooLarge = fmt.Errorf("the BMC's answer is larger than %d MiB (a Redfish answer is kilobytes): not read", MaxAnswerBytes>>20)

// redfishClient is the HTTP client of one Redfish session: connections to
// the pinned address, each read up to MaxAnswerBytes, certificates checked
// against o.RootCAs unless the BareMetalHost disables verification, no
// proxy from the environment. (bmclib clones the *http.Transport for its
// providers; the dialler and TLS settings go with it.)
func redfishClient(o Options) *http.Client {
	dialer := &net.Dialer{Timeout: o.CallTimeout}
	return &http.Client{
		Timeout: o.MediaTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				targets := []string{addr}
				if len(o.Pins) > 0 {
					_, port, err := net.SplitHostPort(addr)
					if err != nil {
						return nil, err
					}
					targets = targets[:0]
					for _, ip := range o.Pins {
						targets = append(targets, net.JoinHostPort(ip.String(), port))
					}
				}
				var errs []error
				for _, t := range targets {
					conn, err := dialer.DialContext(ctx, network, t)
					if err == nil {
						return &boundedConn{Conn: conn, left: MaxAnswerBytes}, nil
					}
					errs = append(errs, err)
				}
				return nil, errors.Join(errs...)
			},
			TLSClientConfig:        &tls.Config{RootCAs: o.RootCAs, InsecureSkipVerify: o.InsecureTLS, MinVersion: tls.VersionTLS12}, //nolint:gosec // the BareMetalHost's own choice
			TLSHandshakeTimeout:    o.CallTimeout,
			ResponseHeaderTimeout:  o.MediaTimeout,
			MaxResponseHeaderBytes: 64 << 10,
			DisableKeepAlives:      true,
		},
	}
}

// boundedConn fails every read past its budget.
type boundedConn struct {
	net.Conn
	left int64
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, ErrAnswerTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	return n, err
}

type session struct {
	c       *bmclib.Client
	secret  string
	o       Options
	redfish bool
}

func (s *session) PowerState(ctx context.Context) (Power, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.CallTimeout)
	defer cancel()
	raw, err := s.c.GetPowerState(ctx)
	if err != nil {
		return "", s.fail("read power state", err)
	}
	return ParsePowerState(raw)
}

func (s *session) PowerOn(ctx context.Context) error { return s.power(ctx, "on") }

func (s *session) PowerOff(ctx context.Context, soft bool) error {
	if soft {
		return s.power(ctx, "soft")
	}
	return s.power(ctx, "off")
}

// Reset is a forced restart. On Redfish that is bmclib's "cycle"
// (ResetType ForceRestart, which every BMC offers), not its "reset": that
// one asks for PowerCycle, which iLO does not offer, and falls back to a
// graceful shutdown, ten seconds of polling and a power-on the BMC may
// drop. On IPMI it is "chassis power reset".
func (s *session) Reset(ctx context.Context) error {
	if s.redfish {
		return s.power(ctx, "cycle")
	}
	return s.power(ctx, "reset")
}

func (s *session) power(ctx context.Context, state string) error {
	ctx, cancel := context.WithTimeout(ctx, s.o.CallTimeout)
	defer cancel()
	ok, err := s.c.SetPowerState(ctx, state)
	if err != nil && state == "soft" && s.redfish && s.sentUnconfirmed() {
		// bmclib's Redfish provider answers ok=false without an error
		// after the BMC accepted a GracefulShutdown: the OS decides when
		// it is done, and only the power state can tell.
		return nil
	}
	if err != nil && unsupported(err) {
		return fmt.Errorf("%w: set power %s: %s", ErrUnsupported, state, Scrub(err.Error(), s.secret))
	}
	return s.result("set power "+state, ok, err)
}

// unsupported tells a request the BMC does not offer from one that failed:
// gofish refuses a reset type the System does not list; a Redfish service
// answers 400, 405 or 501 to one it lacks; ipmitool prints the completion
// code of a command the BMC rejects.
func unsupported(err error) bool {
	var rf *common.Error
	if errors.As(err, &rf) {
		switch rf.HTTPReturnedStatusCode {
		case http.StatusMethodNotAllowed, http.StatusNotImplemented:
			return true
		case http.StatusBadRequest:
			// Only a 400 that says so: iLO answers 400 too while the
			// system is not ready (InvalidOperationForSystemState).
			raw := rf.Code + " " + rf.Message
			for _, e := range rf.ExtendedInfos {
				raw += " " + e.MessageID
			}
			return strings.Contains(raw, "NotSupported") || strings.Contains(raw, "PropertyValueNotInList")
		}
	}
	msg := err.Error()
	for _, s := range []string{"is not supported by this service", "Invalid command", "Command not supported", "Invalid data field"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// sentUnconfirmed is true when the last bmclib call reached its provider
// and the provider returned no error of its own, only ok=false.
func (s *session) sentUnconfirmed() bool {
	md := s.c.GetMetadata()
	return len(md.ProvidersAttempted) > 0 && len(md.FailedProviderDetail) == 0
}

func (s *session) SetOneTimeBoot(ctx context.Context, dev Device, efi bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.o.CallTimeout)
	defer cancel()
	ok, err := s.c.SetBootDevice(ctx, string(dev), false, efi)
	return s.result("set one-time boot to "+string(dev), ok, err)
}

func (s *session) BootOverride(ctx context.Context) (Override, bool, error) {
	if !s.redfish {
		return Override{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.CallTimeout)
	defer cancel()
	ov, err := s.c.GetBootDeviceOverride(ctx)
	if err != nil {
		return Override{}, false, s.fail("read boot override", err)
	}
	return Override{Device: Device(ov.Device), Persistent: ov.IsPersistent, UEFI: ov.IsEFIBoot}, true, nil
}

func (s *session) InsertMedia(ctx context.Context, url string) error {
	if !s.redfish {
		return errors.New("virtual media needs a Redfish BMC")
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.MediaTimeout)
	defer cancel()
	ok, err := s.c.SetVirtualMedia(ctx, "CD", url)
	return s.result("insert virtual media", ok, err)
}

func (s *session) EjectMedia(ctx context.Context) error {
	if !s.redfish {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.MediaTimeout)
	defer cancel()
	ok, err := s.c.SetVirtualMedia(ctx, "CD", "")
	return s.result("eject virtual media", ok, err)
}

func (s *session) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), s.o.CallTimeout)
	defer cancel()
	_ = s.c.Close(ctx) // basic auth and ipmitool hold no session; nothing to report
}

func (s *session) result(op string, ok bool, err error) error {
	if err != nil {
		return s.fail(op, err)
	}
	if !ok {
		return fmt.Errorf("%s: the BMC did not confirm it", op)
	}
	return nil
}

// busy tells a request the BMC refused because it is in a transition,
// having done nothing: Redfish 409 Conflict, or IPMI completion code 0xC0 as
// ipmitool prints it.
func busy(err error) bool {
	var rf *common.Error
	if errors.As(err, &rf) && rf.HTTPReturnedStatusCode == http.StatusConflict {
		return true
	}
	return strings.Contains(err.Error(), "Node busy")
}

// fail flattens bmclib's multi-line provider errors into one line and
// removes the password wherever a provider echoed it.
func (s *session) fail(op string, err error) error {
	msg := Scrub(err.Error(), s.secret)
	switch {
	case strings.Contains(msg, "401") || strings.Contains(strings.ToLower(msg), "unauthorized"):
		return fmt.Errorf("%s: the BMC rejected the username or password: %s", op, msg)
	case busy(err):
		return fmt.Errorf("%w: %s: %s", ErrBusy, op, msg)
	case strings.Contains(msg, "Unable to establish IPMI v2"):
		// ipmitool says the same for a wrong password and for silence.
		return fmt.Errorf("%s: no IPMI session (a wrong username or password, a BMC that is down, or UDP blocked): %s", op, msg)
	}
	return fmt.Errorf("%s: %s", op, msg)
}

// Scrub makes a BMC error fit for a status message: one line, the secret
// replaced.
func Scrub(msg, secret string) string {
	if secret != "" {
		msg = strings.ReplaceAll(msg, secret, "***")
	}
	var parts []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "*")); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// ParsePowerState normalises the power state BMCs report: ipmitool prints
// "Chassis Power is on", Redfish says On, Off, PoweringOn or PoweringOff.
func ParsePowerState(raw string) (Power, error) {
	f := strings.Fields(strings.ToLower(raw))
	if len(f) == 0 {
		return "", errors.New("the BMC reported an empty power state")
	}
	switch f[len(f)-1] {
	case "on":
		return On, nil
	case "off":
		return Off, nil
	case "poweringon":
		return PoweringOn, nil
	case "poweringoff":
		return PoweringOff, nil
	}
	return "", fmt.Errorf("the BMC reported an unknown power state %q", strings.TrimSpace(raw))
}
