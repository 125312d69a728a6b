// Package vm runs qemu virtual machines for tests: KVM when it works, TCG
// otherwise, with the serial console captured to a log file that is kept
// when a test fails. Every VM is killed when its test ends.
package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options describe one VM.
type Options struct {
	Name string
	// Arch is the machine: x86_64 (the default, a PC) or aarch64 (qemu's
	// "virt" board with UEFI from AAVMF, EL2 emulated so that the guest can
	// run KVM guests of its own, a GICv3 and a PL011 serial console).
	Arch     string
	MemoryMB int
	CPUs     int
	// CPU model, such as "qemu64,-svm"; empty is qemu's default.
	CPU string
	// UUID is the SMBIOS system UUID.
	UUID string
	// Serial is the SMBIOS system serial number.
	Serial string
	// Boot order for qemu's -boot (d: CD, n: network, c: disk).
	Boot string
	// BootOnce is the device of the first boot only, as a BMC's one-time
	// boot override; later boots follow Boot (BIOS only).
	BootOnce string
	// Reboot lets a guest reboot restart the firmware, as a server does;
	// by default qemu ends instead (-no-reboot).
	Reboot bool
	// CDROM is an ISO to insert.
	CDROM string
	// Disks are raw or qcow2 disk images (virtio).
	Disks []string
	// DiskWriteBPS caps the write rate of every disk (bytes per second,
	// qemu's throttling, which counts Write Zeroes too), for a disk as slow
	// to erase as a real one; 0 leaves it as fast as the host.
	DiskWriteBPS int64
	// Kernel, Initrd and Append boot a kernel directly.
	Kernel, Initrd, Append string
	// Net is qemu -netdev arguments without id ("user,bootfile=...",
	// "tap,ifname=tap0,script=no,downscript=no"); empty means no network.
	Net string
	// MAC of the VM's NIC.
	MAC string
	// UEFI boots with OVMF instead of SeaBIOS (aarch64 always boots
	// with UEFI).
	UEFI bool
	// NoNICROM leaves out qemu's iPXE option ROM, so the firmware's own
	// network stack boots (OVMF's PXE, like most servers' UEFI), not iPXE.
	NoNICROM bool
	// HTTPBoot turns OVMF's PXE off (its fw_cfg switches
	// opt/org.tianocore/IPv4PXESupport and IPv6PXESupport), so that its
	// network boot is UEFI HTTP boot, as on a server whose setup enables
	// HTTP boot only. UEFI x86_64 only.
	HTTPBoot bool
	// PXEv6Only turns OVMF's IPv4 PXE off (fw_cfg
	// opt/org.tianocore/IPv4PXESupport), so that its network boot starts
	// with PXE over IPv6, as on a server set to boot over IPv6 only: OVMF
	// would otherwise wait out DHCPv4 first. UEFI x86_64 only.
	PXEv6Only bool
	// SecureBoot boots OVMF's Secure Boot build with Microsoft's keys
	// enrolled and Secure Boot enforced (Debian's OVMF_VARS_4M.ms.fd), on
	// the q35 machine with SMM, which that build needs. UEFI x86_64 only.
	SecureBoot bool
	// Prefix runs qemu through another command (`ip netns exec <ns>`).
	Prefix []string
	// Extra qemu arguments.
	Extra []string
}

// VM is a running qemu.
type VM struct {
	Name    string
	LogPath string
	// Started is when qemu started: the power-on of the machine.
	Started time.Time
	cmd     *exec.Cmd
	done    chan struct{}
	mu      sync.Mutex
	exitErr error
	ran     time.Duration // until qemu ended
	// stopped says why qemu stopped the guest under KVM (set before the
	// VM is killed for it; read after done closes).
	stopped error
}

