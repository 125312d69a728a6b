package bmcsim

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/agentboot/agentboot/test/testenv"
)

// IPMIOptions configure an IPMI BMC.
type IPMIOptions struct {
	User, Password string // no spaces or quotes: ipmi_sim's config syntax
	Addr           string // IP to listen on (127.0.0.1 by default)
	Port           int
	Machine        Machine
	// Timing makes power transitions take time (see Timing).
	Timing Timing
}

// IPMI is a real IPMI-over-LAN BMC (OpenIPMI's ipmi_sim) whose chassis
// control program drives a Machine.
type IPMI struct {
	o       IPMIOptions
	ch      *chassis
	dir     string
	logPath string
	ln      net.Listener

	mu     sync.Mutex
	boot   string
	events []string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

var (
	chassisOnce sync.Once
	chassisBin  string
	chassisErr  error
)

// chassisProgram builds the chassis control program once per test binary.
func chassisProgram() (string, error) {
	chassisOnce.Do(func() {
		dir, err := testenv.ProcessTempDir("agentboot-chassis-")
		if err != nil {
			chassisErr = err
			return
		}
		chassisBin = filepath.Join(dir, "chassis")
		out, err := exec.Command("go", "build", "-o", chassisBin, "github.com/agentboot/agentboot/test/bmcsim/chassis").CombinedOutput()
		if err != nil {
			chassisErr = fmt.Errorf("build the chassis program: %v\n%s", err, out)
		}
	})
	return chassisBin, chassisErr
}

// StartIPMI runs ipmi_sim for the duration of t.
func StartIPMI(t testing.TB, o IPMIOptions) *IPMI {
	t.Helper()
	if _, err := exec.LookPath("ipmi_sim"); err != nil {
		t.Fatal("ipmi_sim not found: install Debian packages openipmi and ipmitool (.ci/packages)")
	}
	if _, err := exec.LookPath("ipmitool"); err != nil {
		t.Fatal("ipmitool not found: install Debian package ipmitool (.ci/packages)")
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1"
	}
	prog, err := chassisProgram()
	if err != nil {
		t.Fatal(err)
	}
	// A short directory: Unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ipmisim-")
	if err != nil {
		t.Fatal(err)
	}
	b := &IPMI{o: o, dir: dir, logPath: filepath.Join(dir, "ipmi_sim.log")}
	b.ch = &chassis{m: o.Machine, timing: o.Timing, clock: clock.RealClock{}, note: func(ev string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.events = append(b.events, ev)
	}}
	sock := filepath.Join(dir, "chassis.sock")
	if b.ln, err = net.Listen("unix", sock); err != nil {
		t.Fatal(err)
	}
	go b.serve()
	guid := make([]byte, 16)
	_, _ = rand.Read(guid)
	conf := fmt.Sprintf(`name "agentboot"
set_working_mc 0x20
  startlan 1
    addr %s %d
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid %s
  endlan
  chassis_control "%s -socket %s 0x20"
  user 2 true "%s" "%s" admin 10 none md2 md5 straight
`, o.Addr, o.Port, hex.EncodeToString(guid), prog, sock, o.User, o.Password)
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nsel_enable 0x20 1000 0x0a\nmc_enable 0x20\n"
	for name, body := range map[string]string{"lan.conf": conf, "sim.emu": emu} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Stop()
		b.ln.Close()
		b.ch.close()
		if t.Failed() {
			log, _ := os.ReadFile(b.logPath)
			t.Logf("ipmi_sim log (%s):\n%s", b.logPath, log)
			return
		}
		os.RemoveAll(dir)
	})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	return b
}

