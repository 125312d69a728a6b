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

// placeholderUUIDs are values firmware ships unset or shared between boards.
var placeholderUUIDs = map[string]bool{
	"00000000-0000-0000-0000-000000000000": true,
	"ffffffff-ffff-ffff-ffff-ffffffffffff": true,
	"03000200-0400-0500-0006-000700080009": true,
}

// placeholderSerials are serial numbers firmware ships unset.
var placeholderSerials = []string{
	"to be filled by o.e.m.", "default string", "system serial number", "not specified", "none",
	"not applicable", "0", "0123456789", "123456789", "chassis serial number", "n/a",
}

// ValidUUID reports whether u identifies one machine.
func ValidUUID(u string) bool {
	u = strings.ToLower(strings.TrimSpace(u))
	if len(u) != 36 || placeholderUUIDs[u] {
		return false
	}
	for i, r := range u {
		switch i {
		case 8, 13, 18, 23:
			if r != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", r) {
				return false
			}
		}
	}
	return true
}

// ValidSerial reports whether s is a real serial number.
func ValidSerial(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return false
	}
	for _, p := range placeholderSerials {
		if s == p {
			return false
		}
	}
	return true
}

// Read collects the identity facts of this host; root is "/" except in tests.
func Read(root string) agentwire.HostIdentity {
	id := agentwire.HostIdentity{MACAddresses: []string{}}
	read := func(p string) string {
		raw, _ := os.ReadFile(filepath.Join(root, p))
		return strings.TrimSpace(string(raw))
	}
	if u := strings.ToLower(read("sys/class/dmi/id/product_uuid")); ValidUUID(u) {
		id.SystemUUID = u
	}
	if s := read("sys/class/dmi/id/product_serial"); ValidSerial(s) {
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
