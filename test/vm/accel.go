package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/internal/atomicfile"
	"github.com/agentboot/agentboot/internal/kvmguest"
)

// Accel is the qemu accelerator x86_64 VMs use, and why.
type Accel struct {
	// Name is qemu's -accel value: "kvm" or "tcg" (or what
	// AGENTBOOT_QEMU_ACCEL says).
	Name string `json:"accel"`
	// Evidence classifies the reason: see the Evidence constants.
	Evidence Evidence `json:"evidence"`
	// Reason says what was seen, in words.
	Reason string `json:"reason"`
	// At is when it was decided.
	At time.Time `json:"at"`
	// Key names what the answer depends on (probeKey); a memo with
	// another key is probed again.
	Key string `json:"key"`
	// Source is where this process got the answer: "probed now", the memo
	// file, or the environment variable.
	Source string `json:"-"`
}

// Evidence is what an accelerator choice rests on.
type Evidence string

const (
	// KVMRan: a guest under `qemu -accel kvm` reached the dev kernel's
	// first line on its serial console. The only evidence that chooses KVM.
	KVMRan Evidence = "kvm-ran"
	// NoKVM: /dev/kvm does not open, or KVM could not run the tiny test
	// guest the on-host agent runs (internal/kvmguest).
	NoKVM Evidence = "no-kvm"
	// QEMUFailed: qemu reported a KVM failure before the guest's kernel
	// spoke, or stopped a VM test's guest under KVM later.
	QEMUFailed Evidence = "qemu-failed"
	// NoProgress: the guest did not reach the kernel within the probe's
	// bounds (a paused or stalled guest), or qemu ended first without
	// naming KVM. Not proof that KVM is broken, only no proof that it
	// works: TCG is the side that cannot hang.
	NoProgress Evidence = "no-progress"
	// Override: AGENTBOOT_QEMU_ACCEL chose.
	Override Evidence = "override"
)

func (a Accel) String() string {
	return fmt.Sprintf("x86_64 VMs use %s: %s (%s)", strings.ToUpper(a.Name), a.Reason, a.Source)
}

// The KVM probe's bounds. Reaching the kernel under working KVM costs qemu
// about a CPU second; the CPU budget is what a guest gets to get there,
// counted in qemu's own CPU time, so that a loaded machine (which slows the
// wall clock, not the guest's work) cannot change the answer. The wall limit
// only catches a guest that gets no CPU at all (paused); both expire to TCG.
const (
	probeCPUBudget = 30 * time.Second
	probeWallLimit = 2 * time.Minute
	// probeVersion is part of the memo's key: a change to what the probe
	// checks makes every memo stale.
	probeVersion = "2"
)

// kernelFirstLine is the dev kernel's first line on the serial console
// ("[    0.000000] Linux version 6.1.0-…"): SeaBIOS, ISOLINUX (real mode,
// where a KVM that cannot emulate stops) and the kernel's decompressor ran.
var kernelFirstLine = regexp.MustCompile(`Linux version \d`)

// kvmFailure matches what qemu prints when KVM stops a guest it had
// started (qemu then pauses the guest and keeps running) or cannot start.
var kvmFailure = regexp.MustCompile(`KVM internal error|kvm run failed|KVM: entry failed|failed to initialize kvm|Could not access KVM`)

// EnvAccel overrides the probe: a qemu -accel value ("tcg", "kvm").
const EnvAccel = "AGENTBOOT_QEMU_ACCEL"

var (
	accelMu sync.Mutex
	chosen  *Accel // this process's answer, once known
)

// Accelerators lists qemu -accel values for x86_64 VMs: KVM only when a guest
// has been seen running under it, else TCG (see Choose).
func Accelerators() []string { return []string{Choose().Name} }

// Choose returns the accelerator for x86_64 VMs: AGENTBOOT_QEMU_ACCEL when
// set; else this machine's memo when its key still matches; else a probe,
// whose answer becomes the memo. A KVM failure seen later in any VM turns
// the answer to TCG for this process and the memo (kvmStopped).
func Choose() Accel {
	if a := os.Getenv(EnvAccel); a != "" {
		return Accel{Name: a, Evidence: Override, Reason: "set by " + EnvAccel, Source: "environment", At: time.Now()}
	}
	accelMu.Lock()
	defer accelMu.Unlock()
	if chosen == nil {
		a := defaultProber().remembered()
		chosen = &a
	}
	return *chosen
}

