package agentwire

import (
	"regexp"
	"strings"
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

// ValidUUID reports whether u identifies one machine: the agent sends no
// other, and the service marks no other as a machine's.
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

// Forms of identifiers on the wire and in URLs. Check the form here, not
// with a copy: a host ID or Kubernetes UID is a lowercase UUID (whether or
// not it is a machine's: ValidUUID says that), a MAC address six lowercase
// hexadecimal bytes separated by colons (lowercase what a client sends
// before checking it).
var (
	UUIDForm = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	MACForm  = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
)
