// Package lab is the VM lab of the end-to-end tests (root only): a network
// namespace with a bridge on 198.18.0.0/24, a tap per VM, dnsmasq for DHCP,
// and listeners and connections inside the namespace for agentboot's
// services, which otherwise run in the test process. Everything it creates
// goes away on every exit path, including Ctrl-C and a crashed earlier run.
package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/test/netns"
)

// Addresses inside the lab: only 198.18.0.0/15, only inside the namespace.
const (
	Prefix     = "agentboot-e2e-"
	HostIP     = "198.18.0.1"
	Subnet     = "198.18.0.0/24"
	DHCPFirst  = "198.18.0.100"
	DHCPLast   = "198.18.0.199"
	bridgeName = "br0"
)

// Lab is one network namespace with its bridge.
type Lab struct {
	*netns.NS
	Dir string

	mu      sync.Mutex
	taps    int
	cleanup []func()
}

// New creates the namespace (removing namespaces of earlier runs whose
// process is gone) and the bridge.
func New(dir string) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the VM lab needs root (network namespaces, taps): run make e2e as root")
	}
	for _, tool := range []string{"ip", "dnsmasq", "qemu-system-x86_64"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: install the Debian packages in .ci/packages", tool)
		}
	}
	RemoveStale()
	ns, err := netns.New(Prefix + strconv.Itoa(os.Getpid()))
	if err != nil {
		return nil, err
	}
	l := &Lab{NS: ns, Dir: dir}
	l.cleanup = append(l.cleanup, ns.Close)
	if err := l.bridge(bridgeName, 0, HostIP); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// bridge creates bridge name with address ip/24 and a fixed, locally
// administered MAC address 02:00:c6:12:<n>:01. Without one, Linux gives
// a bridge the lowest MAC of its ports, so every tap a test adds could
// change the host's MAC under the VMs already running, whose ARP caches
// then point at an address the bridge no longer takes as its own.
func (l *Lab) bridge(name string, n int, ip string) error {
	for _, cmd := range [][]string{
		{"link", "add", name, "address", fmt.Sprintf("02:00:c6:12:%02x:01", n), "type", "bridge"},
		{"addr", "add", ip + "/24", "dev", name},
		{"link", "set", name, "up"},
	} {
		if err := l.IP(cmd...); err != nil {
			return err
		}
	}
	return nil
}

// RemoveStale deletes lab namespaces whose test process no longer runs.
func RemoveStale() { netns.RemoveStale(Prefix) }

// Close stops everything the lab started and deletes the namespace.
func (l *Lab) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.cleanup) - 1; i >= 0; i-- {
		l.cleanup[i]()
	}
	l.cleanup = nil
}

// Segment is one more boot network in the lab: a bridge with
// 198.18.<n>.1/24. The namespace owns every segment's address, so VMs on
// any segment reach agentboot's services on HostIP through their router.
type Segment struct {
	Bridge string
	HostIP string // 198.18.<n>.1
	Prefix string // 198.18.<n>
}

// Segment creates bridge br<n> with 198.18.<n>.1/24 (n from 1 to 255).
func (l *Lab) Segment(n int) (Segment, error) {
	seg := Segment{Bridge: fmt.Sprintf("br%d", n), Prefix: fmt.Sprintf("198.18.%d", n)}
	seg.HostIP = seg.Prefix + ".1"
	return seg, l.bridge(seg.Bridge, n, seg.HostIP)
}

// Segment6 is a boot network with IPv6: bridge br<n> with
// 2001:2:0:<n>::1/64 (the IPv6 benchmarking range, RFC 5180; <n> in
// decimal digits, as in 198.18.<n>) and, when
// dual, 198.18.<n>.1/24 as well. The lab's address skips duplicate address
// detection, so that services can bind it at once.
type Segment6 struct {
	Segment        // Bridge; HostIP and Prefix only when dual-stack
	HostIP6 string // 2001:2:0:<n>::1
	Prefix6 string // 2001:2:0:<n>::
}

// SegmentIPv6 creates segment n with IPv6, and IPv4 too when dual.
func (l *Lab) SegmentIPv6(n int, dual bool) (Segment6, error) {
	seg := Segment6{Segment: Segment{Bridge: fmt.Sprintf("br%d", n)}, Prefix6: fmt.Sprintf("2001:2:0:%d::", n)}
	seg.HostIP6 = seg.Prefix6 + "1"
	cmds := [][]string{
		{"link", "add", seg.Bridge, "address", fmt.Sprintf("02:00:c6:12:%02x:01", n), "type", "bridge"},
		{"addr", "add", seg.HostIP6 + "/64", "dev", seg.Bridge, "nodad"},
		{"link", "set", seg.Bridge, "up"},
	}
	if dual {
		seg.Prefix = fmt.Sprintf("198.18.%d", n)
		seg.HostIP = seg.Prefix + ".1"
		cmds = append(cmds, []string{"addr", "add", seg.HostIP + "/24", "dev", seg.Bridge})
	}
	for _, cmd := range cmds {
		if err := l.IP(cmd...); err != nil {
			return Segment6{}, err
		}
	}
	return seg, nil
}

