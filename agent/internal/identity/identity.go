// Package identity names a host: its SMBIOS system UUID when that is a real
// one, else an ID derived from what tells hosts apart (UUID, serial number,
// MAC addresses). Both are stable across reboots of the same host.
package identity

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// Read collects the identity facts of this host; root is "/" except in tests.
func Read(root string) agentwire.HostIdentity {
	id := agentwire.HostIdentity{MACAddresses: []string{}}
	read := func(p string) string {
		raw, _ := os.ReadFile(filepath.Join(root, p))
		return strings.TrimSpace(string(raw))
	}
	if u := strings.ToLower(read("sys/class/dmi/id/product_uuid")); agentwire.ValidUUID(u) {
		id.SystemUUID = u
	}
	if s := read("sys/class/dmi/id/product_serial"); agentwire.ValidSerial(s) {
		id.SerialNumber = s
	}
	entries, _ := os.ReadDir(filepath.Join(root, "sys/class/net"))
	for _, e := range entries {
		dir := filepath.Join("sys/class/net", e.Name())
		if _, err := os.Stat(filepath.Join(root, dir, "device")); err != nil {
			continue // virtual interfaces come and go
		}
		if mac := strings.ToLower(read(filepath.Join(dir, "address"))); mac != "" && mac != "00:00:00:00:00:00" {
			id.MACAddresses = append(id.MACAddresses, mac)
		}
	}
	sort.Strings(id.MACAddresses)
	return id
}

// Primary is the host ID to try first: the system UUID when valid.
func Primary(id agentwire.HostIdentity) string {
	if id.SystemUUID != "" {
		return id.SystemUUID
	}
	return Derived(id)
}

// Derived is an ID from every identity fact, in UUID form: two hosts that
// share a UUID (or have none) still differ by their MAC addresses.
func Derived(id agentwire.HostIdentity) string {
	h := sha256.New()
	fmt.Fprintf(h, "agentboot-host\x00%s\x00%s\x00%s", id.SystemUUID, id.SerialNumber, strings.Join(id.MACAddresses, ","))
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8: vendor-specific
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
