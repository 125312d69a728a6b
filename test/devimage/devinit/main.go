// Command devinit is PID 1 of agentboot's dev OS image, a small live image
// built from Debian packages for tests and demos (not for production). It
// does what a CoreOS live boot does for discovery, in one static program:
// load kernel modules, bring up the network, load the root filesystem from
// the ISO or from coreos.live.rootfs_url, apply the Ignition config found at
// /config.ign (embed area or PXE initrd), and run the systemd units it enables
// (the agent). It logs to the console with a "devinit:" prefix that the VM
// tests read.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/internal/cmdwords"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "devinit: "+format+"\n", args...)
}

// cmdline is the parsed kernel command line.
type cmdline map[string]string

func readCmdline() cmdline {
	raw, _ := os.ReadFile("/proc/cmdline")
	c := cmdline{}
	for _, f := range cmdwords.Split(strings.TrimSpace(string(raw))) {
		k, v, _ := strings.Cut(f, "=")
		c[k] = strings.Trim(v, `"'`)
	}
	return c
}

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "devinit runs as PID 1 of the dev OS image")
		os.Exit(2)
	}
	mountBasics()
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("HOME", "/root")
	go reap()
	go handleSignals()
	for _, d := range []string{"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/root", "/etc"} {
		_ = os.MkdirAll(d, 0o755)
	}
	if err := run("/bin/busybox", "--install", "-s"); err != nil {
		logf("busybox --install: %v", err)
	}

	cmd := readCmdline()
	logf("agentboot dev OS starting (kernel %s)", kernelRelease())
	mods, err := loadModuleIndex()
	if err != nil {
		logf("module index: %v", err)
	}
	mods.coldplug()
	mountEFIVars(mods)

	netUp := false
	if url := cmd["coreos.live.rootfs_url"]; url != "" {
		netUp = bringUpNetwork()
		if err := fetchRootfs(url); err != nil {
			fail("root filesystem: %v", err)
		}
	} else if label := cmd["coreos.liveiso"]; label != "" {
		if err := rootfsFromISO(label); err != nil {
			fail("root filesystem: %v", err)
		}
	} else if label := cmd["agentboot.disk"]; label != "" {
		if err := rootfsFromDisk(label); err != nil {
			fail("root filesystem: %v", err)
		}
	} else if _, err := os.Stat("/etc/agentboot/installed"); err != nil {
		logf("no coreos.live.rootfs_url or coreos.liveiso: running from the initramfs alone")
	}
	// The root filesystem brings more modules (KVM among them).
	if more, err := loadModuleIndex(); err == nil {
		more.coldplug()
		more.loadCPUVirtualization()
	}
	if !netUp {
		bringUpNetwork()
	}

	config := "/config.ign"
	if cmd["agentboot.disk"] != "" {
		// Installed: the config the installer put on the boot partition,
		// where CoreOS's installer puts it.
		config = diskIgnition
	}
	units, err := applyIgnition(config)
	if err != nil {
		logf("ignition: %v", err)
	}
	for _, u := range units {
		go supervise(u)
	}
	logf("boot complete")
	select {}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func mountBasics() {
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
		{"devpts", "/dev/pts", "devpts"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && err != unix.EBUSY {
			fmt.Fprintf(os.Stderr, "devinit: mount %s: %v\n", m.dst, err)
		}
	}
}

// mountEFIVars mounts efivarfs on a UEFI host, as systemd does: the agent
// reads the SecureBoot variable there. Debian builds it as a module.
func mountEFIVars(mods *moduleIndex) {
	if _, err := os.Stat("/sys/firmware/efi"); err != nil {
		return // BIOS
	}
	if err := mods.load("efivarfs", 0); err != nil {
		logf("efivarfs module: %v", err)
	}
	if err := unix.Mount("efivarfs", "/sys/firmware/efi/efivars", "efivarfs", 0, ""); err != nil && err != unix.EBUSY {
		logf("mount efivarfs: %v", err)
	}
}

// fail reports an unrecoverable boot error and leaves the machine up for
// inspection (a PID 1 that exits panics the kernel).
func fail(format string, args ...any) {
	logf("FATAL: "+format, args...)
	select {}
}

// handleSignals turns busybox's reboot and poweroff requests into the
// corresponding system calls.
func handleSignals() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2)
	for sig := range ch {
		stopServices()
		unix.Sync()
		switch sig {
		case syscall.SIGUSR2:
			logf("powering off")
			_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		case syscall.SIGUSR1:
			logf("halting")
			_ = unix.Reboot(unix.LINUX_REBOOT_CMD_HALT)
		default:
			logf("rebooting")
			_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
		}
	}
}

// processes maps the PIDs devinit started to where their exit is reported.
var processes = newProcTable()

// reap collects every child, including orphans re-parented to PID 1.
func reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.ECHILD {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if err != nil {
			continue
		}
		processes.exited(pid, ws)
	}
}
