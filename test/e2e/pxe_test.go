//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/test/capiagent"
	"github.com/agentboot/agentboot/test/e2e/lab"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

// bootScriptURL is the image service's boot script by MAC, as the PXE
// service hands it to iPXE.
func bootScriptURL() string { return s.Settings.ImageServiceHTTPURL + "/boot.ipxe" }

// observationsToken is the token the lab's PXE services post their boot
// observations to the image service with, from observationsTokenFile.
const observationsToken = "lab-boot-observations-0123456789"

var observationsTokenFile string

// startPXE runs `agentboot pxe` in the lab on one segment, posting what it
// sees to the image service over HTTPS.
func startPXE(t *testing.T, name, bridge, hostIP string, extra ...string) {
	t.Helper()
	args := append([]string{agentbootBin, "pxe", "--log-format", "text", "--log-level", "debug",
		"--interface", bridge, "--boot-script-url", bootScriptURL(),
		"--tftp-addr", hostIP + ":69", "--http-addr", hostIP + ":8070",
		"--boot-observations-url", s.Settings.ImageServiceURL + "/boot-observations",
		"--boot-observations-token-file", observationsTokenFile, "--boot-observations-ca-file", s.CAFile}, extra...)
	require.NoError(t, theLab.Start(name, lab.PXEReady, args...))
}

// agentWithMAC waits until an Agent in ns reports an inventory with mac.
func agentWithMAC(t *testing.T, ns, mac string, v *vm.VM) v1beta1.Agent {
	t.Helper()
	return agentOf(t, s, ns, mac, v)
}

