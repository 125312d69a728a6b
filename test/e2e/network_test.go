//go:build e2e

package e2e_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/test/e2e/lab"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// declareHost creates a detached BareMetalHost for mac naming ie, so that
// the PXE path boots mac into ie whatever other test holds the PXE default.
func declareHost(t *testing.T, ie *v1beta1.InfraEnv, name, mac string) {
	t.Helper()
	bmh := &metal3.BareMetalHost{
		// Detached: there is no BMC at that address, only the boot MAC matters.
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: name, Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name},
			Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}},
		Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: metal3.BMCDetails{Address: "ipmi://198.18.255.9", CredentialsName: name + "-bmc"}},
	}
	require.NoError(t, s.Client.Create(context.Background(), bmh))
}

// onRouted puts o's NIC on a new tap of the routed network r, with qemu
// in the router's namespace.
func onRouted(t *testing.T, r *lab.Routed, o vm.Options) vm.Options {
	t.Helper()
	tap, err := r.Tap()
	require.NoError(t, err)
	o.Prefix = r.Router.Exec()
	o.Net = "tap,ifname=" + tap + ",script=no,downscript=no"
	return o
}

// OVMF's boot manager says which network boot it starts.
const (
	ovmfHTTPBoot = "Start HTTP Boot over IPv4"
	ovmfPXEBoot  = "Start PXE over IPv4"
)

