package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/agentboot/agentboot/pxe"
)

// pxeFlags are the PXE service's settings. `agentboot pxe` registers them
// as they are; `agentboot dev` with a "pxe-" prefix.
type pxeFlags struct {
	relays                               string
	newClientRate                        float64
	newClientBurst                       int
	iface, serverIP, mode, bootScriptURL string
	tftpDir, tftpAddr, httpAddr          string
	tftpSinglePort                       bool
	biosBinary, efiBinary, arm64Binary   string
	pool, router, dns, leaseFile         string
	prefixLen                            int
	leaseTime                            time.Duration
	metricsTokenFile                     string
	observationsURL, observationsCAFile  string
	observationsTokenFile                string
	reservations                         stringList
	secureBoot                           bool
	shimBinary, signedGRUBBinary         string
}

// Where Debian's shim-signed and grub-efi-amd64-signed put the binaries of
// the Secure Boot path.
const (
	defaultShim       = "/usr/lib/shim/shimx64.efi.signed"
	defaultSignedGRUB = "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed"
)

func (p *pxeFlags) register(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&p.iface, prefix+"interface", "", "the boot network's interface (required)")
	fs.StringVar(&p.serverIP, prefix+"server-ip", "", "this host's IPv4 address on the boot network (default: the interface's first)")
	fs.StringVar(&p.mode, prefix+"mode", "proxy", "proxy: answer network boot clients next to the site's DHCP server, never with an address; authoritative: also hand out addresses (isolated networks)")
	fs.StringVar(&p.bootScriptURL, prefix+"boot-script-url", "", "the image service's plain-HTTP boot script, e.g. http://images.example:8080/boot.ipxe (iPXE gets it with ?mac=)")
	fs.StringVar(&p.tftpDir, prefix+"tftp-dir", "/usr/lib/ipxe", "directory with the iPXE binaries (Debian's ipxe package)")
	fs.StringVar(&p.tftpAddr, prefix+"tftp-addr", ":69", "TFTP listen address")
	fs.BoolVar(&p.tftpSinglePort, prefix+"tftp-single-port", false, "serve every TFTP transfer from the listen port instead of a port per transfer (for firewalls and NAT that pass nothing but port 69)")
	fs.StringVar(&p.httpAddr, prefix+"http-addr", ":8070", "HTTP listen address: iPXE binaries for UEFI HTTP boot under /ipxe/, /metrics, /healthz")
	fs.StringVar(&p.metricsTokenFile, prefix+"metrics-token-file", "", "file holding the bearer token /metrics asks for (the HTTP port is on the boot network); empty: /metrics is off")
	fs.StringVar(&p.observationsURL, prefix+"boot-observations-url", "", "the image service's /boot-observations (https://images.example:8443/boot-observations), where what this service sees of each MAC's boot is posted for its BootTrace; empty: nothing is posted")
	fs.StringVar(&p.observationsTokenFile, prefix+"boot-observations-token-file", "", "file holding the bearer token of --boot-observations-url (the image service's own --boot-observations-token-file)")
	fs.StringVar(&p.observationsCAFile, prefix+"boot-observations-ca-file", "", "PEM CA bundle that signed the image service's certificate, for an https --boot-observations-url (default: the system's)")
	fs.StringVar(&p.biosBinary, prefix+"bios-binary", "undionly.kpxe", "iPXE binary for BIOS PXE clients")
	fs.StringVar(&p.efiBinary, prefix+"efi-binary", "ipxe.efi", "iPXE binary for x86-64 UEFI clients (ipxe.efi, or snponly.efi to use the firmware's network driver)")
	fs.StringVar(&p.arm64Binary, prefix+"arm64-binary", "", "agentboot's netboot GRUB for arm64 UEFI clients (make pxe-grub builds bin/pxe/grubnetaa64.efi), a path or a name in the TFTP directory (empty: arm64 clients are not answered)")
	fs.BoolVar(&p.secureBoot, prefix+"secure-boot", false, "send x86-64 UEFI PXE clients Debian's signed shim and network GRUB instead of iPXE, which firmware with Secure Boot enforced refuses (docs/pxe.md#secure-boot)")
	fs.StringVar(&p.shimBinary, prefix+"shim-binary", "", "with --"+prefix+"secure-boot: the signed shim (default "+defaultShim+", Debian's shim-signed)")
	fs.StringVar(&p.signedGRUBBinary, prefix+"signed-grub-binary", "", "with --"+prefix+"secure-boot: the signed network GRUB the shim loads (default "+defaultSignedGRUB+", Debian's grub-efi-amd64-signed)")
	fs.StringVar(&p.pool, prefix+"pool", "", "authoritative mode: the address range handed out, first-last, e.g. 198.18.0.100-198.18.0.200")
	fs.IntVar(&p.prefixLen, prefix+"prefix-length", 0, "authoritative mode: the boot network's prefix length (default: the interface address's)")
	fs.StringVar(&p.router, prefix+"router", "", "authoritative mode: default gateway given to clients")
	fs.StringVar(&p.dns, prefix+"dns", "", "authoritative mode: comma-separated DNS servers given to clients")
	fs.Float64Var(&p.newClientRate, prefix+"dhcp-new-clients-per-second", 50, "DHCP packets a second from MACs not seen lately, all together, once --dhcp-new-clients-burst is spent; clients with a lease or reservation are not counted, so a flood of made-up MACs delays only new clients")
	fs.IntVar(&p.newClientBurst, prefix+"dhcp-new-clients-burst", 1000, "DHCP packets from MACs not seen lately served at once (machines powering on together for the first time), at least a second's worth of --dhcp-new-clients-per-second")
	fs.StringVar(&p.relays, prefix+"dhcp-relays", "", "comma-separated DHCP relay agents (giaddr) whose clients are answered; requests through any other are dropped (empty: clients on the boot network only)")
	fs.DurationVar(&p.leaseTime, prefix+"lease-time", 12*time.Hour, "authoritative mode: lease duration")
	fs.Var(&p.reservations, prefix+"reservation", "authoritative mode: MAC=IP, always give this MAC this address (repeatable)")
	fs.StringVar(&p.leaseFile, prefix+"lease-file", "/var/lib/agentboot/pxe-leases.json", "authoritative mode: where leases are kept (and each change, before it is acknowledged, in this name plus .journal)")
}

