package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// firstbootNetwork is where a CoreOS live initramfs carries NetworkManager
// keyfiles (coreos-installer --network-keyfile, agentboot's NMStateConfigs),
// which its NetworkManager applies before Ignition runs.
const firstbootNetwork = "/etc/coreos-firstboot-network"

// keyfile is one NetworkManager profile: section → key → value.
type keyfile struct {
	name     string
	sections map[string]map[string]string
}

func (k keyfile) get(section, key string) string { return k.sections[section][key] }

func readKeyfile(path string) (keyfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return keyfile{}, err
	}
	defer f.Close()
	k := keyfile{name: filepath.Base(path), sections: map[string]map[string]string{}}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if k.sections[section] == nil {
				k.sections[section] = map[string]string{}
			}
		default:
			key, value, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return keyfile{}, fmt.Errorf("%s line %d: %q is no key=value in a section", path, n, line)
			}
			k.sections[section][strings.TrimSpace(key)] = strings.TrimSpace(value)
		}
	}
	return k, sc.Err()
}

// staticNetwork applies this host's profiles among the keyfiles, as
// NetworkManager in a CoreOS initramfs would: an Ethernet profile whose
// mac-address is one of the host's NICs, a VLAN profile whose parent
// profile is applied, and an Ethernet profile bound to no MAC on every NIC
// left. It returns the interfaces it took and whether any has a static
// address; found says there were keyfiles, in which case CoreOS has
// dropped NetworkManager's own DHCP profiles and nothing else runs DHCP.
// It only reads what agentboot's keyfiles use and logs the rest.
func staticNetwork() (taken map[string]bool, addressed, found bool) {
	taken = map[string]bool{}
	paths, _ := filepath.Glob(filepath.Join(firstbootNetwork, "*.nmconnection"))
	sort.Strings(paths)
	if len(paths) == 0 {
		return taken, false, false
	}
	byMAC := map[string]string{}
	for _, name := range ethernetInterfaces() {
		raw, _ := os.ReadFile(filepath.Join("/sys/class/net", name, "address"))
		byMAC[strings.ToLower(strings.TrimSpace(string(raw)))] = name
	}
	var profiles []keyfile
	for _, p := range paths {
		k, err := readKeyfile(p)
		if err != nil {
			logf("network: %v", err)
			continue
		}
		profiles = append(profiles, k)
	}
	devOf := map[string]string{} // profile UUID → the device it is applied to
	var resolv []string
	apply := func(k keyfile, dev string) {
		devOf[k.get("connection", "uuid")] = dev
		taken[dev] = true
		if mtu := k.get("ethernet", "mtu"); mtu != "" { // a VLAN's too: NetworkManager has no vlan.mtu
			_ = run("ip", "link", "set", dev, "mtu", mtu)
		}
		_ = run("ip", "link", "set", dev, "up")
		var said []string
		for _, fam := range []string{"ipv4", "ipv6"} {
			s, ok := k.sections[fam]
			if !ok {
				continue
			}
			flag := "-4"
			if fam == "ipv6" {
				flag = "-6"
			}
			switch s["method"] {
			case "disabled":
				if fam == "ipv6" {
					_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0o644)
				}
				continue
			case "auto":
				if fam == "ipv4" {
					startDHCP(dev)
				}
				said = append(said, fam+" auto")
			case "manual":
			default:
				logf("network: %s: %s.method=%q is not one the dev OS applies", k.name, fam, s["method"])
				continue
			}
			for i := 1; s[fmt.Sprintf("address%d", i)] != ""; i++ {
				a := s[fmt.Sprintf("address%d", i)]
				if err := run("ip", flag, "addr", "add", a, "dev", dev); err != nil {
					logf("network: %s: address %s: %v", k.name, a, err)
					continue
				}
				said = append(said, a)
				addressed = true
			}
			if gw := s["gateway"]; gw != "" {
				if err := run("ip", flag, "route", "add", "default", "via", gw, "dev", dev); err != nil {
					logf("network: %s: gateway %s: %v", k.name, gw, err)
				}
				said = append(said, "via "+gw)
			}
			for i := 1; s[fmt.Sprintf("route%d", i)] != ""; i++ {
				f := strings.Split(s[fmt.Sprintf("route%d", i)], ",")
				args := []string{flag, "route", "add", f[0]}
				if len(f) > 1 && f[1] != "" && f[1] != "0.0.0.0" && f[1] != "::" {
					args = append(args, "via", f[1])
				}
				if len(f) > 2 && f[2] != "" {
					args = append(args, "metric", f[2])
				}
				if err := run("ip", append(args, "dev", dev)...); err != nil {
					logf("network: %s: route %s: %v", k.name, s[fmt.Sprintf("route%d", i)], err)
				}
				said = append(said, "route "+f[0])
			}
			for _, d := range strings.Split(s["dns"], ";") {
				if d != "" {
					resolv = append(resolv, "nameserver "+d)
					said = append(said, "dns "+d)
				}
			}
			if search := strings.Trim(strings.ReplaceAll(s["dns-search"], ";", " "), " "); search != "" {
				resolv = append(resolv, "search "+search)
			}
		}
		logf("network: profile %s on %s: %s", k.name, dev, strings.Join(said, ", "))
	}
	for _, k := range profiles {
		if k.get("connection", "type") != "ethernet" || k.get("ethernet", "mac-address") == "" {
			continue
		}
		mac := strings.ToLower(k.get("ethernet", "mac-address"))
		dev, ok := byMAC[mac]
		if !ok {
			logf("network: profile %s is for MAC %s, not on this host", k.name, mac)
			continue
		}
		apply(k, dev)
	}
	for _, k := range profiles {
		switch t := k.get("connection", "type"); t {
		case "ethernet":
			if k.get("ethernet", "mac-address") != "" {
				continue // applied above
			}
			// Bound to no device: every Ethernet NIC no profile took
			// (multi-connect).
			for _, dev := range ethernetInterfaces() {
				if !taken[dev] {
					apply(k, dev)
				}
			}
		case "vlan":
			parent, ok := devOf[k.get("vlan", "parent")]
			if !ok {
				logf("network: profile %s: its parent %s is not applied on this host", k.name, k.get("vlan", "parent"))
				continue
			}
			// Only a host with a VLAN of its own needs 802.1Q (loaded once).
			if idx, err := loadModuleIndex(); err == nil {
				if err := idx.load("8021q", 0); err != nil {
					logf("network: 8021q: %v", err)
				}
			}
			dev := k.get("connection", "interface-name")
			if err := run("ip", "link", "add", "link", parent, "name", dev, "type", "vlan", "id", k.get("vlan", "id")); err != nil {
				logf("network: profile %s: VLAN %s on %s: %v", k.name, k.get("vlan", "id"), parent, err)
				continue
			}
			apply(k, dev)
		default:
			logf("network: profile %s has type %q, which the dev OS does not apply", k.name, t)
		}
	}
	if len(resolv) > 0 {
		if err := os.WriteFile("/etc/resolv.conf", []byte(strings.Join(resolv, "\n")+"\n"), 0o644); err != nil {
			logf("network: resolv.conf: %v", err)
		}
	}
	return taken, addressed, true
}