// kvmStopped records that qemu stopped a guest under KVM: this process and
// the memo use TCG from now on.
func kvmStopped(reason string) Accel {
	a := Accel{Name: "tcg", Evidence: QEMUFailed, Reason: reason, At: time.Now()}
	p := defaultProber()
	a.Key = p.key()
	a.Source = "changed during the run; kept in " + p.memo
	_ = p.save(a)
	accelMu.Lock()
	chosen = &a
	accelMu.Unlock()
	return a
}

// prober decides between KVM and TCG from evidence.
type prober struct {
	dev   string             // /dev/kvm
	guest func(string) error // kvmguest.Run
	qemu  string             // qemu-system-x86_64
	iso   string             // the dev OS ISO the probe boots
	memo  string             // where the answer is kept
	cpu   time.Duration      // qemu CPU time without the kernel's line: TCG
	wall  time.Duration      // wall time without the kernel's line: TCG
}

func defaultProber() prober {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		qemu = "qemu-system-x86_64"
	}
	return prober{
		dev:   "/dev/kvm",
		guest: kvmguest.Run,
		qemu:  qemu,
		iso:   filepath.Join(repoRoot(), "dist", "dev-image", "agentboot-dev-live.x86_64.iso"),
		memo:  filepath.Join(CacheDir(), "vm-accel.json"),
		cpu:   probeCPUBudget,
		wall:  probeWallLimit,
	}
}

// CacheDir is the user's agentboot cache: $AGENTBOOT_CACHE (the Makefile
// sets it), else ~/.cache/agentboot.
func CacheDir() string {
	if d := os.Getenv("AGENTBOOT_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "agentboot")
	}
	return filepath.Join(os.TempDir(), "agentboot-cache")
}

// key names everything the answer depends on: the probe, this boot of the
// machine (kernel, KVM module parameters, the hypervisor below), /dev/kvm's
// node (a reloaded KVM module makes a new one), the qemu binary and the ISO
// the probe boots (size and modification time).
func (p prober) key() string {
	parts := []string{"probe " + probeVersion}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	parts = append(parts, "boot "+strings.TrimSpace(string(boot)))
	for _, f := range []string{p.dev, p.qemu, p.iso} {
		var st syscall.Stat_t
		if err := syscall.Stat(f, &st); err != nil {
			parts = append(parts, f+" absent")
			continue
		}
		part := fmt.Sprintf("%s %d %d %d.%09d", f, st.Rdev, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
		if f == p.dev {
			// A reloaded KVM module makes a new node; its ctime tells.
			// (Not the files': make dev-image links the ISO into dist/
			// again every time, which changes its ctime and nothing else.)
			part += fmt.Sprintf(" %d.%09d", st.Ctim.Sec, st.Ctim.Nsec)
		}
		parts = append(parts, part)
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(sum[:12])
}

// remembered returns the memo when its key matches, else probes and keeps
// the answer. Test processes started together take turns under a lock, so
// one probes and the rest read its answer.
func (p prober) remembered() Accel {
	if err := os.MkdirAll(filepath.Dir(p.memo), 0o700); err == nil {
		if lock, err := os.OpenFile(p.memo+".lock", os.O_CREATE|os.O_RDWR, 0o600); err == nil {
			defer lock.Close()
			_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
		}
	}
	key := p.key()
	if data, err := os.ReadFile(p.memo); err == nil {
		var a Accel
		if json.Unmarshal(data, &a) == nil && a.Key == key && (a.Name == "kvm" || a.Name == "tcg") {
			a.Source = fmt.Sprintf("remembered in %s since %s; delete it to probe again", p.memo, a.At.Format(time.RFC3339))
			return a
		}
	}
	a := p.probe()
	a.Key, a.At = key, time.Now()
	a.Source = "probed now; kept in " + p.memo
	if err := p.save(a); err != nil {
		a.Source = fmt.Sprintf("probed now; not kept: %v", err)
	}
	return a
}

func (p prober) save(a Accel) error {
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.memo), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(p.memo, append(data, '\n'), 0o600)
}

// probe chooses KVM only on positive evidence: /dev/kvm opens, the agent's
// own test guest runs (so the harness never uses a KVM the agent would call
// unusable), and a real guest under qemu's KVM reaches its kernel's first
// line. Anything else, including silence, is TCG.
func (p prober) probe() Accel {
	f, err := os.OpenFile(p.dev, os.O_RDWR, 0)
	if err != nil {
		return Accel{Name: "tcg", Evidence: NoKVM, Reason: fmt.Sprintf("%s does not open: %v", p.dev, err)}
	}
	f.Close()
	if err := p.guest(p.dev); err != nil {
		return Accel{Name: "tcg", Evidence: NoKVM, Reason: fmt.Sprintf("%s opens but KVM cannot run the agent's test guest: %v", p.dev, err)}
	}
	if _, err := os.Stat(p.iso); err != nil {
		return Accel{Name: "tcg", Evidence: NoProgress, Reason: fmt.Sprintf("KVM runs the agent's test guest, but there is no dev ISO to prove a real boot with (%v; make dev-image)", err)}
	}
	return p.boot("kvm")
}

// boot boots the dev ISO with -accel accel until the kernel's first line
// (the answer is accel), a KVM failure, qemu's end, or a bound (TCG). Only
// the probe's KVM boot and a test of the kernel line (under TCG) call it.
func (p prober) boot(accel string) Accel {
	q := "qemu -accel " + accel
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var reached, failure string
	cmd := exec.CommandContext(ctx, p.qemu, "-accel", accel, "-m", "256", "-display", "none", "-monitor", "none",
		"-serial", "stdio", "-no-reboot", "-nic", "none", "-boot", "d", "-cdrom", p.iso)
	cmd.Stdout = &lines{fn: func(line string) {
		if kernelFirstLine.MatchString(line) {
			mu.Lock()
			reached = line
			mu.Unlock()
		}
	}}
	stderr := &lines{fn: func(line string) {
		if kvmFailure.MatchString(line) {
			mu.Lock()
			if failure == "" {
				failure = line
			}
			mu.Unlock()
		}
	}}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second // a child holding qemu's output open
	if err := cmd.Start(); err != nil {
		return Accel{Name: "tcg", Evidence: QEMUFailed, Reason: fmt.Sprintf("start %s: %v", p.qemu, err)}
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		cancel() // kills qemu
		<-exited
	}()
	clock := processCPUClock(cmd.Process.Pid)
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done := false
		select {
		case <-exited:
			done = true
		case <-tick.C:
		}
		used := cpuTime(clock)
		mu.Lock()
		r, fail := reached, failure
		mu.Unlock()
		took := fmt.Sprintf("after %s, qemu using %s of CPU", time.Since(start).Round(100*time.Millisecond), used.Round(100*time.Millisecond))
		switch {
		case fail != "":
			return Accel{Name: "tcg", Evidence: QEMUFailed, Reason: fmt.Sprintf("%s stopped the dev ISO's boot %s: %s", q, took, fail)}
		case r != "":
			return Accel{Name: accel, Evidence: KVMRan, Reason: fmt.Sprintf("a guest under %s reached the dev kernel's first line %s", q, took)}
		case done:
			return Accel{Name: "tcg", Evidence: NoProgress, Reason: fmt.Sprintf("%s ended before the dev kernel's first line (%v): %s", q, waitErr, stderr.tail())}
		case used >= p.cpu:
			return Accel{Name: "tcg", Evidence: NoProgress, Reason: fmt.Sprintf("no dev kernel line under %s %s", q, took)}
		case time.Since(start) >= p.wall:
			return Accel{Name: "tcg", Evidence: NoProgress, Reason: fmt.Sprintf("no dev kernel line under %s %s: a paused or stalled guest", q, took)}
		}
	}
}

