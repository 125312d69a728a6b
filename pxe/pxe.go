// Package pxe is agentboot's network boot service: DHCP (ProxyDHCP next to a
// site's DHCP server, or authoritative on an isolated network) that points
// each firmware at the right boot loader (iPXE on x86, agentboot's netboot
// GRUB on arm64), TFTP and HTTP that serve them, and, for iPXE itself, the
// image service's boot script URL with the client's MAC. GRUB fetches its
// boot decision and files from the image service through this service's
// TFTP server. It needs no Kubernetes access: which InfraEnv a MAC boots is
// decided by the image service's /boot.ipxe and /boot.grub.
//
// It runs on the host network of the boot segment (ports 67, 4011, 69) and
// owns only its sockets and, in authoritative mode, its lease file.
package pxe

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/serve"
	"github.com/agentboot/agentboot/pxe/internal/dhcp"
	"github.com/agentboot/agentboot/pxe/internal/leases"
	"github.com/agentboot/agentboot/pxe/internal/tftpd"
)

// Mode of the DHCP service.
type Mode = dhcp.Mode

// Modes.
const (
	// ProxyDHCP answers network boot clients with boot information only.
	ProxyDHCP = dhcp.Proxy
	// Authoritative also hands out addresses, for isolated networks.
	Authoritative = dhcp.Authoritative
)

// Config configures the PXE service.
type Config struct {
	// Interface is the boot network's interface; DHCP binds to it.
	Interface string
	// ServerIP is this host's address on Interface (default: its first
	// IPv4 address).
	ServerIP netip.Addr
	Mode     Mode
	// BootScriptURL is the image service's /boot.ipxe (plain HTTP).
	BootScriptURL string
	// TFTPDir holds the iPXE binaries (default /usr/lib/ipxe).
	TFTPDir string
	// TFTPAddr is the TFTP listen address (":69").
	TFTPAddr string
	// TFTPSinglePort serves all TFTP transfers from port 69.
	TFTPSinglePort bool
	// HTTPAddr serves the iPXE binaries for UEFI HTTP boot, /metrics and
	// /healthz (":8070").
	HTTPAddr string
	// MetricsToken is the bearer token /metrics asks for: the port is on
	// the boot network, which anyone on it reaches. Empty: /metrics is off.
	MetricsToken string
	// ObservationsURL, when set, is the image service's /boot-observations,
	// where what this service sees of each MAC's boot is posted with
	// ObservationsToken (docs/trace.md); ObservationsClient posts (nil: a
	// client with the system's CAs).
	ObservationsURL, ObservationsToken string
	ObservationsClient                 *http.Client
	// iPXE binaries for BIOS and x86-64 UEFI firmware, in TFTPDir.
	BIOSBinary, EFIBinary string
	// ARM64Binary is agentboot's netboot GRUB for arm64 UEFI firmware
	// (make pxe-grub), a path or a name in TFTPDir; empty: arm64 clients
	// are not answered. It fetches the boot decision, kernel and initrd
	// from the image service through this service's TFTP server.
	ARM64Binary string
	// SecureBoot sends x86-64 UEFI PXE clients a signed chain instead of
	// iPXE, which firmware with Secure Boot enforced refuses: ShimBinary
	// (Debian's shimx64.efi.signed) as shimx64.efi, which loads
	// SignedGRUBBinary (Debian's grubnetx64.efi.signed) as grubx64.efi,
	// which reads grub/grub.cfg from this service and asks the image
	// service for its boot decision through it, as arm64 hosts do.
	SecureBoot                   bool
	ShimBinary, SignedGRUBBinary string

	// Authoritative mode: the pool, its options, reservations by MAC and the
	// lease file.
	PoolStart, PoolEnd netip.Addr
	PrefixLen          int
	// Relays are the DHCP relay agents whose requests are answered; a
	// request through any other is dropped.
	Relays []netip.Addr
	// NewClientRate bounds the DHCP packets of MACs not seen lately, per
	// second (50), and NewClientBurst how many may come at once (1000).
	NewClientRate  float64
	NewClientBurst int
	Router         netip.Addr
	DNS            []netip.Addr
	LeaseTime      time.Duration
	Reservations   map[string]netip.Addr
	LeaseFile      string

	// Socket factories; the defaults open them on this host. Tests open
	// them inside a network namespace.
	ListenDHCP func(iface string, port int) (net.PacketConn, error)
	// ListenDHCP6 opens a raw IPv6 UDP socket on the interface's DHCPv6
	// server group, to log the IPv6 network-boot clients this service does
	// not answer; it takes no port, and reports each packet's interface
	// and destination.
	ListenDHCP6  func(iface string) (*ipv6.PacketConn, error)
	ListenPacket func(network, addr string) (net.PacketConn, error)
	Listen       func(network, addr string) (net.Listener, error)
	Log          logr.Logger
}

