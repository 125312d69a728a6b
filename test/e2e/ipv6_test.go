//go:build e2e

package e2e_test

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/test/e2e/lab"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// IPv6, deployed as on an IPv6-only management network: a stack of its
// own whose every published URL (agent API, image service) is an IPv6
// literal; the lab's main stack publishes IPv4 ones. Hosts boot its ISO
// (a) on an IPv6-only segment: router advertisements (SLAAC), no DHCP
// server of either family, no IPv4 address at all; (b) on a dual-stack
// segment (DHCPv4 and SLAAC), reaching the service on another IPv6 network
// through the lab's router. (c) A host network boots on a third, IPv6-only
// segment: OVMF's PXE over IPv6 gets an address and ipxe.efi from the
// site's dnsmasq (DHCPv6 and TFTP, configured with the README's recipe),
// and iPXE the InfraEnv's boot script over HTTP on IPv6. Each fetches the
// agent over IPv6, registers, reports its addresses, and passes its
// network validations.
func TestLabIPv6(t *testing.T) {
	t.Parallel()
	only, err := theLab.SegmentIPv6(16, false)
	require.NoError(t, err)
	dual, err := theLab.SegmentIPv6(17, true)
	require.NoError(t, err)
	require.NoError(t, theLab.RouterAdvertisements("ra16", only))
	require.NoError(t, theLab.Dnsmasq("dual17", dual.Bridge, dual.HostIP, dual.Prefix, lab.RAOptions(dual)...))

	v6 := stack.Start(t, stack.Options{AdvertiseHost: only.HostIP6, Listen: theLab.Listen, Dial: theLab.Dial, Quiet: true})
	ie := v6.CreateInfraEnv(t, "lab-ipv6", "ipv6", nil)
	require.True(t, strings.HasPrefix(ie.Status.ISODownloadURL, "https://["+only.HostIP6+"]:"), ie.Status.ISODownloadURL)
	iso := v6.Download(t, ie.Status.ISODownloadURL)

	// booted boots the ISO with mac on bridge and returns the Agent's
	// interface, checked to have passed its network validations, and the
	// VM.
	booted := func(t *testing.T, path, bridge, mac string) (v1beta1.HostInterface, *vm.VM) {
		v := bootVMOn(t, bridge, vm.Options{Name: "ipv6-" + strings.ReplaceAll(mac[12:], ":", ""), CDROM: iso, Boot: "d", MAC: mac, MemoryMB: 1536})
		a := agentOf(t, v6, ie.Namespace, mac, v)
		registered(t, path, v, a)
		return ifaceOf(t, a, mac), v
	}
	t.Run("ipv6-only", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:26:16:01"
		i, v := booted(t, "ISO, IPv6-only (SLAAC, no DHCP), IPv6 service URLs", only.Bridge, mac)
		require.Empty(t, i.IPV4Addresses, "no IPv4 on this segment")
		require.Equal(t, []string{slaac(only.Prefix6, mac)}, i.IPV6Addresses)
		requireSerial(t, v, "network: eth0 has "+slaac(only.Prefix6, mac))
	})
	t.Run("pxe", func(t *testing.T) {
		t.Parallel()
		seg, err := theLab.SegmentIPv6(18, false)
		require.NoError(t, err)
		conf := recipe(t, "dnsmasq-ipv6.conf", map[string]string{"RANGE6_FIRST": seg.Prefix6 + "100", "RANGE6_LAST": seg.Prefix6 + "1ff",
			"TFTP_SERVER6": seg.HostIP6, "IPXE_SCRIPT_URL": ie.Status.BootArtifacts.IpxeScriptURL})
		require.NoError(t, theLab.Start("ipv6-site-dnsmasq", lab.DnsmasqReady, "dnsmasq", "--no-daemon", "--port=0",
			"--interface="+seg.Bridge, "--bind-interfaces", "--except-interface=lo", "--log-dhcp",
			"--dhcp-leasefile="+filepath.Join(theLab.Dir, "ipv6-site.leases"),
			"--log-facility="+filepath.Join(theLab.Dir, "ipv6-site-dnsmasq.log"), "--conf-file="+conf))
		const mac = "52:54:00:26:18:01"
		v := bootVMOn(t, seg.Bridge, vm.Options{Name: "ipv6-pxe", UEFI: true, NoNICROM: true, PXEv6Only: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		a := agentOf(t, v6, ie.Namespace, mac, v)
		registered(t, "IPv6-only UEFI PXE (OVMF PXEv6), the site's dnsmasq DHCPv6 (recipe), IPv6 service URLs", v, a)
		requireSerial(t, v, "Start PXE over IPv6", "NBP filename is ipxe.efi", "Filename: "+ie.Status.BootArtifacts.IpxeScriptURL)
		require.NotContains(t, v.Log(), "Start PXE over IPv4")
		i := ifaceOf(t, a, mac)
		require.Empty(t, i.IPV4Addresses)
		require.Equal(t, []string{slaac(seg.Prefix6, mac)}, i.IPV6Addresses, "the booted OS's own SLAAC address")
	})
	t.Run("dual-stack", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:26:17:01"
		i, v := booted(t, "ISO, dual-stack (DHCPv4 + SLAAC), IPv6 service URLs", dual.Bridge, mac)
		// The host may have gone on with SLAAC before its DHCPv4 lease
		// (either family is "up"): the agent reports again each minute.
		// (A ticker, not Eventually: ifaceOf and agentOf fail the test,
		// which only the test's own goroutine may.)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for deadline := time.Now().Add(3 * time.Minute); len(i.IPV4Addresses) == 0 && time.Now().Before(deadline); <-tick.C {
			i = ifaceOf(t, agentOf(t, v6, ie.Namespace, mac, v), mac)
		}
		require.Len(t, i.IPV4Addresses, 1)
		require.True(t, strings.HasPrefix(i.IPV4Addresses[0], dual.Prefix+"."), "%v", i.IPV4Addresses)
		require.Equal(t, []string{slaac(dual.Prefix6, mac)}, i.IPV6Addresses)
	})
}