// agentOf waits until an Agent of stack st in ns reports an inventory
// with mac.
func agentOf(t *testing.T, st *stack.Stack, ns, mac string, v *vm.VM) v1beta1.Agent {
	t.Helper()
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		var list v1beta1.AgentList
		if st.Client.List(context.Background(), &list, client.InNamespace(ns)) == nil {
			for _, a := range list.Items {
				for _, i := range a.Status.Inventory.Interfaces {
					if i.MacAddress == mac && a.Status.Inventory.ReportTime != nil {
						return a
					}
				}
			}
		}
		if v.Exited() {
			break
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("no Agent with MAC %s registered in %s; serial log of %s:\n%s", mac, ns, v.Name, v.Tail(60))
	return v1beta1.Agent{}
}

// ipv4Of is the IPv4 addresses the Agent reports on its NIC with mac.
func ipv4Of(a v1beta1.Agent, mac string) []string {
	for _, i := range a.Status.Inventory.Interfaces {
		if i.MacAddress == mac {
			return i.IPV4Addresses
		}
	}
	return nil
}

// requireSerial checks that the VM's console showed each pattern.
func requireSerial(t *testing.T, v *vm.VM, patterns ...string) {
	t.Helper()
	log := v.Log()
	for _, p := range patterns {
		require.Contains(t, log, p, "serial log of %s", v.Name)
	}
}

// (a) The site's DHCP server (dnsmasq) hands out addresses only; agentboot's
// ProxyDHCP and TFTP boot the hosts: UEFI firmware's own PXE loads
// ipxe.efi over TFTP, iPXE (also the BIOS NIC's iPXE ROM) is sent to the
// boot script for its MAC, which boots the InfraEnv labelled as the PXE
// default. (d) A host whose Agent is installed is sent on to its disk.
func TestLabPXEProxy(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"} })
	t.Cleanup(func() {
		// Other tests' hosts must not boot this InfraEnv.
		var cur v1beta1.InfraEnv
		if s.Client.Get(ctx, client.ObjectKeyFromObject(ie), &cur) == nil {
			patch := client.MergeFrom(cur.DeepCopy())
			delete(cur.Labels, v1beta1.PXEDefaultLabel)
			_ = s.Client.Patch(ctx, &cur, patch)
		}
	})
	startPXE(t, "pxe-proxy", "br0", lab.HostIP)
	script := regexp.QuoteMeta(bootScriptURL())

	t.Run("uefi-firmware-pxe", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2a:00:01"
		v := bootVMOn(t, "br0", vm.Options{Name: "pxe-uefi", UEFI: true, NoNICROM: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		a := agentWithMAC(t, ie.Namespace, mac, v)
		registered(t, "IPv4 UEFI PXE, agentboot proxyDHCP + TFTP next to dnsmasq", v, a)
		// Its boot trace has every hop, from the PXE service's and the
		// image service's sightings, and its Agent continues it.
		var bt v1alpha1.BootTrace
		require.Eventually(t, func() bool {
			if s.Client.Get(ctx, client.ObjectKey{Namespace: ie.Namespace, Name: boottrace.Name(mac)}, &bt) != nil {
				return false
			}
			ok := map[string]bool{}
			for _, h := range bt.Status.Hops {
				ok[h.Hop] = h.OK
			}
			return ok[boottrace.DHCP] && ok[boottrace.BootFile] && ok[boottrace.BootScript] && ok[boottrace.Kernel] && ok[boottrace.Initrd] && ok[boottrace.RootFS]
		}, time.Minute, time.Second, "boot trace of %s: %+v", mac, &bt.Status)
		require.Equal(t, ie.Namespace+"/"+ie.Name, bt.Status.InfraEnv)
		d := boottrace.Diagnose(&bt, &a)
		require.Contains(t, []string{boottrace.Inventory, boottrace.Heartbeat}, d.Stopped, "%+v", d)
		requireSerial(t, v, "NBP filename is ipxe.efi", "Filename: "+bootScriptURL()+"?mac="+mac)
		// OVMF asks for windowsize 4 (RFC 7440): real firmware takes four
		// blocks per acknowledgement from agentboot's TFTP server.
		require.Regexp(t, `msg="TFTP transfer ended" logger=pxe/tftp client=\S+ file=ipxe.efi result=ok blksize=1468 windowsize=4 `,
			theLab.Log("pxe-proxy.out"))
	})
	t.Run("bios-ipxe-rom", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2a:00:02"
		v := bootVMOn(t, "br0", vm.Options{Name: "pxe-bios", Boot: "n", MAC: mac, MemoryMB: 1536})
		registered(t, "IPv4 BIOS, NIC's iPXE ROM, agentboot proxyDHCP", v, agentWithMAC(t, ie.Namespace, mac, v))
		require.Regexp(t, "Filename: "+script+`\?mac=`+mac, v.Log())
	})
	t.Run("installed-host-boots-disk", func(t *testing.T) {
		t.Parallel()
		const mac = "52:54:00:2a:00:03"
		installedAgent(t, ie, mac)
		disk := bootSectorDisk(t)
		v := bootVMOn(t, "br0", vm.Options{Name: "pxe-installed", Boot: "order=nc", MAC: mac, Disks: []string{disk}})
		_, err := v.WaitFor(ctx, regexp.MustCompile(diskMessage), bootTimeout)
		require.NoError(t, err, "serial log:\n%s", v.Tail(40))
		requireSerial(t, v, "Filename: "+bootScriptURL()+"?mac="+mac, "agentboot: this host is installed; booting from disk")
	})
}

// installedAgent creates an Agent for mac whose installation is done, as
// the Agent controller would have left it.
func installedAgent(t *testing.T, ie *v1beta1.InfraEnv, mac string) {
	t.Helper()
	ctx := context.Background()
	a := &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "0c7e4b52-1d7a-4f51-9b0e-6d3c2a1f0e03", Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
		Spec:       v1beta1.AgentSpec{Role: v1beta1.AgentRoleWorker, Approved: true, ClusterDeploymentName: &v1beta1.ClusterReference{Name: "c1", Namespace: "clusters-c1"}},
	}
	require.NoError(t, s.Client.Create(ctx, a))
	patch := client.MergeFrom(a.DeepCopy())
	a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{Name: "eth0", MacAddress: mac, IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{}}}
	a.Status.Progress.CurrentStage = v1beta1.StageDone
	require.NoError(t, s.Client.Status().Patch(ctx, a, patch))
}

// diskMessage is what the boot sector of bootSectorDisk prints.
const diskMessage = "agentboot-test: booted from disk"

// bootSectorDisk is a disk whose MBR boot code writes diskMessage to the
// first serial port and halts: proof that the firmware fell through to the
// disk.
func bootSectorDisk(t *testing.T) string {
	t.Helper()
	code := []byte{
		0x31, 0xc0, // xor ax, ax
		0x8e, 0xd8, // mov ds, ax
		0xfc,             // cld
		0xbe, 0x17, 0x7c, // mov si, 0x7c17 (the message)
		0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1)
		0xac,       // next: lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz done
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp next
		0xfa,       // done: cli
		0xf4,       // hlt
		0xeb, 0xfd, // jmp hlt
	}
	mbr := make([]byte, 1<<20)
	copy(mbr, code)
	copy(mbr[len(code):], diskMessage+"\r\n\x00")
	mbr[510], mbr[511] = 0x55, 0xaa
	p := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(p, mbr, 0o644))
	return p
}