// observations configures the posting of boot observations.
func (p *pxeFlags) observations(cfg *pxe.Config, flagErr func(name, format string, args ...any) error) error {
	if p.observationsURL == "" {
		if p.observationsTokenFile != "" || p.observationsCAFile != "" {
			return flagErr("boot-observations-url", "required with --boot-observations-token-file and --boot-observations-ca-file")
		}
		return nil
	}
	u, err := url.Parse(p.observationsURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return flagErr("boot-observations-url", "%q is not an https:// URL of the image service (its token must not cross the boot network in clear)", p.observationsURL)
	}
	if p.observationsTokenFile == "" {
		return flagErr("boot-observations-token-file", "required with --boot-observations-url")
	}
	if cfg.ObservationsToken, err = readToken(p.observationsTokenFile); err != nil {
		return flagErr("boot-observations-token-file", "%v", err)
	}
	cfg.ObservationsURL = p.observationsURL
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if p.observationsCAFile != "" {
		pem, err := os.ReadFile(p.observationsCAFile)
		if err != nil {
			return flagErr("boot-observations-ca-file", "%v", err)
		}
		tlsCfg.RootCAs = x509.NewCertPool()
		if !tlsCfg.RootCAs.AppendCertsFromPEM(pem) {
			return flagErr("boot-observations-ca-file", "%s holds no PEM certificate", p.observationsCAFile)
		}
	}
	cfg.ObservationsClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}}
	return nil
}

// readToken reads a bearer token file: one line of at least 16 characters,
// no spaces.
func readToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(raw))
	if len(token) < 16 || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("%s holds no usable token (one line of at least 16 characters, no spaces)", path)
	}
	return token, nil
}