// UEFI HTTP boot (x86_64, DHCP architecture 16): OVMF with its PXE turned
// off, as a server whose setup enables HTTP boot only, gets ipxe.efi over
// HTTP and reaches discovery with no TFTP at all: (a) from agentboot's
// ProxyDHCP next to the site's DHCP server, (b) from the site's dnsmasq
// configured with the README's recipe, ipxe.efi on the site's web server.
func TestLabHTTPBoot(t *testing.T) {
	ie := infraEnv(t, nil)

	t.Run("agentboot-proxy", func(t *testing.T) {
		t.Parallel()
		seg, err := theLab.Segment(8)
		require.NoError(t, err)
		require.NoError(t, theLab.Dnsmasq("http-dnsmasq", seg.Bridge, seg.HostIP, seg.Prefix))
		startPXE(t, "pxe-http", seg.Bridge, seg.HostIP)
		const mac = "52:54:00:2f:00:01"
		declareHost(t, ie, "http-0", mac)
		v := bootVMOn(t, seg.Bridge, vm.Options{Name: "http-agentboot", UEFI: true, NoNICROM: true, HTTPBoot: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		registered(t, "IPv4 UEFI HTTP boot, agentboot proxyDHCP (no TFTP)", v, agentWithMAC(t, ie.Namespace, mac, v))
		requireSerial(t, v, ovmfHTTPBoot, "Filename: "+bootScriptURL()+"?mac="+mac)
		require.NotContains(t, v.Log(), ovmfPXEBoot)
		log := theLab.Log("pxe-http.out")
		require.Regexp(t, `msg="HTTP boot file sent" logger=pxe client=`+regexp.QuoteMeta(seg.Prefix)+`\.\d+ file=ipxe.efi result=ok`, log)
		require.Contains(t, log, "file=http://"+seg.HostIP+":8070/ipxe/ipxe.efi", "the offer named the boot file's URL")
		require.NotContains(t, log, "TFTP transfer ended", "no TFTP on this path")
	})
	t.Run("dnsmasq-recipe", func(t *testing.T) {
		t.Parallel()
		seg, err := theLab.Segment(9)
		require.NoError(t, err)
		// The site's web server, holding Debian's iPXE binaries.
		ln, err := theLab.Listen("tcp", seg.HostIP+":80")
		require.NoError(t, err)
		var (
			mu      sync.Mutex
			fetched []string
		)
		files := http.FileServer(http.Dir("/usr/lib/ipxe"))
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			fetched = append(fetched, r.Method+" "+r.URL.Path)
			mu.Unlock()
			files.ServeHTTP(w, r)
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		conf := recipe(t, "dnsmasq-httpboot.conf", map[string]string{
			"IPXE_EFI_URL": "http://" + seg.HostIP + "/ipxe.efi", "IPXE_SCRIPT_URL": ie.Status.BootArtifacts.IpxeScriptURL})
		require.NoError(t, theLab.Dnsmasq("http-site-dnsmasq", seg.Bridge, seg.HostIP, seg.Prefix, "--conf-file="+conf))
		const mac = "52:54:00:2f:00:02"
		v := bootVMOn(t, seg.Bridge, vm.Options{Name: "http-dnsmasq", UEFI: true, NoNICROM: true, HTTPBoot: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		registered(t, "IPv4 UEFI HTTP boot, the site's dnsmasq (recipe)", v, agentWithMAC(t, ie.Namespace, mac, v))
		requireSerial(t, v, ovmfHTTPBoot)
		require.NotContains(t, v.Log(), ovmfPXEBoot)
		mu.Lock()
		require.Contains(t, fetched, "GET /ipxe.efi", "the firmware fetched iPXE from the site's web server")
		mu.Unlock()
		require.Contains(t, theLab.Log("http-site-dnsmasq.log"), "HTTPClient")
	})
}

// A routed boot network: the hosts' segment reaches the servers' only
// through a router running ISC dhcrelay, which relays DHCP to the site's
// DHCP server (dnsmasq, another machine on the servers' segment) and to
// agentboot's PXE service in proxy mode, as routers' helper addresses do.
// UEFI firmware PXE boots through the relay (giaddr), fetches iPXE over
// TFTP across the router, and iPXE its script, into discovery.
func TestLabPXERelay(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	servers, err := theLab.Segment(10)
	require.NoError(t, err)
	site, err := theLab.Peer("site10", servers, servers.Prefix+".3")
	require.NoError(t, err)
	r, err := theLab.Routed(11, servers, site)
	require.NoError(t, err)

	// The site's DHCP server hands out the routed network's addresses to
	// requests its relay forwards.
	require.NoError(t, theLab.StartIn(site, "relay-site-dnsmasq", lab.DnsmasqReady, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=vsite10", "--bind-interfaces", "--dhcp-range="+r.Prefix+".100,"+r.Prefix+".199,255.255.255.0,12h",
		"--dhcp-option=option:router,"+r.RouterIP, "--dhcp-leasefile="+theLab.Dir+"/relay-site.leases", "--log-dhcp"))
	startPXE(t, "pxe-relay", servers.Bridge, servers.HostIP, "--dhcp-relays", r.RouterIP)
	require.NoError(t, theLab.StartIn(r.Router, "dhcrelay", dhcrelayReady, "/usr/sbin/dhcrelay", "-4", "-d", "--no-pid",
		"-iu", r.UpIface, "-id", r.Bridge, servers.HostIP, servers.Prefix+".3"))

	const mac = "52:54:00:2d:10:01" // 2d:00:xx are the BMC tests'
	declareHost(t, ie, "relayed-0", mac)
	v := vm.Start(t, onRouted(t, r, vm.Options{Name: "relayed", UEFI: true, NoNICROM: true, Boot: "n", MAC: mac, MemoryMB: 1536}))
	a := agentWithMAC(t, ie.Namespace, mac, v)
	registered(t, "IPv4 UEFI PXE through a DHCP relay (ISC dhcrelay), agentboot proxyDHCP", v, a)
	addrs := ipv4Of(a, mac)
	require.Len(t, addrs, 1)
	require.True(t, strings.HasPrefix(addrs[0], r.Prefix+"."), "an address of the routed network from the site's server: %v", addrs)
	requireSerial(t, v, "NBP filename is ipxe.efi", "Filename: "+bootScriptURL()+"?mac="+mac)
	log := theLab.Log("pxe-relay.out")
	require.Regexp(t, `msg="TFTP transfer ended" logger=pxe/tftp client=`+regexp.QuoteMeta(r.Prefix)+`\.\d+:\d+ file=ipxe.efi result=ok`, log,
		"TFTP across the router")
}

// dhcrelayReady is ISC dhcrelay's line once it listens and forwards.
var dhcrelayReady = regexp.MustCompile(`Sending on\s+Socket/fallback`)

// Static networking, booted: two segments without any DHCP server, one
// plain and one whose provisioning network is VLAN 100 (the lab answers
// only tagged frames). One InfraEnv selects an NMStateConfig for each
// host; both boot its one ISO, each comes up with the address, route and
// DNS server of its own config (by MAC) before Ignition fetches the agent
// (the keyfiles are in the initramfs, as CoreOS's NetworkManager takes
// them), and registers.
func TestLabStaticNetwork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	plain, err := theLab.Segment(12)
	require.NoError(t, err)
	tagged, err := theLab.VLANSegment(13, 100)
	require.NoError(t, err)

	ns := s.Namespace(t, "lab-static")
	const plainMAC, vlanMAC = "52:54:00:2c:10:01", "52:54:00:2c:10:02"
	configs := map[string]struct{ mac, state string }{
		"host-plain": {plainMAC, `{"interfaces": [{"name": "eno1", "type": "ethernet", "state": "up",
		    "ipv4": {"enabled": true, "dhcp": false, "address": [{"ip": "198.18.12.10", "prefix-length": 24}]}, "ipv6": {"enabled": false}}],
		  "routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-address": "198.18.12.1", "next-hop-interface": "eno1"}]},
		  "dns-resolver": {"config": {"server": ["198.18.12.53"], "search": ["lab.example"]}}}`},
		"host-vlan": {vlanMAC, `{"interfaces": [
		    {"name": "eno1", "type": "ethernet", "state": "up", "ipv4": {"enabled": false}, "ipv6": {"enabled": false}},
		    {"name": "eno1.100", "type": "vlan", "state": "up", "vlan": {"base-iface": "eno1", "id": 100},
		     "ipv4": {"enabled": true, "address": [{"ip": "198.18.13.10", "prefix-length": 24}]}, "ipv6": {"enabled": false}}],
		  "routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-address": "198.18.13.1", "next-hop-interface": "eno1.100"}]},
		  "dns-resolver": {"config": {"server": ["198.18.13.53"]}}}`},
	}
	for name, c := range configs {
		require.NoError(t, s.Client.Create(ctx, &v1beta1.NMStateConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"lab-static": "yes"}},
			Spec: v1beta1.NMStateConfigSpec{Interfaces: []*v1beta1.Interface{{Name: "eno1", MacAddress: c.mac}},
				NetConfig: runtime.RawExtension{Raw: []byte(c.state)}},
		}))
	}
	ie := stack.NewInfraEnv(ns, "static")
	ie.Spec.NMStateConfigLabelSelector = metav1.LabelSelector{MatchLabels: map[string]string{"lab-static": "yes"}}
	require.NoError(t, s.Client.Create(ctx, ie))
	ie = s.WaitImage(t, client.ObjectKeyFromObject(ie))
	iso := download(t, ie.Status.ISODownloadURL)

	t.Run("plain", func(t *testing.T) {
		t.Parallel()
		v := bootVMOn(t, plain.Bridge, vm.Options{Name: "static-plain", CDROM: iso, Boot: "d", MAC: plainMAC, MemoryMB: 1536})
		a := agentWithMAC(t, ns, plainMAC, v)
		registered(t, "ISO, static IPv4 from an NMStateConfig, no DHCP", v, a)
		requireSerial(t, v, "network: profile host-plain_eno1.nmconnection on eth0: 198.18.12.10/24, via 198.18.12.1, dns 198.18.12.53",
			"network: profile host-vlan_eno1.nmconnection is for MAC "+vlanMAC+", not on this host")
		require.NotContains(t, v.Log(), "udhcpc", "no DHCP client ran: the segment has no server")
		require.Equal(t, []string{"198.18.12.10/24"}, a.Status.Inventory.Interfaces[0].IPV4Addresses)
	})
	t.Run("vlan", func(t *testing.T) {
		t.Parallel()
		v := bootVMOn(t, tagged.Bridge, vm.Options{Name: "static-vlan", CDROM: iso, Boot: "d", MAC: vlanMAC, MemoryMB: 1536})
		a := agentWithMAC(t, ns, vlanMAC, v)
		registered(t, "ISO, VLAN 100 with static IPv4 from an NMStateConfig, no DHCP", v, a)
		requireSerial(t, v, "network: profile host-vlan_eno1.nmconnection on eth0: ",
			"network: profile host-vlan_eno1.100.nmconnection on eno1.100: 198.18.13.10/24, via 198.18.13.1, dns 198.18.13.53")
		require.NotContains(t, v.Log(), "udhcpc")
	})
	// A host the image carries no config for boots it with DHCP: once
	// keyfiles exist CoreOS drops NetworkManager's own DHCP profiles, and
	// the image's catch-all profile takes their place.
	t.Run("dhcp", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2c:10:03"
		v := bootVM(t, vm.Options{Name: "static-none", CDROM: iso, Boot: "d", MAC: mac, MemoryMB: 1536})
		agentWithMAC(t, ns, mac, v)
		requireSerial(t, v, "network: profile agentboot-dhcp.nmconnection on eth0: ipv4 auto, ipv6 auto")
	})
}