// (b) The site's PXE server stays in charge and chainloads the InfraEnv's
// published iPXE script (status.bootArtifacts.ipxeScript), with the
// README's recipes: dnsmasq, and ISC dhcpd with a TFTP server.
func TestLabPXEChainload(t *testing.T) {
	ie := infraEnv(t, nil)
	url := ie.Status.BootArtifacts.IpxeScriptURL
	require.NotEmpty(t, url)

	t.Run("dnsmasq", func(t *testing.T) {
		t.Parallel()
		seg, err := theLab.Segment(1)
		require.NoError(t, err)
		// The README's dnsmasq recipe, next to the site's own DHCP range.
		conf := recipe(t, "dnsmasq-chainload.conf", map[string]string{"IPXE_SCRIPT_URL": url})
		require.NoError(t, theLab.Dnsmasq("chain-dnsmasq", seg.Bridge, seg.HostIP, seg.Prefix, "--conf-file="+conf))
		const mac = "52:54:00:2b:00:01"
		v := bootVMOn(t, seg.Bridge, vm.Options{Name: "chain-dnsmasq", UEFI: true, NoNICROM: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		registered(t, "IPv4 UEFI PXE, chainloaded by the site's dnsmasq", v, agentWithMAC(t, ie.Namespace, mac, v))
		requireSerial(t, v, "NBP filename is ipxe.efi")
	})
	t.Run("isc-dhcpd", func(t *testing.T) {
		t.Parallel()
		if _, err := os.Stat("/usr/sbin/dhcpd"); err != nil {
			t.Fatal("ISC dhcpd not found: install Debian package isc-dhcp-server (.ci/packages)")
		}
		seg, err := theLab.Segment(3)
		require.NoError(t, err)
		conf := recipe(t, "dhcpd-chainload.conf", map[string]string{
			"IPXE_SCRIPT_URL": url, "SUBNET": seg.Prefix + ".0", "RANGE_FIRST": seg.Prefix + ".100", "RANGE_LAST": seg.Prefix + ".199",
			"ROUTER": seg.HostIP, "TFTP_SERVER": seg.HostIP,
		})
		leases := filepath.Join(theLab.Dir, "dhcpd.leases")
		require.NoError(t, os.WriteFile(leases, nil, 0o644))
		require.NoError(t, theLab.Start("chain-dhcpd", lab.DhcpdReady, "/usr/sbin/dhcpd", "-4", "-f", "-d", "-cf", conf, "-lf", leases,
			"-pf", filepath.Join(theLab.Dir, "dhcpd.pid"), seg.Bridge))
		// The site's TFTP server, serving Debian's iPXE binaries.
		require.NoError(t, theLab.Start("chain-tftp", lab.DnsmasqReady, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
			"--interface="+seg.Bridge, "--bind-interfaces", "--enable-tftp", "--tftp-root=/usr/lib/ipxe"))
		const mac = "52:54:00:2b:00:02"
		v := bootVMOn(t, seg.Bridge, vm.Options{Name: "chain-dhcpd", UEFI: true, NoNICROM: true, Boot: "n", MAC: mac, MemoryMB: 1536})
		registered(t, "IPv4 UEFI PXE, chainloaded by the site's ISC dhcpd", v, agentWithMAC(t, ie.Namespace, mac, v))
		requireSerial(t, v, "NBP filename is ipxe.efi")
	})
}

// recipe fills in a chainloading recipe of docs/recipes (the README shows
// the same text) and returns the file.
func recipe(t *testing.T, name string, values map[string]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "recipes", name))
	require.NoError(t, err)
	text := string(data)
	var directives []string // what dnsmasq reads: not the comments
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			directives = append(directives, line)
		}
	}
	for k, v := range values {
		require.Contains(t, strings.Join(directives, "\n"), k, "a directive of %s uses %s", name, k)
		text = strings.ReplaceAll(text, k, v)
	}
	p := filepath.Join(theLab.Dir, name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// (c) On an isolated network agentboot is the only DHCP server: it gives
// the host its reserved address, boots it, and keeps the lease on disk. The
// host's BareMetalHost names the InfraEnv it boots.
func TestLabPXEAuthoritative(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ie := infraEnv(t, nil)
	seg, err := theLab.Segment(2)
	require.NoError(t, err)
	const mac = "52:54:00:2c:00:01"
	reserved := seg.Prefix + ".20"
	bmh := &metal3.BareMetalHost{
		// Detached: there is no BMC at that address, only the boot MAC matters.
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "isolated-0", Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name},
			Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}},
		Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: metal3.BMCDetails{Address: "ipmi://" + seg.Prefix + ".9", CredentialsName: "isolated-0-bmc"}},
	}
	require.NoError(t, s.Client.Create(ctx, bmh))
	leases := filepath.Join(theLab.Dir, "pxe-authoritative-leases.json")
	startPXE(t, "pxe-authoritative", seg.Bridge, seg.HostIP, "--mode", "authoritative", "--pool", seg.Prefix+".100-"+seg.Prefix+".150",
		"--router", seg.HostIP, "--reservation", mac+"="+reserved, "--lease-file", leases)
	v := bootVMOn(t, seg.Bridge, vm.Options{Name: "pxe-isolated", Boot: "n", MAC: mac, MemoryMB: 1536})
	a := agentWithMAC(t, ie.Namespace, mac, v)
	registered(t, "IPv4 BIOS, NIC's iPXE ROM, agentboot authoritative DHCP", v, a)
	require.Contains(t, ipv4Of(a, mac), reserved+"/24", "the reserved address")
	// On disk as the lease file's journal line, which the next start folds
	// into the lease file.
	data, err := os.ReadFile(leases + ".journal")
	require.NoError(t, err)
	require.Contains(t, string(data), `{"op":"ack","lease":{"mac":"`+mac+`","ip":"`+reserved+`"`)
	require.Contains(t, theLab.Log("pxe-authoritative.out"), "type=ACK mac="+mac)
}

