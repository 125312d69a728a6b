package nmkeyfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStaticEthernetAndVLAN(t *testing.T) {
	state := `{
	  "interfaces": [
	    {"name": "eth0", "type": "ethernet", "state": "up", "mtu": 9000,
	     "ipv4": {"enabled": true, "dhcp": false, "address": [{"ip": "198.18.12.10", "prefix-length": 24}]},
	     "ipv6": {"enabled": false}},
	    {"name": "eth1.100", "type": "vlan", "state": "up", "vlan": {"base-iface": "eth1", "id": 100}, "mtu": 1400,
	     "ipv4": {"enabled": true, "address": [{"ip": "198.18.13.10", "prefix-length": 24}]},
	     "ipv6": {"enabled": true, "autoconf": true, "dhcp": true}}
	  ],
	  "routes": {"config": [
	    {"destination": "0.0.0.0/0", "next-hop-address": "198.18.12.1", "next-hop-interface": "eth0"},
	    {"destination": "198.18.200.0/24", "next-hop-address": "198.18.13.254", "next-hop-interface": "eth1.100", "metric": 50},
	    {"destination": "198.18.201.0/24", "next-hop-interface": "eth1.100", "metric": 20, "table-id": 254}
	  ]},
	  "dns-resolver": {"config": {"server": ["198.18.12.53", "2001:db8::53"], "search": ["lab.example"]}}
	}`
	files, err := Convert("host-a", []byte(state), map[string]string{"eth0": "52:54:00:aa:00:01", "eth1": "52:54:00:AA:00:02"})
	require.NoError(t, err)
	got := map[string]string{}
	for _, f := range files {
		got[f.Name] = string(f.Data)
	}
	require.Len(t, got, 3, "eth0, eth1.100, and eth1 as the VLAN's base")
	base := uuidFor("host-a", "eth1")
	require.Equal(t, `[connection]
id=host-a-eth0
uuid=`+uuidFor("host-a", "eth0")+`
type=ethernet
autoconnect=true

[ethernet]
mac-address=52:54:00:AA:00:01
mtu=9000

[ipv4]
method=manual
address1=198.18.12.10/24
gateway=198.18.12.1
dns=198.18.12.53;
dns-search=lab.example;

[ipv6]
method=disabled
`, got["host-a_eth0.nmconnection"])
	require.Equal(t, `[connection]
id=host-a-eth1.100
uuid=`+uuidFor("host-a", "eth1.100")+`
type=vlan
autoconnect=true
interface-name=eth1.100

[ethernet]
mtu=1400

[vlan]
id=100
parent=`+base+`

[ipv4]
method=manual
address1=198.18.13.10/24
route1=198.18.200.0/24,198.18.13.254,50
route2=198.18.201.0/24,0.0.0.0,20

[ipv6]
method=auto
dns=2001:db8::53;
dns-search=lab.example;
`, got["host-a_eth1.100.nmconnection"])
	require.Contains(t, got["host-a_eth1.nmconnection"], "uuid="+base+"\n")
	require.Contains(t, got["host-a_eth1.nmconnection"], "mac-address=52:54:00:AA:00:02\n")
	require.Contains(t, got["host-a_eth1.nmconnection"], "[ipv4]\nmethod=disabled\n")

	again, err := Convert("host-a", []byte(state), map[string]string{"eth0": "52:54:00:aa:00:01", "eth1": "52:54:00:AA:00:02"})
	require.NoError(t, err)
	require.Equal(t, files, again, "the same config renders the same bytes (the image's version hashes them)")
	require.NotEqual(t, uuidFor("host-a", "eth0"), uuidFor("host-b", "eth0"))
}

func TestUnsupportedTypes(t *testing.T) {
	state := `{"interfaces": [{"name": "bond0", "type": "bond", "link-aggregation": {"mode": "active-backup", "port": ["eth0", "eth1"]}}]}`
	_, err := Convert("host-b", []byte(state), map[string]string{"eth0": "52:54:00:aa:00:01"})
	var u *Unsupported
	require.True(t, errors.As(err, &u), "%v", err)
	require.Equal(t, "host-b", u.Config)
	require.Contains(t, err.Error(), `interface "bond0" has type "bond"`)
	require.Contains(t, err.Error(), "need DHCP")
}

