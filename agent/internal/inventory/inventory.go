// Package inventory collects a host's hardware inventory with
// github.com/jaypipes/ghw, filling in from sysfs, /proc and netlink what ghw
// does not report (link state, addresses, disk eligibility, boot mode, BMC).
package inventory

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jaypipes/ghw/pkg/cpu"
	"github.com/jaypipes/ghw/pkg/memory"
	"github.com/jaypipes/ghw/pkg/option"
	"github.com/jaypipes/ghw/pkg/product"

	"github.com/agentboot/agentboot/agent/internal/virt"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// Options tune a collection.
type Options struct {
	// Root is "/" except in tests, which point it at a fake sysfs and procfs.
	Root string
	// MinDiskSizeBytes is the smallest disk eligible for installation.
	MinDiskSizeBytes int64
	// Now stamps the report.
	Now func() time.Time
}

func (o Options) path(p string) string { return filepath.Join(o.Root, p) }

func init() {
	// ghw prints warnings (such as a DMI file it cannot read) to stderr; the
	// inventory reports what it finds and leaves the rest empty instead.
	os.Setenv("GHW_DISABLE_WARNINGS", "1")
}

func (o Options) ghwOpts() []any {
	opts := []any{option.WithNullAlerter(), option.WithDisableTools()}
	if o.Root != "/" && o.Root != "" {
		opts = append(opts, option.WithChroot(o.Root))
	}
	return opts
}

// Collect gathers the inventory. A part that cannot be read is left empty
// rather than failing the whole report; the service's validations then say
// what is missing.
func Collect(ctx context.Context, o Options) (*agentwire.Inventory, error) {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.MinDiskSizeBytes == 0 {
		o.MinDiskSizeBytes = agentwire.DefaultMinDiskSizeBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	now := o.Now().UTC().Truncate(time.Second)
	inv := &agentwire.Inventory{ReportTime: &now}
	inv.CPU = collectCPU(o)
	inv.Memory = collectMemory(o)
	inv.Interfaces = collectInterfaces(o)
	inv.Disks = collectDisks(o)
	inv.SystemVendor = collectVendor(o)
	inv.SystemVendor.Virtual = inv.SystemVendor.Virtual || hasFlag(inv.CPU.Flags, "hypervisor")
	inv.Boot = collectBoot(o, inv.Interfaces)
	inv.GPUs = collectGPUs(o)
	inv.Hostname = Hostname(o, inv.Interfaces)
	inv.BmcAddress, inv.BmcV6Address = collectBMC(ctx)
	v := virt.Verdict(virt.Probe(o.Root))
	inv.Virtualization = &v
	return inv, nil
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if x == f {
			return true
		}
	}
	return false
}

// Arch maps Go's architecture names to the kernel's.
func Arch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return runtime.GOARCH
}

func collectCPU(o Options) agentwire.CPU {
	c := agentwire.CPU{Architecture: Arch()}
	if info, err := cpu.New(o.ghwOpts()...); err == nil {
		c.Count = int64(info.TotalHardwareThreads)
		if len(info.Processors) > 0 {
			c.ModelName = info.Processors[0].Model
		}
	}
	f, err := os.Open(o.path("proc/cpuinfo"))
	if err != nil {
		return c
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	processors := int64(0)
	implementer, part := "", ""
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			processors++
		case "model name":
			if c.ModelName == "" {
				c.ModelName = v
			}
		case "cpu MHz":
			if c.ClockMegahertz == 0 {
				if mhz, err := strconv.ParseFloat(v, 64); err == nil {
					c.ClockMegahertz = int64(mhz)
				}
			}
		case "flags", "Features":
			if c.Flags == nil {
				c.Flags = strings.Fields(v)
			}
		case "CPU implementer":
			if implementer == "" {
				implementer = v
			}
		case "CPU part":
			if part == "" {
				part = v
			}
		}
	}
	if c.Count == 0 {
		c.Count = processors
	}
	if c.ModelName == "" {
		// Arm: no "model name"; the CPU says who made it and what it is
		// (MIDR_EL1), in cpuinfo or in sysfs.
		if implementer == "" {
			if raw, err := os.ReadFile(o.path("sys/devices/system/cpu/cpu0/regs/identification/midr_el1")); err == nil {
				if midr, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 0, 64); err == nil {
					implementer, part = fmt.Sprintf("0x%02x", midr>>24&0xff), fmt.Sprintf("0x%03x", midr>>4&0xfff)
				}
			}
		}
		if implementer != "" {
			c.ModelName = ArmCPUName(implementer, part)
		}
	}
	// cpufreq knows the nominal maximum where cpuinfo shows the current clock.
	if raw, err := os.ReadFile(o.path("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")); err == nil {
		if khz, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil && khz > 0 {
			c.ClockMegahertz = khz / 1000
		}
	}
	return c
}

func collectMemory(o Options) agentwire.Memory {
	m := agentwire.Memory{}
	if info, err := memory.New(o.ghwOpts()...); err == nil {
		m.PhysicalBytes, m.UsableBytes = info.TotalPhysicalBytes, info.TotalUsableBytes
	}
	if m.UsableBytes <= 0 {
		m.UsableBytes = memTotal(o)
	}
	if m.PhysicalBytes <= 0 {
		m.PhysicalBytes = m.UsableBytes
	}
	return m
}