// RAOptions are dnsmasq's options to send router advertisements on seg:
// its prefix for SLAAC, no DHCPv6, and the lab as the default router
// (lifetime 1800 s), so that hosts reach the lab's addresses on other
// segments.
func RAOptions(seg Segment6) []string {
	return []string{"--enable-ra", "--dhcp-range=" + seg.Prefix6 + ",ra-only,64,12h", "--ra-param=" + seg.Bridge + ",0,1800"}
}

// RouterAdvertisements runs dnsmasq on seg sending router advertisements
// only (RAOptions): no DHCP of either family.
func (l *Lab) RouterAdvertisements(name string, seg Segment6) error {
	args := []string{"dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=" + seg.Bridge, "--bind-interfaces", "--except-interface=lo",
		"--log-dhcp", "--log-facility=" + filepath.Join(l.Dir, name+".log")}
	return l.Start(name, DnsmasqReady, append(args, RAOptions(seg)...)...)
}

// Peer is another machine on segment seg: namespace <lab>-<name> with a
// veth on seg's bridge addressed ip/24 and a default route through the
// lab. It stands for a server of the site (its DHCP server) beside
// agentboot's on the same segment; name is at most 8 characters.
func (l *Lab) Peer(name string, seg Segment, ip string) (*netns.NS, error) {
	ns, err := l.newNS(name)
	if err != nil {
		return nil, err
	}
	if err := l.leg(ns, "v"+name, seg, ip); err != nil {
		return nil, err
	}
	return ns, ns.IP("route", "add", "default", "via", seg.HostIP)
}

