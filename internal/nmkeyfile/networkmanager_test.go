package nmkeyfile

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// nmcliReads has real NetworkManager (libnm, through nmcli's offline mode)
// read a keyfile, as the initramfs's NetworkManager will, and returns the
// profile as it understood it.
func nmcliReads(t *testing.T, f File) string {
	t.Helper()
	if _, err := exec.LookPath("nmcli"); err != nil {
		t.Fatal("nmcli not found: install Debian package network-manager (.ci/packages)")
	}
	cmd := exec.Command("nmcli", "--offline", "connection", "modify", "connection.autoconnect", "yes")
	cmd.Stdin = bytes.NewReader(f.Data)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "NetworkManager refused %s:\n%s\n%s", f.Name, f.Data, errOut.String())
	return out.String()
}

// Every kind of profile the conversion writes is one NetworkManager reads
// as meant: the MAC binding, addresses and gateway, routes, DNS, a VLAN's
// parent and MTU, and the catch-all DHCP profile.
func TestNetworkManagerReadsTheKeyfiles(t *testing.T) {
	state := `{
	  "interfaces": [
	    {"name": "eth0", "type": "ethernet", "mtu": 9000,
	     "ipv4": {"enabled": true, "address": [{"ip": "198.18.12.10", "prefix-length": 24}]},
	     "ipv6": {"enabled": true, "address": [{"ip": "2001:2::10", "prefix-length": 64}]}},
	    {"name": "eth1.100", "type": "vlan", "mtu": 1400, "vlan": {"base-iface": "eth1", "id": 100},
	     "ipv4": {"enabled": true, "dhcp": true}, "ipv6": {"enabled": true, "dhcp": true, "autoconf": false}},
	    {"name": "eth2", "type": "ethernet", "ipv4": {"enabled": false}, "ipv6": {"enabled": true}}
	  ],
	  "routes": {"config": [
	    {"destination": "0.0.0.0/0", "next-hop-address": "198.18.12.1", "next-hop-interface": "eth0"},
	    {"destination": "::/0", "next-hop-address": "2001:2::1", "next-hop-interface": "eth0"},
	    {"destination": "198.18.200.0/24", "next-hop-address": "198.18.12.254", "next-hop-interface": "eth0", "metric": 50},
	    {"destination": "198.18.201.0/24", "next-hop-interface": "eth1.100", "metric": 20}
	  ]},
	  "dns-resolver": {"config": {"server": ["198.18.12.53", "2001:2::53"], "search": ["lab.example"]}}
	}`
	files, err := Convert("host-a", []byte(state), map[string]string{"eth0": "52:54:00:aa:00:01", "eth1": "52:54:00:aa:00:02", "eth2": "52:54:00:aa:00:03"})
	require.NoError(t, err)
	read := map[string]string{}
	for _, f := range append(files, Fallback()) {
		read[f.Name] = nmcliReads(t, f)
	}
	eth0 := read["host-a_eth0.nmconnection"]
	for _, want := range []string{"mac-address=52:54:00:AA:00:01\nmtu=9000\n", "address1=198.18.12.10/24,198.18.12.1\n",
		"route1=198.18.200.0/24,198.18.12.254,50\n", "dns=198.18.12.53;\n", "dns-search=lab.example;\n", "address1=2001:2::10/64,2001:2::1\n",
		"dns=2001:2::53;\n"} {
		require.Contains(t, eth0, want)
	}
	vlan := read["host-a_eth1.100.nmconnection"]
	for _, want := range []string{"[ethernet]\nmtu=1400\n", "id=100\n", "parent=" + uuidFor("host-a", "eth1") + "\n", "route1=198.18.201.0/24,0.0.0.0,20\n",
		"[ipv6]\nmethod=dhcp\n", "interface-name=eth1.100\n"} {
		require.Contains(t, vlan, want)
	}
	require.Contains(t, read["host-a_eth1.nmconnection"], "uuid="+uuidFor("host-a", "eth1")+"\n")
	require.Contains(t, read["host-a_eth2.nmconnection"], "method=link-local\n")
	fallback := read[FallbackName]
	require.Contains(t, fallback, "autoconnect-priority=-100\n")
	require.Contains(t, fallback, "multi-connect=3\n")
	require.NotContains(t, fallback, "mac-address", "bound to no NIC")
	require.Contains(t, fallback, "[ipv4]\nmethod=auto\n")
}