// Server is the PXE service.
type Server struct {
	cfg     Config
	handler *dhcp.Handler
	tftp    *tftpd.Server
	ifindex int       // the boot network's interface
	obs     *observer // nil: boot observations are not posted
	reg     *prometheus.Registry
	hops    *prometheus.CounterVec // agentboot_boot_path_total
	// grub is the arm64 boot loader with this server's address, served
	// as grubName; images fetches what it asks for.
	grub     []byte
	grubName string
	images   *imageProxy
	// signed are the files of the Secure Boot path by TFTP name.
	signed map[string][]byte
}

// Limits of the files proxied to GRUB: one file, and all files kept for
// hosts booting together. A CoreOS initrd with its Ignition is about
// 100 MiB, its kernel 12–50 MiB.
const (
	maxProxiedFile  = 256 << 20
	maxProxiedCache = 1 << 30
)

// New checks the configuration and opens the lease file.
func New(cfg Config) (*Server, error) {
	if cfg.Interface == "" {
		return nil, errors.New("pxe: the boot network interface is required")
	}
	if cfg.Mode == "" {
		cfg.Mode = ProxyDHCP
	}
	if cfg.Mode != ProxyDHCP && cfg.Mode != Authoritative {
		return nil, fmt.Errorf("pxe: mode %q: want proxy or authoritative", cfg.Mode)
	}
	if cfg.BootScriptURL == "" {
		return nil, errors.New("pxe: the image service's boot script URL is required")
	}
	defaults(&cfg)
	if !cfg.ServerIP.IsValid() || (cfg.Mode == Authoritative && cfg.PrefixLen == 0) {
		pfx, err := interfaceIPv4(cfg.Interface, cfg.ServerIP)
		if err != nil {
			return nil, err
		}
		cfg.ServerIP = pfx.Addr()
		if cfg.PrefixLen == 0 {
			cfg.PrefixLen = pfx.Bits()
		}
	}
	if !cfg.ServerIP.Is4() {
		return nil, fmt.Errorf("pxe: server IP %s is not an IPv4 address", cfg.ServerIP)
	}
	s := &Server{cfg: cfg, reg: prometheus.NewRegistry()}
	hops := bootpath.NewCounter()
	s.reg.MustRegister(hops)
	s.hops = hops
	if cfg.ObservationsURL != "" {
		if cfg.ObservationsToken == "" {
			return nil, errors.New("pxe: boot observations need the image service's token")
		}
		client := cfg.ObservationsClient
		if client == nil {
			client = &http.Client{Timeout: 10 * time.Second}
		}
		s.obs = newObserver(cfg.ObservationsURL, cfg.ObservationsToken, client, s.reg, cfg.Log.WithName("observations"))
	}
	files := []string{cfg.BIOSBinary, cfg.EFIBinary}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("pxe: interface %s: %w", cfg.Interface, err)
	}
	s.ifindex = ifi.Index
	tcfg := tftpd.Config{Dir: cfg.TFTPDir, Files: files, SinglePort: cfg.TFTPSinglePort, MaxBlockSize: maxBlockSize(ifi.MTU),
		Log: cfg.Log.WithName("tftp"), Registerer: s.reg, Completed: hops.WithLabelValues(bootpath.BootFile)}
	if s.obs != nil {
		tcfg.Finished = s.obs.tftp
	}
	if cfg.ARM64Binary != "" {
		file := cfg.ARM64Binary
		if !filepath.IsAbs(file) {
			file = filepath.Join(cfg.TFTPDir, file)
		}
		if s.grub, err = loadGRUB(file, cfg.ServerIP); err != nil {
			return nil, err
		}
		s.grubName = filepath.Base(file)
	}
	if cfg.SecureBoot {
		if s.signed, err = loadSignedChain(cfg); err != nil {
			return nil, err
		}
	}
	if s.grub != nil || s.signed != nil {
		// Either GRUB fetches the image service's files through this
		// service's TFTP server.
		if s.images, err = newImageProxy(cfg.BootScriptURL, maxProxiedFile, maxProxiedCache, cfg.Log.WithName("grub-files")); err != nil {
			return nil, err
		}
		tcfg.Source = s.source
	}
	if s.tftp, err = tftpd.New(tcfg); err != nil {
		return nil, err
	}
	dcfg := dhcp.Config{
		Mode: cfg.Mode, ServerIP: cfg.ServerIP, BootScriptURL: cfg.BootScriptURL,
		HTTPBase:   "http://" + net.JoinHostPort(cfg.ServerIP.String(), port(cfg.HTTPAddr)),
		BIOSBinary: cfg.BIOSBinary, EFIBinary: cfg.EFIBinary, ARM64Binary: s.grubName,
		Router: cfg.Router, DNS: cfg.DNS, LeaseTime: cfg.LeaseTime, Log: cfg.Log.WithName("dhcp"),
	}
	// The boot network, so that replies go nowhere else: the prefix
	// given, or the interface's.
	if cfg.PrefixLen > 0 {
		dcfg.Subnet = netip.PrefixFrom(cfg.ServerIP, cfg.PrefixLen).Masked()
	} else if pfx, err := interfaceIPv4(cfg.Interface, cfg.ServerIP); err == nil {
		dcfg.Subnet = pfx.Masked()
	}
	dcfg.Relays, dcfg.NewClientRate, dcfg.NewClientBurst = cfg.Relays, cfg.NewClientRate, cfg.NewClientBurst
	if cfg.SecureBoot {
		dcfg.EFIPXEBinary = SignedShimName
	}
	if cfg.Mode == Authoritative {
		if !cfg.PoolStart.IsValid() || !cfg.PoolEnd.IsValid() {
			return nil, errors.New("pxe: authoritative mode needs an address pool")
		}
		if err := checkPool(cfg); err != nil {
			return nil, err
		}
		if cfg.LeaseFile == "" {
			return nil, errors.New("pxe: authoritative mode needs a lease file, so a restart never hands out an address twice")
		}
		if err := os.MkdirAll(filepath.Dir(cfg.LeaseFile), 0o755); err != nil {
			return nil, err
		}
		if dcfg.Leases, err = leases.Open(leases.Config{
			Pool: leases.Pool{First: cfg.PoolStart, Last: cfg.PoolEnd}, Reservations: cfg.Reservations, File: cfg.LeaseFile,
		}); err != nil {
			return nil, err
		}
		dcfg.Netmask = net.CIDRMask(cfg.PrefixLen, 32)
	}
	dm := dhcp.NewMetrics(s.reg)
	dm.Hops = hops
	if s.obs != nil {
		dcfg.Observe = s.obs.dhcp
	}
	if s.handler, err = dhcp.New(dcfg, dm); err != nil {
		return nil, err
	}
	return s, nil
}