func TestWrongConfigs(t *testing.T) {
	macs := map[string]string{"eth0": "52:54:00:aa:00:01"}
	eth := func(ipv4 string) string {
		return `{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + ipv4 + `}]`
	}
	static := `{"enabled": true, "address": [{"ip": "198.18.12.10", "prefix-length": 24}]}`
	for state, want := range map[string]string{
		`[1, 2]`:             "not an nmstate document",
		`{"interfaces": []}`: "no interfaces",
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "mac-address": "52:54:00:aa:00:02", "ipv4": ` + static + `}]}`:                                              "has mac-address 52:54:00:AA:00:02 but spec.interfaces maps it to 52:54:00:AA:00:01",
		`{"interfaces": [{"name": "eth0/x", "type": "ethernet"}]}`:                                                                                                        `interface name "eth0/x"`,
		eth(`{"enabled": true, "address": [{"ip": "198.18.12.10"}]}`) + `}`:                                                                                               "has no prefix-length",
		eth(`{"enabled": true, "address": [{"ip": "198.18.12.10", "prefix-length": 33}]}`) + `}`:                                                                          "prefix-length 33 does not fit",
		eth(`{"enabled": true, "address": [{"ip": "2001:db8::1", "prefix-length": 64}]}`) + `}`:                                                                           `"2001:db8::1" is not an IPv4 address`,
		eth(`{"enabled": false, "dhcp": true}`) + `}`:                                                                                                                     "disabled but has dhcp",
		eth(static) + `, "routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-address": "198.18.99.1", "next-hop-interface": "eth0"}]}}`:                          "next hop 198.18.99.1 is on none of eth0's networks (198.18.12.10/24)",
		eth(static) + `, "routes": {"config": [{"destination": "198.18.5.1/24", "next-hop-address": "198.18.12.1", "next-hop-interface": "eth0"}]}}`:                      "has host bits set",
		eth(static) + `, "routes": {"config": [{"destination": "::/0", "next-hop-address": "2001:db8::1", "next-hop-interface": "eth0"}]}}`:                               "whose ipv6 is disabled",
		eth(static) + `, "dns-resolver": {"config": {"server": ["fe80::53%x\\n[ethernet]\\nmac-address="]}}}`:                                                             "is not an IP address",
		eth(static) + `, "dns-resolver": {"config": {"search": ["lab.example\\r[x]"]}}}`:                                                                                  "is not a domain name",
		eth(`{"enabled": true, "dhcp": true}`) + `, "routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-address": "fe80::1%x", "next-hop-interface": "eth0"}]}}`: "is not an address of the destination's family",
		eth(static) + `, "dns-resolver": {"config": {"server": ["dns.example"]}}}`:                                                                                        `"dns.example" is not an IP address`,
		`{"interfaces": [{"name": "v100", "type": "vlan", "vlan": {"base-iface": "x/../b_eth0", "id": 100}, "ipv4": ` + static + `}]}`:                                    `base-iface: interface name "x/../b_eth0"`,
		`{"interfaces": [{"name": "v100", "type": "vlan", "vlan": {"base-iface": "eth0", "id": 5000}}]}`:                                                                  "id 5000 is not between 1 and 4094",
	} {
		_, err := Convert("host-c", []byte(state), macs)
		require.Error(t, err, state)
		require.Contains(t, err.Error(), want, state)
		require.True(t, strings.HasPrefix(err.Error(), "NMStateConfig host-c: "), err.Error())
		var u *Unsupported
		require.False(t, errors.As(err, &u), state)
	}
}

// IPv6-only: a static address, its default route as the gateway, and a
// DNS server of that family.
func TestStaticIPv6(t *testing.T) {
	state := `{"interfaces": [{"name": "eth0", "type": "ethernet",
	    "ipv4": {"enabled": false},
	    "ipv6": {"enabled": true, "dhcp": false, "autoconf": false, "address": [{"ip": "2001:2::10", "prefix-length": 64}]}}],
	  "routes": {"config": [{"destination": "::/0", "next-hop-address": "2001:2::1", "next-hop-interface": "eth0"},
	    {"destination": "2001:2:0:5::/64", "next-hop-address": "2001:2::fe", "next-hop-interface": "eth0", "metric": 10}]},
	  "dns-resolver": {"config": {"server": ["2001:2::53"]}}}`
	files, err := Convert("v6", []byte(state), map[string]string{"eth0": "52:54:00:aa:00:06"})
	require.NoError(t, err)
	require.Len(t, files, 1)
	require.Contains(t, string(files[0].Data), "[ipv4]\nmethod=disabled\n\n[ipv6]\nmethod=manual\naddress1=2001:2::10/64\ngateway=2001:2::1\nroute1=2001:2:0:5::/64,2001:2::fe,10\ndns=2001:2::53;\n")
	_, err = Convert("v6", []byte(strings.Replace(state, `"next-hop-address": "2001:2::1"`, `"next-hop-address": "2001:3::1"`, 1)), map[string]string{"eth0": "52:54:00:aa:00:06"})
	require.ErrorContains(t, err, "next hop 2001:3::1 is on none of eth0's networks (2001:2::10/64)")
}