// ifaceOf returns the Agent's interface with mac, and checks that the
// Agent passed its network validations.
func ifaceOf(t *testing.T, a v1beta1.Agent, mac string) v1beta1.HostInterface {
	t.Helper()
	for _, id := range []string{"has-inventory", "connected", "ntp-synced", "identity-undisputed"} {
		require.Equal(t, v1beta1.ValidationSuccess, stack.Validation(&a, id).Status, "%s: %+v", id, stack.Validation(&a, id))
	}
	for _, i := range a.Status.Inventory.Interfaces {
		if i.MacAddress == mac {
			return i
		}
	}
	t.Fatalf("no interface %s in the inventory of Agent %s", mac, a.Name)
	return v1beta1.HostInterface{}
}

// slaac is the address a Linux host forms from a router's prefix for its
// MAC (EUI-64: the universal/local bit flipped, ff:fe in the middle), with
// the prefix length.
func slaac(prefix, mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		panic(err)
	}
	ip := net.ParseIP(prefix)
	copy(ip[8:], []byte{hw[0] ^ 2, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]})
	return ip.String() + "/64"
}

// A host that tries to network boot over IPv6 where agentboot's PXE
// service (DHCP over IPv4 only) serves a dual-stack segment: OVMF's PXE
// over IPv6 is not answered, and the service says so once for the MAC,
// with what to do, in its log and in the host's boot trace.
func TestLabPXEIPv6NotServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ie := infraEnv(t, nil)
	seg, err := theLab.SegmentIPv6(19, true)
	require.NoError(t, err)
	require.NoError(t, theLab.Dnsmasq("dual19", seg.Bridge, seg.HostIP, seg.Prefix, lab.RAOptions(seg)...))
	startPXE(t, "pxe-ipv6", seg.Bridge, seg.HostIP)
	const mac = "52:54:00:26:19:01"
	declareHost(t, ie, "ipv6-unserved", mac)
	v := bootVMOn(t, seg.Bridge, vm.Options{Name: "ipv6-unserved", UEFI: true, NoNICROM: true, PXEv6Only: true, Boot: "n", MAC: mac, MemoryMB: 1536})
	line := regexp.MustCompile(`msg="DHCPv6 network boot client not answered: agentboot pxe answers DHCP over IPv4 only: an IPv6 network boot needs the site's DHCPv6 server to give the boot file \(docs/pxe.md#ipv6\)" logger=pxe/dhcp mac=` +
		mac + ` from=fe80::5054:ff:fe26:1901 request="DHCPv6 SOLICIT, EFI x86-64, PXEClient`)
	require.Eventually(t, func() bool { return line.MatchString(theLab.Log("pxe-ipv6.out")) }, bootTimeout, time.Second,
		"serial log:\n%s", v.Tail(40))
	// While OVMF still solicits: afterwards it tries HTTP boot over IPv4,
	// which agentboot answers, and that is the trace's DHCP hop then.
	var bt v1alpha1.BootTrace
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, client.ObjectKey{Namespace: ie.Namespace, Name: boottrace.Name(mac)}, &bt) != nil {
			return false
		}
		for _, h := range bt.Status.Hops {
			if h.Hop == boottrace.DHCP && !h.OK && strings.Contains(h.Outcome, "not answered: agentboot pxe answers DHCP over IPv4 only") {
				return true
			}
		}
		return false
	}, time.Minute, time.Second, "boot trace of %s: %+v", mac, &bt.Status)
	// OVMF retries its solicits, then gives up: one line for all of them.
	_, err = v.WaitFor(ctx, regexp.MustCompile(`PXE-E16: No valid offer received`), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	require.Len(t, line.FindAllString(theLab.Log("pxe-ipv6.out"), -1), 1, "logged once for its every solicit:\n%s", theLab.Log("pxe-ipv6.out"))
}