func memTotal(o Options) int64 {
	raw, err := os.ReadFile(o.path("proc/meminfo"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func collectVendor(o Options) agentwire.SystemVendor {
	v := agentwire.SystemVendor{}
	if info, err := product.New(o.ghwOpts()...); err == nil {
		v.Manufacturer = clean(info.Vendor)
		v.ProductName = clean(info.Name)
		v.SerialNumber = clean(info.SerialNumber)
	}
	// Arm boards without SMBIOS describe themselves in the device tree.
	dt := func(name string) string {
		raw, _ := os.ReadFile(o.path("sys/firmware/devicetree/base/" + name))
		first, _, _ := strings.Cut(string(raw), "\x00") // NUL-terminated (compatible: a list)
		return strings.TrimSpace(first)
	}
	if v.ProductName == "" {
		v.ProductName = dt("model")
	}
	if v.Manufacturer == "" {
		if vendor, _, ok := strings.Cut(dt("compatible"), ","); ok {
			v.Manufacturer = vendor
		}
	}
	if v.SerialNumber == "" {
		v.SerialNumber = dt("serial-number")
	}
	if _, err := os.Stat(o.path("sys/firmware/devicetree/base/hypervisor")); err == nil {
		v.Virtual = true // a hypervisor node: a guest (Xen, KVM with pvtime)
	}
	if raw, err := os.ReadFile(o.path("sys/hypervisor/type")); err == nil && strings.TrimSpace(string(raw)) != "" {
		v.Virtual = true
	}
	lower := strings.ToLower(v.Manufacturer + " " + v.ProductName)
	for _, virtual := range []string{"qemu", "kvm", "vmware", "virtualbox", "bochs", "xen", "microsoft corporation virtual", "openstack", "amazon ec2", "google compute"} {
		if strings.Contains(lower, virtual) {
			v.Virtual = true
		}
	}
	return v
}

// clean drops ghw's "unknown" placeholder.
func clean(s string) string {
	if strings.EqualFold(s, "unknown") {
		return ""
	}
	return strings.TrimSpace(s)
}

func collectBoot(o Options, ifaces []agentwire.Interface) agentwire.Boot {
	b := agentwire.Boot{CurrentBootMode: "bios"}
	if _, err := os.Stat(o.path("sys/firmware/efi")); err == nil {
		b.CurrentBootMode = "uefi"
		b.SecureBootState = "Disabled"
		matches, _ := filepath.Glob(o.path("sys/firmware/efi/efivars/SecureBoot-*"))
		if len(matches) > 0 {
			if raw, err := os.ReadFile(matches[0]); err == nil && len(raw) > 0 && raw[len(raw)-1] == 1 {
				b.SecureBootState = "Enabled"
			}
		} else {
			b.SecureBootState = "Unknown"
		}
	}
	b.PxeInterface = BootInterface(o)
	return b
}

// BootInterface is the MAC the host network-booted from, from BOOTIF= on
// the kernel command line (01-aa-bb-cc-dd-ee-ff).
func BootInterface(o Options) string {
	raw, _ := os.ReadFile(o.path("proc/cmdline"))
	for _, f := range strings.Fields(string(raw)) {
		v, ok := strings.CutPrefix(f, "BOOTIF=")
		if !ok {
			continue
		}
		v = strings.TrimPrefix(v, "01-")
		mac := strings.ToLower(strings.ReplaceAll(v, "-", ":"))
		if _, err := net.ParseMAC(mac); err == nil && len(mac) == 17 {
			return mac
		}
	}
	return ""
}

var localhostLike = regexp.MustCompile(`^(localhost(\..*)?|\(none\)|)$`)

// Hostname is the host's name, or one derived from a MAC address when the
// host has none of its own (localhost, empty).
func Hostname(o Options, ifaces []agentwire.Interface) string {
	h, _ := os.Hostname()
	if raw, err := os.ReadFile(o.path("proc/sys/kernel/hostname")); err == nil && o.Root != "/" {
		h = strings.TrimSpace(string(raw))
	}
	h = strings.ToLower(strings.TrimSpace(h))
	if !localhostLike.MatchString(h) {
		return h
	}
	var mac string
	for _, i := range ifaces {
		if i.MacAddress == "" {
			continue
		}
		if mac == "" || (i.HasCarrier && len(i.IPV4Addresses)+len(i.IPV6Addresses) > 0) {
			mac = i.MacAddress
			if i.HasCarrier {
				break
			}
		}
	}
	if mac == "" {
		return "localhost"
	}
	return "host-" + strings.ReplaceAll(mac, ":", "-")
}

func collectBMC(ctx context.Context) (v4, v6 string) {
	tool, err := exec.LookPath("ipmitool")
	if err != nil {
		return "", ""
	}
	if _, err := os.Stat("/dev/ipmi0"); err != nil {
		return "", ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, tool, "lan", "print").Output(); err == nil {
		v4 = parseIPMI(string(out), "IP Address")
	}
	if out, err := exec.CommandContext(ctx, tool, "lan6", "print").Output(); err == nil {
		v6 = parseIPMI(string(out), "IPv6 Dynamic Address 0")
		if v6 == "" {
			v6 = parseIPMI(string(out), "IPv6 Static Address 0")
		}
	}
	return v4, v6
}

// parseIPMI returns the value of key in `ipmitool lan print` output.
func parseIPMI(out, key string) string {
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != key {
			continue
		}
		v = strings.TrimSpace(v)
		if ip := net.ParseIP(strings.Split(v, "/")[0]); ip != nil && !ip.IsUnspecified() {
			return ip.String()
		}
	}
	return ""
}

func readTrim(p string) string {
	raw, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}
