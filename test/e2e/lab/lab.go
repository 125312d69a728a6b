// Package lab is the VM lab of the end-to-end tests (root only): a network
// namespace with a bridge on 198.18.0.0/24, a tap per VM, dnsmasq for DHCP,
// and listeners and connections inside the namespace for agentboot's
// services, which otherwise run in the test process. Everything it creates
// goes away on every exit path, including Ctrl-C and a crashed earlier run.
package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
	Name   string
	Dir    string
	nsFile *os.File

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
	l := &Lab{Name: Prefix + strconv.Itoa(os.Getpid()), Dir: dir}
	if err := run("ip", "netns", "add", l.Name); err != nil {
		return nil, err
	}
	l.cleanup = append(l.cleanup, func() { _ = run("ip", "netns", "delete", l.Name) })
	for _, cmd := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", bridgeName, "type", "bridge"},
		{"addr", "add", HostIP + "/24", "dev", bridgeName},
		{"link", "set", bridgeName, "up"},
	} {
		if err := l.IP(cmd...); err != nil {
			l.Close()
			return nil, err
		}
	}
	f, err := os.Open(filepath.Join("/run/netns", l.Name))
	if err != nil {
		l.Close()
		return nil, err
	}
	l.nsFile = f
	l.cleanup = append(l.cleanup, func() { f.Close() })
	return l, nil
}

// RemoveStale deletes lab namespaces whose test process no longer runs.
func RemoveStale() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		pid, ok := strings.CutPrefix(name, Prefix)
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(pid); err == nil && syscall.Kill(n, 0) == nil && n != os.Getpid() {
			continue // still running
		}
		// Processes left in it (qemu, dnsmasq) go first.
		if pids, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
			for _, p := range strings.Fields(string(pids)) {
				if n, err := strconv.Atoi(p); err == nil {
					_ = syscall.Kill(n, syscall.SIGKILL)
				}
			}
		}
		_ = run("ip", "netns", "delete", name)
	}
}

// Close stops everything the lab started and deletes the namespace.
func (l *Lab) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.cleanup) - 1; i >= 0; i-- {
		l.cleanup[i]()
	}
	l.cleanup = nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// IP runs `ip` inside the namespace.
func (l *Lab) IP(args ...string) error {
	return run("ip", append([]string{"-n", l.Name}, args...)...)
}

// Tap creates a tap device on the bridge and returns its name.
func (l *Lab) Tap() (string, error) {
	l.mu.Lock()
	l.taps++
	name := fmt.Sprintf("tap%d", l.taps)
	l.mu.Unlock()
	for _, cmd := range [][]string{
		{"tuntap", "add", name, "mode", "tap"},
		{"link", "set", name, "master", bridgeName},
		{"link", "set", name, "up"},
	} {
		if err := l.IP(cmd...); err != nil {
			return "", err
		}
	}
	return name, nil
}

// Exec is the command prefix that runs a program inside the namespace.
func (l *Lab) Exec() []string { return []string{"ip", "netns", "exec", l.Name} }

// DHCP runs dnsmasq on the bridge, handing out addresses only (extra adds
// dnsmasq options).
func (l *Lab) DHCP(extra ...string) error {
	log := filepath.Join(l.Dir, "dnsmasq.log")
	args := append(l.Exec(), "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface="+bridgeName, "--bind-interfaces", "--except-interface=lo",
		"--dhcp-range="+DHCPFirst+","+DHCPLast+",255.255.255.0,12h",
		"--dhcp-leasefile="+filepath.Join(l.Dir, "dnsmasq.leases"),
		"--dhcp-option=option:router,"+HostIP, "--log-dhcp", "--log-facility="+log)
	args = append(args, extra...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := os.Create(filepath.Join(l.Dir, "dnsmasq.out")); err == nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	l.mu.Lock()
	l.cleanup = append(l.cleanup, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	l.mu.Unlock()
	return nil
}

// inNamespace runs fn on an OS thread switched into the lab's namespace;
// sockets fn creates stay in it.
func (l *Lab) inNamespace(fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Setns(int(l.nsFile.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", l.Name, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with its goroutine.
		return fmt.Errorf("setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen opens a listener inside the namespace.
func (l *Lab) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.inNamespace(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet socket inside the namespace.
func (l *Lab) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := l.inNamespace(func() error {
		var err error
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

// Dial connects from inside the namespace.
func (l *Lab) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.inNamespace(func() error {
		var err error
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Run runs a command inside the namespace.
func (l *Lab) Run(ctx context.Context, args ...string) ([]byte, error) {
	full := append(l.Exec(), args...)
	return exec.CommandContext(ctx, full[0], full[1:]...).CombinedOutput()
}