// processCPUClock is the clock ID of a process's CPU time (the kernel's
// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)): all its threads, guest mode
// included.
func processCPUClock(pid int) int32 { return int32(^pid<<3 | 2) }

// cpuTime reads a CPU-time clock; an ended process reads as zero.
func cpuTime(clock int32) time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(clock, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// lines is a Writer that hands each whole line written to it, without its
// line ending, to fn (from the writing goroutine), passes everything on to
// out when set, and keeps the last lines for messages.
type lines struct {
	fn      func(string)
	out     io.Writer
	mu      sync.Mutex
	partial []byte
	last    []string
}

func (l *lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, b...)
	var whole []string
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		whole = append(whole, strings.TrimRight(string(l.partial[:i]), "\r"))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 64<<10 { // a line that never ends is judged in pieces
		whole = append(whole, string(l.partial))
		l.partial = nil
	}
	l.last = append(l.last, whole...)
	if len(l.last) > 10 {
		l.last = l.last[len(l.last)-10:]
	}
	l.mu.Unlock()
	for _, line := range whole {
		l.fn(line)
	}
	if l.out != nil {
		return l.out.Write(b)
	}
	return len(b), nil
}

// tail is the last lines written, joined.
func (l *lines) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(append(l.last, string(l.partial)), " | ")
}

// ErrKVMStopped is what a VM's waits return when qemu stopped its guest
// under KVM ("KVM internal error"): the test fails at once, with qemu's
// reason, instead of at its boot timeout.
var ErrKVMStopped = errors.New("qemu stopped the guest under KVM")