// newNS creates namespace <lab>-<name>, deleted when the lab closes.
func (l *Lab) newNS(name string) (*netns.NS, error) {
	ns, err := netns.New(l.Name + "-" + name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.cleanup = append(l.cleanup, ns.Close)
	l.mu.Unlock()
	return ns, nil
}

// leg joins ns to seg's bridge through veth pair <veth> (in ns, as eth0
// would be on a machine) and <veth>p (on the bridge), with ip/24 on ns's end.
func (l *Lab) leg(ns *netns.NS, veth string, seg Segment, ip string) error {
	if err := l.IP("link", "add", veth+"p", "type", "veth", "peer", "name", veth, "netns", ns.Name); err != nil {
		return err
	}
	for _, cmd := range [][]string{{"link", "set", veth + "p", "master", seg.Bridge}, {"link", "set", veth + "p", "up"}} {
		if err := l.IP(cmd...); err != nil {
			return err
		}
	}
	for _, cmd := range [][]string{{"addr", "add", ip + "/24", "dev", veth}, {"link", "set", veth, "up"}} {
		if err := ns.IP(cmd...); err != nil {
			return err
		}
	}
	return nil
}

// Routed is a boot network behind a router: VMs on Bridge, inside the
// router's namespace, reach the lab only through it.
type Routed struct {
	Router   *netns.NS
	Bridge   string // br<n>, in Router
	Prefix   string // 198.18.<n>
	RouterIP string // 198.18.<n>.1: the VMs' gateway, and a relay's giaddr
	Up       Segment
	UpIP     string // 198.18.<up>.2: the router on segment Up
	UpIface  string // the router's interface on Up
	lab      *Lab
}

// Routed builds boot network 198.18.<n>.0/24 behind a router. The router
// (namespace <lab>-r<n>) stands on segment up as 198.18.<up>.2, forwards,
// and sends everything else to the lab; the lab and each of peers route
// 198.18.<n>.0/24 back through it. It only routes: a test starts the
// site's DHCP relay in it.
func (l *Lab) Routed(n int, up Segment, peers ...*netns.NS) (*Routed, error) {
	name := fmt.Sprintf("r%d", n)
	ns, err := l.newNS(name)
	if err != nil {
		return nil, err
	}
	r := &Routed{Router: ns, Bridge: fmt.Sprintf("br%d", n), Prefix: fmt.Sprintf("198.18.%d", n), Up: up,
		UpIP: up.Prefix + ".2", UpIface: "v" + name, lab: l}
	r.RouterIP = r.Prefix + ".1"
	if err := l.leg(ns, r.UpIface, up, r.UpIP); err != nil {
		return nil, err
	}
	for _, cmd := range [][]string{
		{"link", "add", r.Bridge, "address", fmt.Sprintf("02:00:c6:12:%02x:01", n), "type", "bridge"},
		{"addr", "add", r.RouterIP + "/24", "dev", r.Bridge},
		{"link", "set", r.Bridge, "up"},
		{"route", "add", "default", "via", up.HostIP},
	} {
		if err := ns.IP(cmd...); err != nil {
			return nil, err
		}
	}
	if err := netns.Run("ip", "netns", "exec", ns.Name, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		return nil, err
	}
	for _, other := range append([]*netns.NS{l.NS}, peers...) {
		if err := other.IP("route", "add", r.Prefix+".0/24", "via", r.UpIP); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Tap creates a tap device on the routed network's bridge, inside the
// router's namespace (qemu runs there too).
func (r *Routed) Tap() (string, error) { return r.lab.tapIn(r.Router, r.Bridge) }

// VLANSegment is boot network br<n> reached through a switch port that
// carries VLAN vid tagged: the lab (198.18.<n>.1/24, on bridge br<n>a)
// answers a host on br<n> only through frames tagged vid, and never its
// untagged frames. The machines' kernel has no 802.1Q support (no vlan
// devices, no bridge VLAN filtering), so the port is this process: it
// moves frames between a tap on each bridge, untagging those of VLAN vid
// on the way in, dropping every other, and tagging on the way out, as a
// switch does between a trunk and an access port.
func (l *Lab) VLANSegment(n, vid int) (Segment, error) {
	if vid < 1 || vid > 4094 {
		return Segment{}, fmt.Errorf("VLAN %d: want 1 to 4094", vid)
	}
	seg := Segment{Bridge: fmt.Sprintf("br%d", n), Prefix: fmt.Sprintf("198.18.%d", n)}
	seg.HostIP = seg.Prefix + ".1"
	for _, cmd := range [][]string{
		{"link", "add", seg.Bridge, "address", fmt.Sprintf("02:00:c6:12:%02x:02", n), "type", "bridge"},
		{"link", "set", seg.Bridge, "up"},
	} {
		if err := l.IP(cmd...); err != nil {
			return Segment{}, err
		}
	}
	if err := l.bridge(seg.Bridge+"a", n, seg.HostIP); err != nil {
		return Segment{}, err
	}
	trunk, err := l.openTap(fmt.Sprintf("vt%d", n), seg.Bridge)
	if err != nil {
		return Segment{}, err
	}
	access, err := l.openTap(fmt.Sprintf("va%d", n), seg.Bridge+"a")
	if err != nil {
		trunk.Close()
		return Segment{}, err
	}
	l.mu.Lock()
	l.cleanup = append(l.cleanup, func() { trunk.Close(); access.Close() })
	l.mu.Unlock()
	tag := []byte{0x81, 0x00, byte(vid >> 8), byte(vid)}
	go func() { // trunk → access: VLAN vid only, untagged
		buf := make([]byte, 65536)
		for {
			k, err := trunk.Read(buf)
			if err != nil {
				return
			}
			f := buf[:k]
			if k < 18 || f[12] != 0x81 || f[13] != 0x00 || int(f[14]&0x0f)<<8|int(f[15]) != vid {
				continue // untagged, or another VLAN: not this port's
			}
			out := append(append(make([]byte, 0, k-4), f[:12]...), f[16:]...)
			_, _ = access.Write(out)
		}
	}()
	go func() { // access → trunk: tagged vid
		buf := make([]byte, 65536)
		for {
			k, err := access.Read(buf)
			if err != nil {
				return
			}
			if k < 14 {
				continue
			}
			f := buf[:k]
			out := append(append(append(make([]byte, 0, k+4), f[:12]...), tag...), f[12:]...)
			_, _ = trunk.Write(out)
		}
	}()
	return seg, nil
}

// openTap creates tap name inside the lab, held open by this process
// (it goes away when closed), on bridge.
func (l *Lab) openTap(name, bridge string) (*os.File, error) {
	var f *os.File
	err := l.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("/dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap %s: %w", name, err)
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, cmd := range [][]string{{"link", "set", name, "master", bridge}, {"link", "set", name, "up"}} {
		if err := l.IP(cmd...); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Tap creates a tap device on the main bridge and returns its name.
func (l *Lab) Tap() (string, error) { return l.TapOn(bridgeName) }

// TapOn creates a tap device on bridge and returns its name.
func (l *Lab) TapOn(bridge string) (string, error) { return l.tapIn(l.NS, bridge) }

// tapIn creates a tap device on bridge inside namespace ns.
func (l *Lab) tapIn(ns *netns.NS, bridge string) (string, error) {
	l.mu.Lock()
	l.taps++
	name := fmt.Sprintf("tap%d", l.taps)
	l.mu.Unlock()
	for _, cmd := range [][]string{
		{"tuntap", "add", name, "mode", "tap"},
		{"link", "set", name, "master", bridge},
		{"link", "set", name, "up"},
	} {
		if err := ns.IP(cmd...); err != nil {
			return "", err
		}
	}
	return name, nil
}

// Describe is the lab's network as seen from tap's side, for the failure
// message of a test whose VM lost its way: the tap's link and counters, the
// bridges' forwarding entries, the namespace's neighbours, and its TCP
// sockets with their timers.
func (l *Lab) Describe(tap string) string {
	var b strings.Builder
	for _, cmd := range [][]string{
		{"ip", "-s", "-d", "link", "show", "dev", tap},
		{"ip", "-d", "link", "show", "type", "bridge"},
		{"bridge", "fdb", "show", "dynamic"},
		{"ip", "neigh", "show"},
		{"ss", "-tanoi"},
	} {
		full := append(l.Exec(), cmd...)
		out, err := exec.Command(full[0], full[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(cmd, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}

// DHCP runs dnsmasq on the main bridge, handing out addresses only (extra
// adds dnsmasq options).
func (l *Lab) DHCP(extra ...string) error {
	return l.Dnsmasq("dnsmasq", bridgeName, HostIP, "198.18.0", extra...)
}

// Dnsmasq runs dnsmasq on bridge with addresses <prefix>.100-199, router
// router, and the extra options; its log is <name>.log in the lab's
// directory.
func (l *Lab) Dnsmasq(name, bridge, router, prefix string, extra ...string) error {
	args := []string{"dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=" + bridge, "--bind-interfaces", "--except-interface=lo",
		"--dhcp-range=" + prefix + ".100," + prefix + ".199,255.255.255.0,12h",
		"--dhcp-leasefile=" + filepath.Join(l.Dir, name+".leases"),
		"--dhcp-option=option:router," + router, "--log-dhcp", "--log-facility=" + filepath.Join(l.Dir, name+".log")}
	return l.Start(name, DnsmasqReady, append(args, extra...)...)
}

// Lines that say a program of the lab has bound its sockets: dnsmasq logs
// "started" after binding them, ISC dhcpd "Server starting service." after
// opening its interfaces, and `agentboot pxe` "PXE service running" once
// every listener is open.
var (
	DnsmasqReady = regexp.MustCompile(`dnsmasq: started, version`)
	DhcpdReady   = regexp.MustCompile(`Server starting service\.`)
	PXEReady     = regexp.MustCompile(`PXE service running`)
)

// readyTimeout bounds how long a program may take to say it is ready; a
// loaded two-core machine starts one in well under a second.
const readyTimeout = time.Minute

// Start runs a long-lived program inside the namespace until the lab
// closes; its output goes to <name>.out in the lab's directory. It returns
// once the output has a line matching ready (the program has bound its
// sockets), and an error with the output if the program exits first or
// says nothing of the kind within readyTimeout: not "it has not exited
// yet", which under load let VMs boot before their DHCP server listened.
func (l *Lab) Start(name string, ready *regexp.Regexp, args ...string) error {
	return l.StartIn(l.NS, name, ready, args...)
}

// StartIn is Start inside namespace ns (a peer's or a router's).
func (l *Lab) StartIn(ns *netns.NS, name string, ready *regexp.Regexp, args ...string) error {
	full := append(ns.Exec(), args...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(l.Dir, name+".out"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	l.mu.Lock()
	l.cleanup = append(l.cleanup, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	l.mu.Unlock()
	output := func() string {
		data, _ := os.ReadFile(out.Name())
		return strings.TrimSpace(string(data))
	}
	for deadline := time.Now().Add(readyTimeout); ; {
		gone := false
		select {
		case <-exited:
			gone = true
		case <-time.After(100 * time.Millisecond):
		}
		switch {
		case ready.MatchString(output()):
			if gone {
				return fmt.Errorf("%s exited after it started: %s", name, output())
			}
			return nil
		case gone:
			return fmt.Errorf("%s exited before it was ready: %s", name, output())
		case time.Now().After(deadline):
			return fmt.Errorf("%s: no %q in its output within %s: %s", name, ready, readyTimeout, output())
		}
	}
}

// Log returns a file of the lab's directory, for a test's failure message.
func (l *Lab) Log(name string) string {
	data, err := os.ReadFile(filepath.Join(l.Dir, name))
	if err != nil {
		return err.Error()
	}
	return string(data)
}
