// Package hostaddr finds the address other machines most likely reach this
// one at: the IPv4 address of the interface that carries the default route.
// It reads the kernel's tables only and sends no traffic.
package hostaddr

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// Primary returns the first IPv4 address of the default-route interface, or,
// on a machine without a default route, the first global unicast IPv4 address
// of any interface that is up.
func Primary() (netip.Addr, error) {
	if name, err := defaultRouteInterface("/proc/net/route"); err == nil {
		if ifi, err := net.InterfaceByName(name); err == nil {
			if a, ok := firstIPv4(ifi); ok {
				return a, nil
			}
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, err
	}
	for i := range ifaces {
		if ifaces[i].Flags&net.FlagUp == 0 || ifaces[i].Flags&net.FlagLoopback != 0 {
			continue
		}
		if a, ok := firstIPv4(&ifaces[i]); ok {
			return a, nil
		}
	}
	return netip.Addr{}, errors.New("no interface has a global IPv4 address")
}

func firstIPv4(ifi *net.Interface) (netip.Addr, bool) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() && ip.IsGlobalUnicast() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// defaultRouteInterface reads the kernel's IPv4 routing table and returns the
// interface of the default route with the lowest metric.
func defaultRouteInterface(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	best, bestMetric := "", -1
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[1] != "00000000" || fields[7] != "00000000" {
			continue
		}
		var metric int
		if _, err := fmt.Sscan(fields[6], &metric); err != nil {
			continue
		}
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = fields[0], metric
		}
	}
	if best == "" {
		return "", errors.New("no default route")
	}
	return best, sc.Err()
}