func defaults(cfg *Config) {
	if cfg.TFTPDir == "" {
		cfg.TFTPDir = "/usr/lib/ipxe"
	}
	if cfg.TFTPAddr == "" {
		cfg.TFTPAddr = ":69"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = ":8070"
	}
	if cfg.BIOSBinary == "" {
		cfg.BIOSBinary = "undionly.kpxe"
	}
	if cfg.EFIBinary == "" {
		cfg.EFIBinary = "ipxe.efi"
	}
	if cfg.ListenDHCP == nil {
		cfg.ListenDHCP = func(iface string, p int) (net.PacketConn, error) {
			return server4.NewIPv4UDPConn(iface, &net.UDPAddr{Port: p})
		}
	}
	if cfg.ListenDHCP6 == nil {
		cfg.ListenDHCP6 = listenDHCP6
	}
	if cfg.ListenPacket == nil {
		cfg.ListenPacket = net.ListenPacket
	}
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
}

func port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}

// maxBlockSize is the largest TFTP block that fits an mtu: a DATA packet is
// the block plus 4 bytes of TFTP, 8 of UDP and 20 of IP headers, and firmware
// clients may not reassemble fragments. 0 (no cap beyond 512) when the MTU is
// too small for more.
func maxBlockSize(mtu int) int {
	if b := min(mtu-32, 65464); b > 512 {
		return b
	}
	return 0
}

