// Package netns makes named network namespaces for tests and benchmarks
// (root only) and opens sockets inside them from this process. Namespaces
// are named <prefix><pid>[-suffix]; one whose process is gone is removed by
// RemoveStale, so a crashed run leaves nothing behind for long.
package netns

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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NS is one network namespace.
type NS struct {
	Name string
	file *os.File
}

// New creates namespace name with its loopback up.
func New(name string) (*NS, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("network namespaces need root")
	}
	if err := Run("ip", "netns", "add", name); err != nil {
		return nil, err
	}
	ns := &NS{Name: name}
	if err := ns.IP("link", "set", "lo", "up"); err != nil {
		ns.Close()
		return nil, err
	}
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		ns.Close()
		return nil, err
	}
	ns.file = f
	return ns, nil
}

// Close kills what still runs in the namespace and deletes it.
func (ns *NS) Close() {
	killIn(ns.Name)
	if ns.file != nil {
		ns.file.Close()
	}
	_ = Run("ip", "netns", "delete", ns.Name)
}

// RemoveStale deletes namespaces named prefix<pid>… whose process is gone.
func RemoveStale(prefix string) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && syscall.Kill(n, 0) == nil {
			continue // still running
		}
		killIn(name)
		_ = Run("ip", "netns", "delete", name)
	}
}

// killIn kills the processes left in a namespace (qemu, dnsmasq, ...).
func killIn(name string) {
	pids, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, p := range strings.Fields(string(pids)) {
		if n, err := strconv.Atoi(p); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	}
}

// Run runs a command and returns its output in the error when it fails.
func Run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// IP runs `ip` inside the namespace.
func (ns *NS) IP(args ...string) error {
	return Run("ip", append([]string{"-n", ns.Name}, args...)...)
}

// Exec is the command prefix that runs a program inside the namespace.
func (ns *NS) Exec() []string { return []string{"ip", "netns", "exec", ns.Name} }

// Command is a command that runs inside the namespace.
func (ns *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	full := append(append(ns.Exec(), name), args...)
	return exec.CommandContext(ctx, full[0], full[1:]...)
}

// Do runs fn on an OS thread switched into the namespace; sockets fn
// creates stay in it and may be used from any goroutine.
func (ns *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Setns(int(ns.file.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns.Name, err)
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
func (ns *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := ns.Do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet socket inside the namespace.
func (ns *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := ns.Do(func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

// Dial connects from inside the namespace.
func (ns *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Batch runs `ip -batch` over lines, one ip command each (without the
// leading "ip").
func Batch(lines []string) error { return batch(nil, lines) }

// Batch runs `ip -batch` over lines inside the namespace.
func (ns *NS) Batch(lines []string) error { return batch([]string{"-n", ns.Name}, lines) }

func batch(opts, lines []string) error {
	cmd := exec.Command("ip", append(opts, "-batch", "-")...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -batch: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NewMany creates the namespaces named, all in one `ip -batch`, and opens
// them; their loopbacks stay down. Many hundreds take a fraction of a
// second, where New takes two commands each.
func NewMany(names []string) ([]*NS, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("network namespaces need root")
	}
	lines := make([]string, len(names))
	for i, n := range names {
		lines[i] = "netns add " + n
	}
	if err := Batch(lines); err != nil {
		// Those made before the failure are gone with the rest.
		DeleteMany(names)
		return nil, err
	}
	nss := make([]*NS, len(names))
	for i, n := range names {
		f, err := os.Open(filepath.Join("/run/netns", n))
		if err != nil {
			CloseMany(nss)
			return nil, err
		}
		nss[i] = &NS{Name: n, file: f}
	}
	return nss, nil
}

// CloseMany deletes namespaces made by NewMany (nil entries are skipped);
// nothing must run in them.
func CloseMany(nss []*NS) {
	var names []string
	for _, ns := range nss {
		if ns != nil {
			ns.file.Close()
			names = append(names, ns.Name)
		}
	}
	DeleteMany(names)
}

// DeleteMany deletes the namespaces named, in one `ip -batch` that goes on
// past those already gone.
func DeleteMany(names []string) {
	lines := make([]string, len(names))
	for i, n := range names {
		lines[i] = "netns delete " + n
	}
	cmd := exec.Command("ip", "-force", "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	_ = cmd.Run()
}

// Open opens an existing namespace, made by another process of the run.
func Open(name string) (*NS, error) {
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		return nil, err
	}
	return &NS{Name: name, file: f}, nil
}
