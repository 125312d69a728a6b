package inventory

import (
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// collectInterfaces lists physical NICs (those backed by a device) with
// their addresses and link state, from sysfs and the kernel's interface list.
func collectInterfaces(o Options) []agentwire.Interface {
	sysNet := o.path("sys/class/net")
	entries, err := os.ReadDir(sysNet)
	if err != nil {
		return nil
	}
	db := loadPCIIDs(o)
	var out []agentwire.Interface
	for _, e := range entries {
		name := e.Name()
		dir := filepath.Join(sysNet, name)
		if _, err := os.Stat(filepath.Join(dir, "device")); err != nil {
			continue // virtual: lo, bridges, bonds, veths
		}
		i := agentwire.Interface{
			Name:          name,
			MacAddress:    strings.ToLower(readTrim(filepath.Join(dir, "address"))),
			IPV4Addresses: []string{},
			IPV6Addresses: []string{},
			Flags:         []string{},
			HasCarrier:    readTrim(filepath.Join(dir, "carrier")) == "1",
		}
		i.Mtu, _ = strconv.ParseInt(readTrim(filepath.Join(dir, "mtu")), 10, 64)
		if s, err := strconv.ParseInt(readTrim(filepath.Join(dir, "speed")), 10, 64); err == nil && s > 0 {
			i.SpeedMbps = s
		}
		// A virtio NIC's device is on the virtio bus; its PCI IDs are its parent's.
		idDir := filepath.Join(dir, "device")
		if sub, err := os.Readlink(filepath.Join(idDir, "subsystem")); err == nil && filepath.Base(sub) == "virtio" {
			idDir = filepath.Join(idDir, "..")
		}
		vendor := strings.TrimPrefix(readTrim(filepath.Join(idDir, "vendor")), "0x")
		device := strings.TrimPrefix(readTrim(filepath.Join(idDir, "device")), "0x")
		i.Vendor, i.Product = db.names(vendor, device)
		if i.Vendor == "" {
			i.Vendor = vendor
		}
		if i.Product == "" {
			i.Product = device
		}
		if o.Root == "/" {
			fillLive(&i)
		}
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// fillLive adds flags and addresses from the running kernel.
func fillLive(i *agentwire.Interface) {
	ifi, err := net.InterfaceByName(i.Name)
	if err != nil {
		return
	}
	for _, f := range []struct {
		flag net.Flags
		name string
	}{{net.FlagUp, "up"}, {net.FlagBroadcast, "broadcast"}, {net.FlagMulticast, "multicast"}, {net.FlagRunning, "running"}} {
		if ifi.Flags&f.flag != 0 {
			i.Flags = append(i.Flags, f.name)
		}
	}
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if n.IP.To4() != nil {
			i.IPV4Addresses = append(i.IPV4Addresses, n.String())
		} else if !n.IP.IsLinkLocalUnicast() {
			i.IPV6Addresses = append(i.IPV6Addresses, n.String())
		}
	}
}

// pciIDs maps PCI vendor and device IDs to names (the pci.ids database, when
// the OS ships it).
type pciIDs struct {
	vendors map[string]string
	devices map[string]string // vendor+device
}

func loadPCIIDs(o Options) pciIDs {
	db := pciIDs{vendors: map[string]string{}, devices: map[string]string{}}
	for _, p := range []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids"} {
		raw, err := os.ReadFile(o.path(p))
		if err != nil {
			continue
		}
		vendor := ""
		for _, line := range strings.Split(string(raw), "\n") {
			switch {
			case line == "" || line[0] == '#' || strings.HasPrefix(line, "\t\t"):
			case line[0] == '\t' && vendor != "" && len(line) > 6:
				db.devices[vendor+line[1:5]] = strings.TrimSpace(line[5:])
			case line[0] != '\t' && len(line) > 5 && line[4] == ' ':
				vendor = line[:4]
				db.vendors[vendor] = strings.TrimSpace(line[5:])
			case line[0] == 'C' && line[1] == ' ':
				return db // device classes follow: done
			}
		}
		return db
	}
	return db
}

func (db pciIDs) names(vendor, device string) (string, string) {
	return db.vendors[vendor], db.devices[vendor+device]
}

// collectGPUs lists PCI display controllers (class 0x03) and processing
// accelerators (class 0x12).
func collectGPUs(o Options) []agentwire.GPU {
	devs, err := os.ReadDir(o.path("sys/bus/pci/devices"))
	if err != nil {
		return nil
	}
	db := loadPCIIDs(o)
	var out []agentwire.GPU
	for _, d := range devs {
		dir := o.path(filepath.Join("sys/bus/pci/devices", d.Name()))
		class := strings.TrimPrefix(readTrim(filepath.Join(dir, "class")), "0x")
		if !strings.HasPrefix(class, "03") && !strings.HasPrefix(class, "12") {
			continue
		}
		vendor := strings.TrimPrefix(readTrim(filepath.Join(dir, "vendor")), "0x")
		device := strings.TrimPrefix(readTrim(filepath.Join(dir, "device")), "0x")
		vname, dname := db.names(vendor, device)
		out = append(out, agentwire.GPU{Address: d.Name(), VendorID: vendor, DeviceID: device, Vendor: vname, Name: dname})
	}
	return out
}