// interfaceIPv4 returns want's prefix on the interface or, when want is
// not set, the interface's first IPv4 address.
func interfaceIPv4(name string, want netip.Addr) (netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("pxe: interface %s: %w", name, err)
	}
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP.To4())
		bits, _ := n.Mask.Size()
		if !want.IsValid() || want == ip {
			return netip.PrefixFrom(ip, bits), nil
		}
	}
	if want.IsValid() {
		return netip.Prefix{}, fmt.Errorf("pxe: interface %s does not have %s: set the prefix length of the boot network", name, want)
	}
	return netip.Prefix{}, fmt.Errorf("pxe: interface %s has no IPv4 address: set the server IP", name)
}

// checkPool refuses a pool outside the boot network or over the server's
// own address.
func checkPool(cfg Config) error {
	if cfg.PrefixLen < 1 || cfg.PrefixLen > 30 {
		return fmt.Errorf("pxe: prefix length %d: want 1 to 30", cfg.PrefixLen)
	}
	subnet := netip.PrefixFrom(cfg.ServerIP, cfg.PrefixLen).Masked()
	pool := leases.Pool{First: cfg.PoolStart, Last: cfg.PoolEnd}
	for _, ip := range []netip.Addr{cfg.PoolStart, cfg.PoolEnd} {
		if !subnet.Contains(ip) {
			return fmt.Errorf("pxe: pool address %s is outside the boot network %s", ip, subnet)
		}
	}
	if pool.Contains(cfg.ServerIP) {
		return fmt.Errorf("pxe: the pool %s-%s contains the server's own address %s", cfg.PoolStart, cfg.PoolEnd, cfg.ServerIP)
	}
	if cfg.Router.IsValid() && pool.Contains(cfg.Router) {
		return fmt.Errorf("pxe: the pool %s-%s contains the router %s", cfg.PoolStart, cfg.PoolEnd, cfg.Router)
	}
	for mac, ip := range cfg.Reservations {
		if !subnet.Contains(ip) {
			return fmt.Errorf("pxe: reservation %s=%s is outside the boot network %s", mac, ip, subnet)
		}
	}
	return nil
}