// (e) arm64 UEFI firmware (AAVMF's own PXE, DHCP architecture 11) next to
// the site's DHCP server gets agentboot's netboot GRUB from the PXE
// service. GRUB asks the image service, through the PXE service's TFTP
// server, what its MAC boots, loads the aarch64 kernel and initrd the same
// way, and the host registers as aarch64. In the same namespace an x86_64
// host boots through iPXE: the cpu-architecture label selects each. An
// Arm host whose BareMetalHost names the x86_64 InfraEnv is told why and
// not booted: it starts the OS on its disk. A NodePool selecting aarch64
// Agents has
// cluster-api-provider-agent bind the Arm host: it installs the aarch64
// disk image, network-boots again, is sent to its disk by GRUB, and
// fetches its worker config.
func TestLabPXEArm64(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	grub := filepath.Join(testenv.RepoRoot(), "bin", "pxe", "grubnetaa64.efi")
	_, err := os.Stat(grub)
	require.NoError(t, err, "make pxe-grub builds it (make e2e does)")
	seg, err := theLab.Segment(5)
	require.NoError(t, err)
	require.NoError(t, theLab.Dnsmasq("arm-dnsmasq", seg.Bridge, seg.HostIP, seg.Prefix))
	startPXE(t, "pxe-arm64", seg.Bridge, seg.HostIP, "--arm64-binary", grub)

	ns := s.Namespace(t, "lab-mixed")
	envs := map[string]*v1beta1.InfraEnv{}
	for _, arch := range []string{"aarch64", "x86_64"} {
		ie := stack.NewInfraEnv(ns, strings.ReplaceAll(arch, "_", "-"))
		ie.Spec.CPUArchitecture = arch
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 1024, MinDiskSizeGB: 10}
		require.NoError(t, s.Client.Create(ctx, ie))
		envs[arch] = s.WaitImage(t, client.ObjectKeyFromObject(ie))
	}
	const armMAC, wrongMAC, x86MAC = "52:54:00:2e:00:01", "52:54:00:2e:00:02", "52:54:00:2e:00:03"
	for mac, arch := range map[string]string{armMAC: "aarch64", wrongMAC: "x86_64", x86MAC: "x86_64"} {
		h := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "host-" + strings.ReplaceAll(mac, ":", ""),
			Labels:      map[string]string{v1beta1.InfraEnvNameLabel: envs[arch].Name},
			Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}},
			Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: metal3.BMCDetails{Address: "ipmi://198.18.5.9", CredentialsName: "none"}}}
		require.NoError(t, s.Client.Create(ctx, h))
	}

	// Network first, then the disk, rebooting in place as a server does.
	arm := bootVMOn(t, seg.Bridge, vm.Options{Name: "pxe-arm64", Arch: "aarch64", Boot: "n", MAC: armMAC, MemoryMB: 1536, Reboot: true,
		Disks: []string{sparseDisk(t, 20_000_000_000)}})
	// The refused host has an OS on its disk, which it must reach.
	iso, err := testenv.DevImageFor("aarch64")
	require.NoError(t, err)
	osDisk, err := os.ReadFile(filepath.Join(filepath.Dir(iso), "agentboot-dev-metal.aarch64.raw"))
	require.NoError(t, err)
	wrongDisk := filepath.Join(t.TempDir(), "os.raw")
	require.NoError(t, os.WriteFile(wrongDisk, osDisk, 0o644))
	wrong := bootVMOn(t, seg.Bridge, vm.Options{Name: "pxe-arm64-wrong", Arch: "aarch64", Boot: "n", MAC: wrongMAC, MemoryMB: 1024, Disks: []string{wrongDisk}})
	x86 := bootVMOn(t, seg.Bridge, vm.Options{Name: "pxe-x86-mixed", UEFI: true, NoNICROM: true, Boot: "n", MAC: x86MAC, MemoryMB: 1536})

	// GRUB wraps its 80-column console anywhere, even inside a word. The
	// host is told why, and GRUB starts the OS on its disk (EDK2 firmware
	// would stop at its menu after a plain exit).
	_, err = wrong.WaitFor(ctx, regexp.MustCompile("Booting `agentboot dev OS'"), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", wrong.Tail(40))
	require.Contains(t, noSpace(wrong.Log()), noSpace("boots x86_64 hosts and this host is aarch64"))
	requireSerial(t, wrong, "NBP filename is grubnetaa64.efi", "agentboot: not booting discovery", "agentboot: starting /EFI/BOOT/BOOTAA64.EFI on hd0,msdos1")
	wrong.Kill()

	a := agentWithMAC(t, ns, armMAC, arm)
	registered(t, "IPv4 arm64 UEFI PXE, agentboot's netboot GRUB", arm, a)
	requireSerial(t, arm, "NBP filename is grubnetaa64.efi", "agentboot: network boot through "+seg.HostIP, "agentboot: loading the discovery kernel")
	require.Equal(t, "aarch64", a.Status.Inventory.CPU.Architecture)
	agentWithMAC(t, ns, x86MAC, x86)
	for arch, mac := range map[string]string{"aarch64": armMAC, "x86_64": x86MAC} {
		var list v1beta1.AgentList
		require.NoError(t, s.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"inventory.agent-install.openshift.io/cpu-architecture": arch}))
		require.Len(t, list.Items, 1, arch)
		require.Equal(t, mac, list.Items[0].Status.Inventory.Interfaces[0].MacAddress, arch)
	}
	require.Regexp(t, `msg="TFTP transfer ended" logger=pxe/tftp client=\S+ file=agentboot/boot-artifacts/aarch64/\S+/vmlinuz result=ok`,
		theLab.Log("pxe-arm64.out"), "the kernel came through the PXE service's TFTP")

	// Installation, through the same path as x86 hosts.
	cluster := hosted.Start(t)
	ln, err := theLab.Listen("tcp", lab.HostIP+":0")
	require.NoError(t, err)
	endpoint := hosted.IgnitionEndpoint(t, ln, lab.HostIP)
	hc := capiagent.Start(t, s.Env, capiagent.Options{Namespace: s.Namespace(t, "clusters"), Name: "arm", AgentNamespace: ns,
		Hosted: cluster, IgnitionEndpoint: endpoint.Addr, IgnitionCA: endpoint.CA, Token: hosted.Token, Provider: true})
	np := hc.NodePool("arm", map[string]string{"inventory.agent-install.openshift.io/cpu-architecture": "aarch64"})
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.Approved = true
	require.NoError(t, s.Client.Patch(ctx, &a, patch))
	np.Scale(1)
	require.Eventually(t, func() bool {
		var cur v1beta1.Agent
		return s.Client.Get(ctx, client.ObjectKeyFromObject(&a), &cur) == nil && cur.Spec.ClusterDeploymentName != nil &&
			cur.Status.Progress.CurrentStage != ""
	}, 5*time.Minute, time.Second, "the provider never bound the aarch64 Agent and started its installation")
	waitWorker(t, arm, client.ObjectKeyFromObject(&a))
	requireSerial(t, arm, `msg="rebooting into the installed system"`, "agentboot: this host is installed; booting from disk", "agentboot: starting /EFI/BOOT/BOOTAA64.EFI on hd0,msdos1")
	require.Contains(t, endpoint.Seen(), "/ignition Bearer "+hosted.Token+" "+hc.HC.Namespace+"/arm")
	var x86Agent v1beta1.Agent
	require.NoError(t, s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: agentWithMAC(t, ns, x86MAC, x86).Name}, &x86Agent))
	require.Nil(t, x86Agent.Spec.ClusterDeploymentName, "the NodePool selects aarch64 Agents only")
}

// noSpace is s without white space, to find text GRUB wrapped.
func noSpace(s string) string {
	return strings.Join(strings.Fields(s), "")
}