// Valid nmstate beyond the conversion is left to the after-boot path, not
// refused: the config worked before the conversion existed.
func TestUnsupportedIsNoted(t *testing.T) {
	macs := map[string]string{"eth0": "52:54:00:aa:00:01"}
	static := `{"enabled": true, "address": [{"ip": "198.18.12.10", "prefix-length": 24}]}`
	for state, want := range map[string]string{
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + static + `}], "ethtool": {}}`:                                                                                                         `unknown field "ethtool"`,
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "lldp": {"enabled": true}}]}`:                                                                                                                     `unknown field "lldp"`,
		`{"interfaces": [{"name": "eth9", "type": "ethernet", "ipv4": ` + static + `}]}`:                                                                                                                        `interface "eth9" has no MAC address in spec.interfaces`,
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "state": "absent"}]}`:                                                                                                                             `has state "absent"`,
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": {"enabled": true}}]}`:                                                                                                                     "ipv4 has no address or dhcp",
		`{"interfaces": [{"name": "v100", "type": "vlan", "vlan": {"base-iface": "eth7", "id": 100}, "ipv4": ` + static + `}]}`:                                                                                 `interface "eth7" has no MAC address`,
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + static + `}], "routes": {"config": [{"destination": "198.18.9.0/24", "next-hop-interface": "eth0", "table-id": 100}]}}`:               "a route in table 100",
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + static + `}], "routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-address": "198.18.12.1", "next-hop-interface": "eth1"}]}}`: `a route through "eth1", an interface the config does not configure`,
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + static + `}], "dns-resolver": {"config": {"server": ["2001:db8::53"]}}}`:                                                              "DNS servers of a family no interface of the config configures",
		`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": ` + static + `}, {"name": "eth1", "type": "ethernet", "mac-address": "52:54:00:AA:00:01", "ipv4": {"enabled": false}}]}`:                  `interfaces "eth0" and "eth1" have the same MAC 52:54:00:AA:00:01`,
	} {
		_, err := Convert("host-u", []byte(state), macs)
		var u *Unsupported
		require.True(t, errors.As(err, &u), "%s: %v", state, err)
		require.Equal(t, "host-u", u.Config)
		require.Contains(t, err.Error(), want, state)
	}
	// A family with dhcp or addresses and no "enabled" is enabled, as in
	// nmstate.
	files, err := Convert("host-d", []byte(`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": {"dhcp": true}}]}`), macs)
	require.NoError(t, err)
	require.Contains(t, string(files[0].Data), "[ipv4]\nmethod=auto\n")
	require.Equal(t, "52:54:00:aa:00:01", files[0].MAC)
	// The same MAC written two ways is one MAC.
	_, err = Convert("host-d", []byte(`{"interfaces": [{"name": "eth0", "type": "ethernet", "mac-address": "52-54-00-AA-00-01", "ipv4": {"dhcp": true}}]}`), macs)
	require.NoError(t, err)
	// IPv6 enabled with nothing is link-local, as nmstate reads it.
	files, err = Convert("host-l", []byte(`{"interfaces": [{"name": "eth0", "type": "ethernet", "ipv4": `+static+`, "ipv6": {"enabled": true}}]}`), macs)
	require.NoError(t, err)
	require.Contains(t, string(files[0].Data), "[ipv6]\nmethod=link-local\n")
}

// No two configs' files share a name, and none is too long for a file.
func TestFileNames(t *testing.T) {
	require.NotEqual(t, fileName("a-b", "c"), fileName("a", "b-c"))
	long := strings.Repeat("a", 253)
	require.LessOrEqual(t, len(fileName(long, "eth0")), 255)
	require.NotEqual(t, fileName(long, "eth0"), fileName(long[:252]+"b", "eth0"))
	require.Contains(t, string(Fallback().Data), "multi-connect=3\n")
	require.NoError(t, checkRendered(Fallback().Data))
	require.ErrorContains(t, checkRendered([]byte("[connection]\nid=x\n[ethernet]\n[ethernet]\n")), "section [ethernet] twice")
	require.ErrorContains(t, checkRendered([]byte("[connection]\nid=x\r\n")), "is not one NetworkManager reads")
}