// Start serves DHCP (and ProxyDHCP on 4011), TFTP and HTTP until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	ports := []int{dhcpv4.ServerPort}
	if s.cfg.Mode == ProxyDHCP {
		ports = append(ports, 4011)
	}
	// Listen on everything first: a port that is taken fails Start before
	// anything is served.
	var tasks []serve.Task
	for _, p := range ports {
		conn, err := s.cfg.ListenDHCP(s.cfg.Interface, p)
		if err != nil {
			serve.StopAll(tasks)
			return fmt.Errorf("DHCP: listen on %s port %d: %w (the PXE service needs root, or CAP_NET_BIND_SERVICE and CAP_NET_RAW)", s.cfg.Interface, p, err)
		}
		s.growReceiveBuffer(conn, fmt.Sprintf("DHCP port %d", p))
		tasks = append(tasks, serve.Task{Name: fmt.Sprintf("DHCP port %d", p), Serve: func() error { return s.serveDHCP(conn, p) }, Stop: func(context.Context) { conn.Close() }})
	}
	// DHCPv6 is watched, never answered: a failure to listen costs only
	// the log lines about IPv6 boot clients.
	if conn6, err := s.cfg.ListenDHCP6(s.cfg.Interface); err != nil {
		s.cfg.Log.Info("not watching DHCPv6: IPv6 network boot clients, which this service does not answer, will not be logged", "interface", s.cfg.Interface, "err", err.Error())
	} else {
		tasks = append(tasks, serve.Task{Name: "DHCPv6 watch", Serve: func() error { return s.watchDHCP6(conn6) }, Stop: func(context.Context) { conn6.Close() }})
	}
	tconn, err := s.cfg.ListenPacket("udp4", s.cfg.TFTPAddr)
	if err != nil {
		serve.StopAll(tasks)
		return fmt.Errorf("TFTP: listen %s: %w", s.cfg.TFTPAddr, err)
	}
	s.growReceiveBuffer(tconn, "TFTP")
	tasks = append(tasks, serve.Task{Name: "TFTP", Serve: func() error { return s.tftp.Serve(tconn) }, Stop: func(context.Context) { s.tftp.Shutdown(); tconn.Close() }})
	hl, err := s.cfg.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		serve.StopAll(tasks)
		return fmt.Errorf("HTTP: listen %s: %w", s.cfg.HTTPAddr, err)
	}
	// The port is on the boot network: no connection is held longer than
	// a transfer of an iPXE binary needs.
	hs := &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 5 * time.Minute, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	tasks = append(tasks, serve.HTTP("HTTP", hs, hl))
	if s.obs != nil {
		octx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		tasks = append(tasks, serve.Task{Name: "boot observations", Serve: func() error { defer close(done); return s.obs.run(octx) },
			Stop: func(context.Context) { cancel(); <-done }})
	}
	s.cfg.Log.Info("PXE service running", "mode", string(s.cfg.Mode), "interface", s.cfg.Interface, "serverIP", s.cfg.ServerIP.String(),
		"tftp", s.cfg.TFTPAddr, "http", s.cfg.HTTPAddr, "bootScript", s.cfg.BootScriptURL)
	return serve.Run(ctx, 5*time.Second, tasks...)
}

// growReceiveBuffer makes room on a listening socket for a storm's requests
// arriving together, and says at start when the kernel grants less.
func (s *Server) growReceiveBuffer(conn net.PacketConn, name string) {
	got, err := growReceiveBuffer(conn)
	switch {
	case err != nil:
		s.cfg.Log.Info("could not size the socket's receive buffer; a boot storm may lose requests to retransmission", "socket", name, "error", err.Error())
	case got < 2*receiveBuffer:
		// The kernel doubles what it grants (for its bookkeeping) and
		// reports that.
		s.cfg.Log.Info("the kernel grants the socket a smaller receive buffer than asked: requests of a boot storm beyond it wait for the firmware's retransmission (4 s); raise net.core.rmem_max, or grant CAP_NET_ADMIN",
			"socket", name, "grantedKiB", got>>11, "askedKiB", receiveBuffer>>10)
	}
}

// batch is how many packets one system call reads or writes under load.
const batch = 64

// serveDHCP reads, answers and counts; a malformed packet is dropped. Under
// load it reads and writes many packets per system call (recvmmsg and
// sendmmsg on Linux).
func (s *Server) serveDHCP(conn net.PacketConn, port int) error {
	pc := ipv4.NewPacketConn(conn)
	in := make([]ipv4.Message, batch)
	for i := range in {
		in[i].Buffers = [][]byte{make([]byte, 1500)}
	}
	out := make([]ipv4.Message, 0, batch)
	for {
		n, err := pc.ReadBatch(in, 0)
		if err != nil {
			return err
		}
		out = out[:0]
		for _, m := range in[:n] {
			reply := s.Handle(m.Buffers[0][:m.N], port)
			if reply == nil {
				continue
			}
			up, _ := m.Addr.(*net.UDPAddr)
			dst, ok := s.handler.Destination(reply.req, up, port)
			if !ok {
				s.handler.Dropped("destination-outside-boot-network")
				continue
			}
			out = append(out, ipv4.Message{Buffers: [][]byte{reply.resp.ToBytes()}, Addr: dst})
		}
		for off := 0; off < len(out); {
			sent, err := pc.WriteBatch(out[off:], 0)
			if err != nil {
				// One bad destination must not stop the others.
				s.cfg.Log.V(1).Info("send DHCP reply", "to", out[off].Addr.String(), "err", err.Error())
				sent = max(sent, 1)
			}
			off += sent
		}
	}
}

