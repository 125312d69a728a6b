package main

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// bringUpNetwork applies this host's static network profiles (keyfiles in
// the initramfs), starts a DHCP client (busybox udhcpc) on every other
// Ethernet interface, and waits until one of them has an address: an IPv4
// lease, or a global IPv6 address the kernel configured from a router
// advertisement (SLAAC) once it passed duplicate address detection. As
// NetworkManager with both families on "auto", either is enough to go on.
// The clients keep running and renew their leases.
func bringUpNetwork() bool {
	_ = run("ip", "link", "set", "lo", "up")
	ifaces := ethernetInterfaces()
	if len(ifaces) == 0 {
		logf("network: no Ethernet interface")
		return false
	}
	taken, addressed, found := staticNetwork()
	if addressed {
		// As NetworkManager's "online": a static address is there at once.
		return true
	}
	if !found {
		// No keyfiles: NetworkManager's default, DHCP on every NIC.
		for _, name := range ifaces {
			_ = run("ip", "link", "set", name, "up")
			startDHCP(name)
		}
	}
	for name := range taken {
		ifaces = append(ifaces, name) // VLANs with a DHCP address
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		for _, name := range ifaces {
			if addr := ipv4Of(name); addr != "" {
				logf("network: %s has %s", name, addr)
				return true
			}
			if addr := globalIPv6Of(name); addr != "" {
				logf("network: %s has %s", name, addr)
				return true
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	logf("network: no DHCP lease and no IPv6 router advertisement after 90s on %s", strings.Join(ifaces, ", "))
	return false
}

// startDHCP runs udhcpc on an interface until the machine stops.
func startDHCP(name string) {
	cmd := exec.Command("udhcpc", "-f", "-S", "-i", name, "-s", "/etc/udhcpc.script", "-t", "20", "-T", "3", "-A", "5", "-x", "hostname:"+shortHost())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if _, err := processes.start(cmd); err != nil {
		logf("network: udhcpc on %s: %v", name, err)
	}
}

func ethernetInterfaces() []string {
	var out []string
	entries, _ := os.ReadDir("/sys/class/net")
	for _, e := range entries {
		name := e.Name()
		if name == "lo" {
			continue
		}
		// type 1 is ARPHRD_ETHER; skip virtual devices such as bridges.
		t, _ := os.ReadFile(filepath.Join("/sys/class/net", name, "type"))
		if strings.TrimSpace(string(t)) != "1" {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", name, "device")); err != nil {
			continue
		}
		out = append(out, name)
	}
	return out
}

func ipv4Of(name string) string {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return ""
	}
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.String()
		}
	}
	return ""
}

// globalIPv6Of returns name's first global IPv6 address that is usable:
// not tentative (duplicate address detection still running), not
// deprecated, not failed. /proc/net/if_inet6 lines: address (32 hex digits), interface
// index, prefix length, scope, flags (all hex), name.
func globalIPv6Of(name string) string {
	data, err := os.ReadFile("/proc/net/if_inet6")
	if err != nil {
		return ""
	}
	const tentative, deprecated, dadFailed = 0x40, 0x20, 0x08
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || f[5] != name || f[3] != "00" || len(f[0]) != 32 {
			continue
		}
		flags, err := strconv.ParseUint(f[4], 16, 32)
		if err != nil || flags&(tentative|deprecated|dadFailed) != 0 {
			continue
		}
		raw, err := hex.DecodeString(f[0])
		if err != nil {
			continue
		}
		bits, _ := strconv.ParseUint(f[2], 16, 8)
		return fmt.Sprintf("%s/%d", net.IP(raw), bits)
	}
	return ""
}

func shortHost() string {
	h, _ := os.Hostname()
	if h == "" || h == "(none)" {
		return "localhost"
	}
	return h
}