// Start (re)starts ipmi_sim; Stop and Start simulate a BMC outage.
func (b *IPMI) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return nil
	}
	args := append([]string(nil), "ipmi_sim", "-c", filepath.Join(b.dir, "lan.conf"),
		"-f", filepath.Join(b.dir, "sim.emu"), "-s", filepath.Join(b.dir, "state"), "-n")
	logf, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start ipmi_sim: %w", err)
	}
	b.cmd, b.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(b.exited)
	// Ready when it answers: an ASF presence ping (RMCP, which IPMI-over-LAN
	// BMCs answer before any session) gets a pong. Not "it has not exited
	// yet": a BMC that fails later, or listens late on a loaded machine,
	// made tests run against no BMC at all.
	if err := b.awaitPong(60 * time.Second); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
		b.cmd = nil
		return fmt.Errorf("ipmi_sim on %s: %w; see %s", net.JoinHostPort(b.o.Addr, fmt.Sprint(b.o.Port)), err, b.logPath)
	}
	return nil
}

// presencePing is an RMCP ASF Presence Ping (DSP0136): RMCP version 6, no
// acknowledgement (sequence 0xff), class ASF; IANA 4542, type 0x80, tag.
var presencePing = []byte{0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x5a, 0x00, 0x00}

// awaitPong pings ipmi_sim until a Presence Pong (type 0x40, our tag) comes
// back, ipmi_sim exits, or timeout passes.
func (b *IPMI) awaitPong(timeout time.Duration) error {
	conn, err := net.Dial("udp", net.JoinHostPort(b.o.Addr, fmt.Sprint(b.o.Port)))
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64)
	for time.Now().Before(deadline) {
		select {
		case <-b.exited:
			return errors.New("it exited before answering")
		default:
		}
		if _, err := conn.Write(presencePing); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := conn.Read(buf) // "connection refused" until it listens
		if err == nil && n >= 10 && buf[3] == 0x06 && buf[8] == 0x40 && buf[9] == presencePing[9] {
			return nil
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return fmt.Errorf("no answer to an RMCP presence ping within %s", timeout)
}

// Stop kills ipmi_sim; the machine keeps its power state.
func (b *IPMI) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.exited
	b.cmd = nil
}

// Events lists what the chassis did: "boot pxe", "power on pxe", "power off".
func (b *IPMI) Events() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.events...)
}

func (b *IPMI) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			reply, err := b.chassis(strings.Fields(line))
			if err != nil {
				reply = "error: " + err.Error()
			}
			fmt.Fprintln(c, reply)
		}()
	}
}

// chassis answers one chassis_control call. ipmi_sim turns an error into
// a failed completion code, as a busy BMC answers.
func (b *IPMI) chassis(f []string) (string, error) {
	switch strings.Join(f, " ") {
	case "get power":
		// IPMI knows only on and off: a transition reads as the old state.
		if st := b.ch.state(); st == On || st == PoweringOff {
			return "power:1", nil
		}
		return "power:0", nil
	case "get boot":
		b.mu.Lock()
		defer b.mu.Unlock()
		return "boot:" + orDefault(b.boot, "default"), nil
	case "set power 1":
		_, err := b.ch.powerOn(b.bootDevice)
		return "", err
	case "set power 0":
		return "", b.ch.powerOff(false)
	case "set shutdown 1":
		return "", b.ch.powerOff(true)
	case "set reset 1":
		if b.ch.state() == Off {
			_, err := b.ch.powerOn(b.bootDevice)
			return "", err
		}
		return "", b.ch.restart(b.bootDevice)
	}
	if len(f) == 3 && f[0] == "set" && f[1] == "boot" {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch f[2] {
		case "none", "default":
			b.boot = ""
		case "pxe", "cdrom", "bios":
			b.boot = f[2]
		default:
			return "", fmt.Errorf("unknown boot device %q", f[2])
		}
		b.events = append(b.events, "boot "+orDefault(b.boot, "default"))
		return "", nil
	}
	return "", fmt.Errorf("unknown chassis request %q", strings.Join(f, " "))
}

// bootDevice is read when the platform powers on: IPMI keeps a boot
// device for one boot.
func (b *IPMI) bootDevice() (dev, cdrom string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dev = b.boot
	if dev != BootPXE && dev != BootCDROM {
		dev = BootDefault
	}
	b.boot = ""
	b.events = append(b.events, "power on "+orDefault(dev, "default"))
	return dev, ""
}