// dhcp6Servers is All_DHCP_Relay_Agents_and_Servers (ff02::1:2), where
// DHCPv6 clients send.
var dhcp6Servers = net.ParseIP("ff02::1:2")

// listenDHCP6 opens a raw IPv6 socket for UDP on iface's DHCPv6 server
// group: it reads copies of the UDP packets the host receives and takes
// no port, so a DHCPv6 server on the same machine binds port 547 as it
// would without this service (dnsmasq, for one, binds it without address
// reuse unless told to bind interfaces) and keeps every packet. Joining
// the group on iface makes the interface take the clients' packets even
// where no DHCPv6 server runs.
func listenDHCP6(iface string) (*ipv6.PacketConn, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	if off, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + iface + "/disable_ipv6"); err == nil && strings.TrimSpace(string(off)) == "1" {
		return nil, fmt.Errorf("IPv6 is disabled on %s (net.ipv6.conf.%s.disable_ipv6=1)", iface, iface)
	}
	c, err := net.ListenPacket("ip6:udp", "::")
	if err != nil {
		return nil, err
	}
	p := ipv6.NewPacketConn(c)
	// In the kernel, only UDP to port 547 is copied here: the host's other
	// IPv6 UDP traffic never reaches this process. A raw IPv6 socket's
	// filter sees the packet from its UDP header on.
	filter, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 2, Size: 2}, // destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: dhcpv6.DefaultServerPort, SkipFalse: 1},
		bpf.RetConstant{Val: 65535},
		bpf.RetConstant{Val: 0},
	})
	if err == nil {
		err = p.SetBPF(filter)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("filter port %d: %w", dhcpv6.DefaultServerPort, err)
	}
	if err := p.JoinGroup(ifi, &net.IPAddr{IP: dhcp6Servers}); err != nil {
		c.Close()
		return nil, fmt.Errorf("join %s on %s: %w", dhcp6Servers, iface, err)
	}
	// Which interface and which address each packet came to: only the
	// boot network's, and only the servers' group, are clients' requests.
	if err := p.SetControlMessage(ipv6.FlagInterface|ipv6.FlagDst, true); err != nil {
		c.Close()
		return nil, fmt.Errorf("DHCPv6: %w", err)
	}
	return p, nil
}