// LogDir is where serial logs go; they survive a failed test, and every
// test with AGENTBOOT_KEEP_VM_LOGS=1.
func LogDir() string {
	if d := os.Getenv("AGENTBOOT_TEST_LOGS"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "agentboot-test-logs")
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Start boots a VM for the duration of t.
func Start(t testing.TB, o Options) *VM {
	t.Helper()
	v, err := StartVM(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// StartVM is Start returning its error instead of failing t, for callers
// outside the test's goroutine (a simulated BMC powering a Machine on).
func StartVM(t testing.TB, o Options) (*VM, error) {
	arm := o.Arch == "aarch64"
	var accel Accel // x86_64's choice
	if o.Arch != "" && o.Arch != "x86_64" && !arm {
		return nil, fmt.Errorf("vm: unknown architecture %q (x86_64, aarch64)", o.Arch)
	}
	qemu, packages := "qemu-system-x86_64", "qemu-system-x86 and ipxe-qemu"
	if arm {
		qemu, packages = "qemu-system-aarch64", "qemu-system-arm and qemu-efi-aarch64"
		o.UEFI = true
	}
	bin, err := exec.LookPath(qemu)
	if err != nil {
		return nil, fmt.Errorf("%s not found: install Debian packages %s (.ci/packages)", qemu, packages)
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 1024
	}
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	if err := os.MkdirAll(LogDir(), 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(LogDir(), fmt.Sprintf("%s-%s-%d.log", sanitize(t.Name()), o.Name, time.Now().UnixNano()))
	args := []string{"-name", o.Name, "-m", fmt.Sprint(o.MemoryMB), "-smp", fmt.Sprint(o.CPUs),
		"-nographic", "-display", "none", "-monitor", "none",
		"-serial", "file:" + logPath}
	if !o.Reboot {
		args = append(args, "-no-reboot")
	}
	if arm {
		// Always emulated (TCG), also on an Arm host; "max" has every feature TCG
		// implements (VHE, nested virtualization at EL2). Pointer
		// authentication stays, computed by QEMU's cheap implementation-defined
		// algorithm instead of QARMA, which TCG spends most of an arm64
		// kernel's time on: `agent install` and the boot from disk took 143 s
		// with QARMA, 52-66 s with it (test/boot, 2026-11-26).
		args = append(args, "-M", "virt,virtualization=on,gic-version=3", "-accel", "tcg")
		if o.CPU == "" {
			o.CPU = "max,pauth-impdef=on"
		}
	} else {
		accel = Choose()
		a := accel.Name
		if strings.HasPrefix(a, "tcg") && !strings.Contains(a, "thread=") && o.CPUs > 1 {
			// One host thread runs all vCPUs in turn. With a thread each
			// (QEMU 7.2's default), 2-vCPU x86 guests froze twice in CI:
			// once in getrandom right after the kernel patched its
			// crng-ready static key (soft lockup, 424 s), once waiting in
			// kvm_destroy_vm for an IPI, as if a vCPU kept executing code
			// another had just patched. Not reproduced on demand (8 runs
			// under load); none since with one thread.
			a += ",thread=single"
		}
		args = append(args, "-accel", a)
	}
	if o.CPU != "" {
		args = append(args, "-cpu", o.CPU)
	}
	if (o.HTTPBoot || o.PXEv6Only) && (!o.UEFI || arm) {
		return nil, fmt.Errorf("vm %s: HTTPBoot and PXEv6Only need UEFI on x86_64 (OVMF)", o.Name)
	}
	if o.HTTPBoot || o.PXEv6Only {
		args = append(args, "-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n")
	}
	if o.HTTPBoot {
		args = append(args, "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
	}
	if o.UUID != "" {
		args = append(args, "-uuid", o.UUID)
	}
	if o.Serial != "" {
		args = append(args, "-smbios", "type=1,serial="+o.Serial)
	}
	switch {
	case arm:
		vars := filepath.Join(t.TempDir(), "AAVMF_VARS.fd")
		if err := copyFile("/usr/share/AAVMF/AAVMF_VARS.fd", vars); err != nil {
			return nil, fmt.Errorf("AAVMF firmware: %v (install Debian package qemu-efi-aarch64)", err)
		}
		args = append(args, "-drive", "if=pflash,format=raw,readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd", "-drive", "if=pflash,format=raw,file="+vars)
	case o.SecureBoot:
		if !o.UEFI {
			return nil, fmt.Errorf("vm %s: SecureBoot needs UEFI", o.Name)
		}
		vars := filepath.Join(t.TempDir(), "OVMF_VARS.fd")
		if err := copyFile("/usr/share/OVMF/OVMF_VARS_4M.ms.fd", vars); err != nil {
			return nil, fmt.Errorf("OVMF firmware: %v (install Debian package ovmf)", err)
		}
		args = append(args, "-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.secboot.fd",
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	case o.UEFI:
		vars := filepath.Join(t.TempDir(), "OVMF_VARS.fd")
		if err := copyFile("/usr/share/OVMF/OVMF_VARS_4M.fd", vars); err != nil {
			return nil, fmt.Errorf("OVMF firmware: %v (install Debian package ovmf)", err)
		}
		args = append(args, "-drive", "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd", "-drive", "if=pflash,format=raw,file="+vars)
	}
	switch {
	case o.CDROM != "" && arm:
		// The virt board has no IDE: the CD is on virtio-scsi, as a
		// BMC's virtual media is a USB or SCSI CD on a server.
		args = append(args, "-device", "virtio-scsi-pci,id=scsi0",
			"-drive", "if=none,id=cd0,media=cdrom,readonly=on,format=raw,file="+o.CDROM, "-device", "scsi-cd,drive=cd0,bus=scsi0.0")
	case o.CDROM != "":
		args = append(args, "-cdrom", o.CDROM)
	}
	// Disks stay thin, as on a SAN: what a guest discards or zeroes (a
	// sanitized host) becomes a hole in the image, not gigabytes of zeros.
	thin := "discard=unmap,detect-zeroes=unmap"
	if o.DiskWriteBPS > 0 {
		thin += fmt.Sprintf(",throttling.bps-write=%d", o.DiskWriteBPS)
	}
	// OVMF follows bootindex, not -boot, to boot from the network first.
	netFirst := o.UEFI && strings.HasPrefix(o.Boot, "n")
	for i, d := range o.Disks {
		if arm || netFirst {
			dev := fmt.Sprintf("virtio-blk-pci,drive=disk%d", i)
			if netFirst {
				// UEFI firmware prunes the boot options of devices qemu's
				// boot order leaves out: the disks come after the network,
				// as on a server booting the network first.
				dev += fmt.Sprintf(",bootindex=%d", i+2)
			}
			args = append(args, "-drive", fmt.Sprintf("file=%s,if=none,id=disk%d,format=%s,%s", d, i, diskFormat(d), thin), "-device", dev)
			continue
		}
		args = append(args, "-drive", fmt.Sprintf("file=%s,if=virtio,index=%d,format=%s,%s", d, i, diskFormat(d), thin))
	}
	if o.Kernel != "" {
		args = append(args, "-kernel", o.Kernel, "-initrd", o.Initrd, "-append", o.Append)
	}
	switch {
	case arm:
		// UEFI boot order: bootindex, below.
	case o.BootOnce != "" && !o.UEFI:
		args = append(args, "-boot", "order="+o.Boot+",once="+o.BootOnce)
	case o.Boot != "" && !netFirst:
		args = append(args, "-boot", o.Boot)
	}
	if o.Net != "" {
		args = append(args, "-netdev", o.Net+",id=n0")
		dev := "virtio-net-pci,netdev=n0"
		if o.MAC != "" {
			dev += ",mac=" + o.MAC
		}
		if o.NoNICROM || arm {
			// (AAVMF has its own virtio-net driver; qemu's iPXE ROMs are x86.)
			dev += ",romfile="
		}
		if netFirst {
			dev += ",bootindex=1"
		}
		args = append(args, "-device", dev)
	} else {
		args = append(args, "-nic", "none")
	}
	args = append(args, o.Extra...)

	v := &VM{Name: o.Name, LogPath: logPath, done: make(chan struct{})}
	full := append(append(append([]string(nil), o.Prefix...), bin), args...)
	v.cmd = exec.Command(full[0], full[1:]...)
	stderr, err := os.Create(logPath + ".qemu")
	if err != nil {
		return nil, err
	}
	// qemu reports a KVM failure on stderr and pauses the guest: the VM
	// is stopped at once with that reason, and every later VM uses TCG.
	watch := &lines{out: stderr, fn: func(line string) {
		if !strings.HasPrefix(accel.Name, "kvm") || !kvmFailure.MatchString(line) || v.stopped != nil {
			return
		}
		now := kvmStopped(fmt.Sprintf("VM %s of %s stopped under KVM: %s", o.Name, t.Name(), line))
		v.stopped = fmt.Errorf("%w: %s (%s from now on)", ErrKVMStopped, line, now)
		t.Errorf("VM %s: %v", o.Name, v.stopped)
		_ = v.cmd.Process.Kill()
	}}
	v.cmd.Stdout, v.cmd.Stderr = watch, watch
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		stderr.Close()
		return nil, fmt.Errorf("start qemu: %v", err)
	}
	started := time.Now()
	v.Started = started
	go func() {
		err := v.cmd.Wait()
		stderr.Close()
		v.mu.Lock()
		v.exitErr, v.ran = err, time.Since(started)
		v.mu.Unlock()
		close(v.done)
	}()
	t.Cleanup(func() {
		v.Kill()
		// What a boot costs is what the suite's time is made of under TCG.
		if ps := v.cmd.ProcessState; ps != nil {
			t.Logf("VM %s ran %s; qemu used %s of CPU", o.Name, v.ran.Round(100*time.Millisecond), (ps.UserTime() + ps.SystemTime()).Round(100*time.Millisecond))
		}
		switch {
		case t.Failed():
			t.Logf("VM %s serial log kept at %s; its last lines:\n%s", o.Name, logPath, v.Tail(40))
		case os.Getenv("AGENTBOOT_KEEP_VM_LOGS") == "1":
			t.Logf("VM %s serial log kept at %s", o.Name, logPath)
		default:
			os.Remove(logPath)
			os.Remove(logPath + ".qemu")
		}
	})
	return v, nil
}

func diskFormat(p string) string {
	if strings.HasSuffix(p, ".qcow2") {
		return "qcow2"
	}
	return "raw"
}

func sanitize(s string) string {
	return regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(s, "_")
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// Kill stops the VM.
func (v *VM) Kill() {
	select {
	case <-v.done:
	default:
		_ = v.cmd.Process.Kill()
		<-v.done
	}
}

// Exited reports whether qemu has ended.
func (v *VM) Exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Log returns the serial console output so far.
func (v *VM) Log() string {
	data, _ := os.ReadFile(v.LogPath)
	return string(data)
}

// Tail returns the last n lines of the serial log and qemu's own output.
func (v *VM) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(v.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	qemu, _ := os.ReadFile(v.LogPath + ".qemu")
	out := strings.Join(lines, "\n")
	if len(qemu) > 0 {
		out += "\n--- qemu:\n" + string(qemu)
	}
	return out
}

// ErrExited is returned by WaitFor when qemu ends first.
var ErrExited = errors.New("qemu exited")

// WaitFor waits until the serial log has a line matching re, and returns it.
// It returns at once when qemu ends first (ErrExited), or when qemu stopped
// the guest under KVM (ErrKVMStopped).
func (v *VM) WaitFor(ctx context.Context, re *regexp.Regexp, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		exited := v.Exited() // before reading: a line written just before the end counts
		if line := v.find(re); line != "" {
			return line, nil
		}
		if exited {
			if err := v.Err(); err != nil {
				return "", err
			}
			return "", fmt.Errorf("%w before %q appeared", ErrExited, re)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q in the serial log of %s after %s", re, v.Name, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-v.done:
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Err is why qemu stopped the guest under KVM (wrapping ErrKVMStopped), once
// it has ended; nil otherwise.
func (v *VM) Err() error {
	if !v.Exited() {
		return nil
	}
	return v.stopped
}

func (v *VM) find(re *regexp.Regexp) string {
	f, err := os.Open(v.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			return sc.Text()
		}
	}
	return ""
}

// Machine is a server made of VMs: each power-on boots a new qemu with the
// same disks, NIC and MAC, from the device a BMC chose for that boot. It
// implements test/bmcsim's Machine. A guest reboot restarts the firmware,
// which (BIOS) boots from the disk when it is bootable, as a server whose
// BMC set a one-time boot override does; with UEFI the override stays.
type Machine struct {
	t  testing.TB
	o  Options
	mu sync.Mutex
	vm *VM
}

// NewMachine returns a powered-off Machine booting VMs like o.
func NewMachine(t testing.TB, o Options) *Machine { return &Machine{t: t, o: o} }

// PowerOn boots from dev ("pxe", "cdrom" or "" for the disk).
func (m *Machine) PowerOn(dev, cdrom string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vm != nil && !m.vm.Exited() {
		return nil
	}
	o := m.o
	o.Boot, o.Reboot = "c", true
	switch dev {
	case "pxe":
		o.Boot, o.BootOnce = "n", "n"
		if !o.UEFI {
			o.Boot = "cn"
		}
	case "cdrom":
		if cdrom == "" {
			return errors.New("boot from CD with no virtual media inserted")
		}
		o.CDROM, o.Boot, o.BootOnce = cdrom, "cd", "d"
	}
	v, err := StartVM(m.t, o)
	if err != nil {
		return err
	}
	m.vm = v
	return nil
}

// PowerOff kills the running VM.
func (m *Machine) PowerOff() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vm != nil {
		m.vm.Kill()
	}
	return nil
}

// On reports whether a VM runs.
func (m *Machine) On() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vm != nil && !m.vm.Exited()
}

// VM is the latest VM (nil before the first power-on).
func (m *Machine) VM() *VM {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vm
}
