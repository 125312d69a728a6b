package address

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	for name, tc := range map[string]struct {
		in   string
		want Address
	}{
		"ipmi":            {"ipmi://10.0.0.5", Address{Scheme: "ipmi", Protocol: IPMI, Host: "10.0.0.5", Port: 623, HTTPS: true}},
		"ipmi port":       {"ipmi://bmc.example:6230", Address{Scheme: "ipmi", Protocol: IPMI, Host: "bmc.example", Port: 6230, HTTPS: true}},
		"bare host":       {"10.0.0.5", Address{Scheme: "ipmi", Protocol: IPMI, Host: "10.0.0.5", Port: 623, HTTPS: true}},
		"redfish":         {"redfish://bmc/redfish/v1/Systems/1", Address{Scheme: "redfish", Protocol: Redfish, Host: "bmc", Port: 443, HTTPS: true, SystemID: "1"}},
		"redfish+http":    {"redfish+http://198.18.0.1:8000/redfish/v1/Systems/s1/", Address{Scheme: "redfish+http", Protocol: Redfish, Host: "198.18.0.1", Port: 8000, SystemID: "s1"}},
		"virtualmedia":    {"redfish-virtualmedia+https://[fd00::5]/redfish/v1/Systems/System.Embedded.1", Address{Scheme: "redfish-virtualmedia+https", Protocol: Redfish, VirtualMedia: true, Host: "fd00::5", Port: 443, HTTPS: true, SystemID: "System.Embedded.1"}},
		"idrac":           {"idrac-virtualmedia://idrac/redfish/v1/Systems/System.Embedded.1", Address{Scheme: "idrac-virtualmedia", Protocol: Redfish, VirtualMedia: true, Host: "idrac", Port: 443, HTTPS: true, SystemID: "System.Embedded.1"}},
		"ilo5 http":       {"ilo5-virtualmedia+http://ilo", Address{Scheme: "ilo5-virtualmedia+http", Protocol: Redfish, VirtualMedia: true, Host: "ilo", Port: 80}},
		"redfish no path": {"redfish://bmc:8443", Address{Scheme: "redfish", Protocol: Redfish, Host: "bmc", Port: 8443, HTTPS: true}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("(-want +got)\n%s", d)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"empty":          {"", "empty"},
		"unknown scheme": {"foo://bmc", `unknown BMC address scheme "foo"`},
		"libvirt":        {"libvirt://bmc", "supported are ipmi://"},
		"ipmi transport": {"ipmi+http://bmc", "ipmi takes no +http"},
		"bad transport":  {"redfish+ftp://bmc", "unknown transport +ftp"},
		"no host":        {"redfish:///redfish/v1/Systems/1", "has no host"},
		"bad port":       {"ipmi://bmc:99999", `port "99999" is not 1-65535`},
		"word port":      {"ipmi://bmc:http", "not a URL"},
		"credentials":    {"redfish://admin:secret@bmc", "must not contain credentials"},
		"ipmi path":      {"ipmi://bmc/x", "ipmi address takes no path"},
		"bad path":       {"redfish://bmc/redfish/v1/Managers/1", "/redfish/v1/Systems/<id>"},
		"nested path":    {"redfish://bmc/redfish/v1/Systems/1/Bios", "/redfish/v1/Systems/<id>"},
		"query":          {"redfish://bmc/redfish/v1/Systems/1?x=1", "query or fragment"},
		"bad ipv6":       {"redfish://[zz::1]/", "not"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", tc.in, err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error repeats the password: %v", err)
			}
		})
	}
}