// watchDHCP6 reads pc (listenDHCP6's: each packet a UDP header and its
// payload) and hands the DHCPv6 requests sent to the servers' group on
// the boot network's interface to the handler, which logs the
// network-boot clients it does not answer (dhcp.Handler.Unserved6).
// Nothing is sent. It returns only once conn is closed: a read error is
// logged (at most once a minute) and reading goes on, since the watch is
// no reason to stop the PXE service.
func (s *Server) watchDHCP6(pc *ipv6.PacketConn) error {
	buf := make([]byte, 65536)
	var lastErr time.Time
	for {
		n, cm, src, err := pc.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		if err != nil {
			if time.Since(lastErr) > time.Minute {
				s.cfg.Log.Info("DHCPv6 watch: read failed; reading on", "err", err.Error())
				lastErr = time.Now()
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if cm == nil || cm.IfIndex != s.ifindex || !cm.Dst.Equal(dhcp6Servers) || n < 8 {
			continue
		}
		udp := buf[:n]
		if binary.BigEndian.Uint16(udp[2:4]) != dhcpv6.DefaultServerPort {
			continue
		}
		var peer netip.Addr
		if a, ok := src.(*net.IPAddr); ok {
			peer, _ = netip.AddrFromSlice(a.IP)
		}
		s.handler.Unserved6(udp[8:], peer)
	}
}

// Reply is a request and its answer.
type Reply struct {
	req, resp *dhcpv4.DHCPv4
}

// Response is the reply's packet.
func (r *Reply) Response() *dhcpv4.DHCPv4 { return r.resp }

// Handle parses one packet received on port and returns the reply, or nil.
func (s *Server) Handle(packet []byte, port int) *Reply {
	req, err := dhcpv4.FromBytes(packet)
	if err != nil {
		s.handler.Malformed()
		return nil
	}
	resp := s.handler.Respond(req, port)
	if resp == nil {
		return nil
	}
	return &Reply{req: req, resp: resp}
}

// source serves TFTP names outside the iPXE binaries: the arm64 GRUB and,
// below discovery.GRUBPathPrefix, the image service's files it asks for.
func (s *Server) source(ctx context.Context, name string, client netip.Addr) ([]byte, error) {
	if name == s.grubName && s.grub != nil {
		return s.grub, nil
	}
	if data, ok := s.signed[name]; ok {
		return data, nil
	}
	rel, ok := strings.CutPrefix(name, discovery.GRUBPathPrefix+"/")
	if !ok {
		return nil, tftpd.ErrNotFound
	}
	if q, ok := strings.CutPrefix(rel, "boot.grub?"); ok {
		// The image service sees this service, not the host: the log
		// ties each boot decision to the address that asked.
		v, _ := url.ParseQuery(q)
		s.cfg.Log.V(1).Info("GRUB asks for its boot decision", "client", client.String(), "mac", v.Get("mac"), "arch", v.Get("arch"))
	}
	return s.images.get(ctx, rel)
}

// serveBootFile sends an iPXE binary to a UEFI HTTP boot client. A whole
// file sent by GET is the boot-file hop of its boot path, counted and
// observed for the client's boot trace as a TFTP transfer is; HEAD (the
// firmware asks for the size first) and ranges are not.
func (s *Server) serveBootFile(w http.ResponseWriter, r *http.Request, name string) {
	f, err := os.Open(filepath.Join(s.cfg.TFTPDir, name))
	if errors.Is(err, os.ErrNotExist) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if err != nil {
		s.cfg.Log.Error(err, "HTTP boot file unreadable", "file", name)
		http.Error(w, "boot file unreadable", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "boot file unreadable", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/efi")
	cw := &countingWriter{ResponseWriter: w}
	http.ServeContent(cw, r, name, fi.ModTime(), f)
	if r.Method != http.MethodGet || cw.status != http.StatusOK {
		return // the size, a part (206), or not modified (304): no boot file sent
	}
	result := "ok"
	if cw.n != fi.Size() {
		result = "incomplete"
	}
	client := netip.Addr{}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		client = ap.Addr().Unmap()
	}
	s.cfg.Log.V(1).Info("HTTP boot file sent", "client", client.String(), "file", name, "result", result, "bytes", cw.n)
	if result == "ok" {
		s.hops.WithLabelValues(bootpath.BootFile).Inc()
	}
	if s.obs != nil && client.IsValid() {
		s.obs.bootFile(client, name, result, cw.n, "HTTP")
	}
}

// countingWriter counts the body bytes written and keeps the status.
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadFrom keeps the connection's sendfile path for the file.
func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := io.Copy(c.ResponseWriter, r)
	c.n += n
	return n, err
}

// httpHandler serves the iPXE binaries (UEFI HTTP boot), metrics and health.
func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ipxe/{file}", func(w http.ResponseWriter, r *http.Request) {
		name, ok := s.tftp.Allowed(r.PathValue("file"))
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		s.serveBootFile(w, r, name)
	})
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.MetricsToken == "" {
			http.Error(w, "metrics are off: start the PXE service with --metrics-token-file", http.StatusNotFound)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.MetricsToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentboot-pxe"`)
			http.Error(w, "unauthorized: /metrics needs the bearer token of --metrics-token-file", http.StatusUnauthorized)
			return
		}
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}