// parseIPv4List reads comma-separated IPv4 addresses; "" is none.
func parseIPv4List(v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		a, err := parseIPv4(s)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// config turns the flags into the service's configuration; prefix names the
// flags in errors.
func (p *pxeFlags) config(prefix string, log logr.Logger) (pxe.Config, error) {
	flagErr := func(name, format string, args ...any) error {
		return fmt.Errorf("--%s%s: %s", prefix, name, fmt.Sprintf(format, args...))
	}
	cfg := pxe.Config{
		Interface: p.iface, Mode: pxe.Mode(p.mode), BootScriptURL: p.bootScriptURL,
		TFTPDir: p.tftpDir, TFTPAddr: p.tftpAddr, TFTPSinglePort: p.tftpSinglePort, HTTPAddr: p.httpAddr,
		BIOSBinary: p.biosBinary, EFIBinary: p.efiBinary, ARM64Binary: p.arm64Binary,
		SecureBoot: p.secureBoot,
		PrefixLen:  p.prefixLen, LeaseTime: p.leaseTime, LeaseFile: p.leaseFile, Log: log, NewClientRate: p.newClientRate, NewClientBurst: p.newClientBurst,
	}
	if p.iface == "" {
		return cfg, flagErr("interface", "required: the interface on the boot network")
	}
	if !p.secureBoot {
		for _, f := range []struct{ name, value string }{{"shim-binary", p.shimBinary}, {"signed-grub-binary", p.signedGRUBBinary}} {
			if f.value != "" {
				return cfg, flagErr(f.name, "only applies with --%ssecure-boot", prefix)
			}
		}
	} else {
		cfg.ShimBinary = cmp.Or(p.shimBinary, defaultShim)
		cfg.SignedGRUBBinary = cmp.Or(p.signedGRUBBinary, defaultSignedGRUB)
	}
	if !(p.newClientRate > 0) {
		return cfg, flagErr("dhcp-new-clients-per-second", "%v: want more than 0", p.newClientRate)
	}
	if p.newClientBurst < 1 {
		return cfg, flagErr("dhcp-new-clients-burst", "%d: want at least 1", p.newClientBurst)
	}
	if p.metricsTokenFile != "" {
		var err error
		if cfg.MetricsToken, err = readToken(p.metricsTokenFile); err != nil {
			return cfg, flagErr("metrics-token-file", "%v", err)
		}
	}
	if err := p.observations(&cfg, flagErr); err != nil {
		return cfg, err
	}
	if p.bootScriptURL == "" {
		return cfg, flagErr("boot-script-url", "required: the image service's plain-HTTP /boot.ipxe")
	}
	if u, err := url.Parse(p.bootScriptURL); err != nil || u.Scheme != "http" || u.Host == "" {
		// Stock iPXE builds have no HTTPS, or no trust for a private CA.
		return cfg, flagErr("boot-script-url", "%q is not a plain http:// URL (stock iPXE cannot verify HTTPS)", p.bootScriptURL)
	}
	var err error
	if p.serverIP != "" {
		if cfg.ServerIP, err = parseIPv4(p.serverIP); err != nil {
			return cfg, flagErr("server-ip", "%v", err)
		}
	}
	// Relays apply in both modes: a relay forwards ProxyDHCP as well.
	if cfg.Relays, err = parseIPv4List(p.relays); err != nil {
		return cfg, flagErr("dhcp-relays", "%v", err)
	}
	if cfg.Mode != pxe.Authoritative {
		for _, f := range []struct{ name, value string }{{"pool", p.pool}, {"router", p.router}, {"dns", p.dns}} {
			if f.value != "" {
				return cfg, flagErr(f.name, "only applies in authoritative mode")
			}
		}
		if len(p.reservations) > 0 {
			return cfg, flagErr("reservation", "only applies in authoritative mode")
		}
		return cfg, nil
	}
	if p.pool == "" {
		return cfg, flagErr("pool", "required in authoritative mode, e.g. 198.18.0.100-198.18.0.200")
	}
	first, last, ok := strings.Cut(p.pool, "-")
	if !ok {
		return cfg, flagErr("pool", "%q: want first-last", p.pool)
	}
	if cfg.PoolStart, err = parseIPv4(first); err != nil {
		return cfg, flagErr("pool", "%v", err)
	}
	if cfg.PoolEnd, err = parseIPv4(last); err != nil {
		return cfg, flagErr("pool", "%v", err)
	}
	if cfg.PoolEnd.Less(cfg.PoolStart) {
		return cfg, flagErr("pool", "%q ends before it starts", p.pool)
	}
	if p.router != "" {
		if cfg.Router, err = parseIPv4(p.router); err != nil {
			return cfg, flagErr("router", "%v", err)
		}
	}
	if cfg.DNS, err = parseIPv4List(p.dns); err != nil {
		return cfg, flagErr("dns", "%v", err)
	}
	if p.leaseTime < time.Minute {
		return cfg, flagErr("lease-time", "%s is shorter than a minute", p.leaseTime)
	}
	cfg.Reservations = map[string]netip.Addr{}
	for _, r := range p.reservations {
		mac, ip, ok := strings.Cut(r, "=")
		if !ok {
			return cfg, flagErr("reservation", "%q: want MAC=IP", r)
		}
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return cfg, flagErr("reservation", "%q: %q is not an Ethernet MAC address", r, mac)
		}
		a, err := parseIPv4(ip)
		if err != nil {
			return cfg, flagErr("reservation", "%q: %v", r, err)
		}
		key := hw.String()
		if prev, dup := cfg.Reservations[key]; dup {
			return cfg, flagErr("reservation", "%s is reserved twice (%s and %s)", key, prev, a)
		}
		for m, other := range cfg.Reservations {
			if other == a {
				return cfg, flagErr("reservation", "%s is reserved for both %s and %s", a, m, key)
			}
		}
		cfg.Reservations[key] = a
	}
	return cfg, nil
}

func parseIPv4(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("%q is not an IPv4 address", s)
	}
	return a, nil
}

func runPXE(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pxe", flag.ContinueOnError)
	var (
		p         pxeFlags
		logLevel  = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat = fs.String("log-format", "json", "text or json")
	)
	p.register(fs, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := newLogger(os.Stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg, err := p.config("", log.WithName("pxe"))
	if err != nil {
		return err
	}
	srv, err := pxe.New(cfg)
	if err != nil {
		return err
	}
	log.Info("starting PXE service", "version", version)
	if err := srv.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
