package boot_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

// ignitionEndpoint is the hosted cluster's Ignition endpoint, reached
// from qemu's user network.
func ignitionEndpoint(t *testing.T) *hosted.Endpoint {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return hosted.IgnitionEndpoint(t, ln, hostFromGuest)
}

// devDisk is the dev OS image's raw disk image for arch.
func devDisk(t *testing.T, arch string) string {
	t.Helper()
	iso, err := testenv.DevImageFor(arch)
	require.NoError(t, err)
	return filepath.Join(filepath.Dir(iso), "agentboot-dev-metal."+arch+".raw")
}

// A server boots the InfraEnv's ISO, its agent registers, and its Agent
// describes the machine: a PC with BIOS (x86_64), and an aarch64 server
// (qemu's virt board, UEFI from AAVMF) with the dev OS image's aarch64
// build, the arm64 agent and a virtualization verdict KVM itself gave (the
// board emulates EL2, so the guest's KVM really runs a guest). Approved,
// the host meets the InfraEnv's requirements. Then `agent install`, run in
// that discovery OS, writes the raw disk image to the VM's disk (checksum
// verified) with the pointer config on its boot partition, where CoreOS's
// installer puts it, and reboots; the VM boots from that disk (the aarch64
// firmware finds the installed EFI system partition) and fetches the worker
// config from the hosted cluster's Ignition endpoint with the token.
func TestAgentInstallThenBootFromDisk(t *testing.T) {
	t.Parallel()
	for _, arch := range []string{"x86_64", "aarch64"} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			agentInstallThenBootFromDisk(t, arch)
		})
	}
}

// discovered is what the Agent of a host discovered with arch must show.
type discovered struct {
	// infraEnvArch is how the InfraEnv names the architecture: aarch64
	// is asked for by its alias arm64, as users write it.
	infraEnvArch string
	cpus         int64
	memoryMB     int
	// memoryOver is how far above memoryMB the inventory's physical
	// memory may be: on the aarch64 virt board, ghw's total (from the
	// kernel's memory blocks) came out one 128 MiB block above the RAM.
	memoryOver int64
	mac        string
	bootMode   string
	check      func(t *testing.T, a *v1beta1.Agent)
}

var discoveredAs = map[string]discovered{
	"x86_64": {infraEnvArch: "x86_64", cpus: 1, memoryMB: 1024, mac: "52:54:00:ab:cd:01", bootMode: "bios", check: func(t *testing.T, a *v1beta1.Agent) {
		require.NotNil(t, a.Status.Inventory.Virtualization)
	}},
	"aarch64": {infraEnvArch: v1beta1.CPUArchitectureArm64, cpus: 2, memoryMB: 1536, memoryOver: 128 << 20, mac: "52:54:00:ab:cd:64", bootMode: "uefi", check: func(t *testing.T, a *v1beta1.Agent) {
		inv := a.Status.Inventory
		require.NotEmpty(t, inv.CPU.ModelName, "the model from the CPU's MIDR: an Arm kernel has no `model name`")
		virt := inv.Virtualization
		require.Equal(t, v1beta1.VirtSupported, virt.Verdict, "%+v", virt)
		require.True(t, virt.KVMUsable, "%+v", virt)
		require.Contains(t, virt.Reason, "EL2")
	}},
}

func agentInstallThenBootFromDisk(t *testing.T, arch string) {
	want := discoveredAs[arch]
	image := devDisk(t, arch)
	data, err := os.ReadFile(image)
	require.NoError(t, err, "make dev-image builds the raw disk image")
	sum := sha256.Sum256(data)
	// The installation waits until the test has seen the host discovered:
	// the discovery OS reboots into the installed disk as soon as it is
	// written.
	discoveredCh := make(chan struct{})
	imgSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/discovered" {
			select {
			case <-discoveredCh:
			default:
				http.Error(w, "not yet", http.StatusNotFound)
			}
			return
		}
		http.ServeFile(w, r, image)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = imgSrv.Serve(ln) }()
	t.Cleanup(func() { imgSrv.Close() })
	ep := ignitionEndpoint(t)

	base := fmt.Sprintf("http://%s:%d", hostFromGuest, ln.Addr().(*net.TCPAddr).Port)
	script := fmt.Sprintf(`until wget -q -O /dev/null %s/discovered 2>/dev/null; do sleep 1; done
exec /usr/local/bin/agent install --disk /dev/vda --image-url %s/disk.raw --image-sha256 %s --ignition-file /etc/agentboot-test/pointer.ign --reboot
`, base, base, hex.EncodeToString(sum[:]))
	override := hosted.IgnitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{
			map[string]any{
				"path": "/etc/agentboot-test/pointer.ign", "mode": 0o600,
				"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString(ep.Pointer)},
			},
			map[string]any{
				"path": "/usr/local/bin/install.sh", "mode": 0o755,
				"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString([]byte(script))},
			},
		}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "install.service", "enabled": true,
			"contents": "[Service]\nExecStart=/bin/sh /usr/local/bin/install.sh\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.IgnitionConfigOverride = string(override)
		ie.Spec.CPUArchitecture = want.infraEnvArch
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 900}
	})
	iso := download(t, ie.Status.ISODownloadURL)
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, nil, 0o644))
	require.NoError(t, os.Truncate(disk, 120_000_000_000)) // sparse

	// Discovery.
	v := vm.Start(t, vm.Options{Name: "agent-install", Arch: arch, CPUs: int(want.cpus), CDROM: iso, Boot: "d", Net: "user", MAC: want.mac, MemoryMB: want.memoryMB, Disks: []string{disk}})
	kernel := `devinit: agentboot dev OS starting \(kernel \S+-amd64\)`
	if arch == "aarch64" {
		kernel = `devinit: agentboot dev OS starting \(kernel \S+-arm64\)`
	}
	expect(t, v, append([]string{kernel, `devinit: booted from ISO agentboot-dev-\S+ on /dev/sr0`}, appliedDiscoveryIgnitionFor(arch)...)...)
	// The reconciler labels the Agent from its inventory after the agent
	// API stored it: wait for both.
	archLabel := v1beta1.InventoryLabelPrefix + "cpu-architecture"
	a := waitAgent(t, v, ie.Namespace, "the agent registers and the host becomes known", func(a *v1beta1.Agent) bool {
		return a.Status.Inventory.ReportTime != nil && a.Status.Inventory.Virtualization != nil &&
			a.Labels[archLabel] != "" && a.Status.DebugInfo.State == "known-unbound"
	})
	inv := a.Status.Inventory
	require.Equal(t, arch, inv.CPU.Architecture)
	require.Equal(t, arch, a.Labels[archLabel])
	require.Equal(t, want.cpus, inv.CPU.Count)
	require.GreaterOrEqual(t, inv.Memory.PhysicalBytes, int64(want.memoryMB-64)<<20)
	require.LessOrEqual(t, inv.Memory.PhysicalBytes, int64(want.memoryMB+64)<<20+want.memoryOver)
	require.Equal(t, want.bootMode, inv.Boot.CurrentBootMode)
	require.Equal(t, "QEMU", inv.SystemVendor.Manufacturer, "SMBIOS")
	require.True(t, inv.SystemVendor.Virtual)
	require.Equal(t, "host-"+strings.ReplaceAll(want.mac, ":", "-"), inv.Hostname, "no hostname of its own: derived from the MAC")
	macs := map[string]bool{}
	for _, i := range inv.Interfaces {
		macs[i.MacAddress] = true
	}
	require.True(t, macs[want.mac], "interfaces %+v", inv.Interfaces)
	vda := diskNamed(t, inv, "vda")
	require.Equal(t, int64(120_000_000_000), vda.SizeBytes)
	require.True(t, vda.InstallationEligibility.Eligible, "%+v", vda.InstallationEligibility)
	want.check(t, &a)

	ctx := t.Context()
	_, err = s.Env.Kubectl(ctx, "", "-n", ie.Namespace, "patch", "agent", a.Name, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, client.ObjectKeyFromObject(&a), &a) != nil {
			return false
		}
		c := conditions.Find(a.Status.Conditions, v1beta1.RequirementsMetCondition)
		return c != nil && c.Status == "True"
	}, time.Minute, 500*time.Millisecond, "RequirementsMet after approval")

	// Installation: the reboot ends qemu (-no-reboot).
	require.NotContains(t, v.Log(), "Starting installation", "the installation did not wait for the gate")
	close(discoveredCh)
	_, err = v.WaitFor(ctx, regexp.MustCompile(`msg=Rebooting percentage=100`), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, `msg="Starting installation"`, `msg="Writing image to disk" percentage=90`)
	require.Eventually(t, v.Exited, bootTimeout, time.Second, "the VM did not reboot; serial log:\n%s", v.Tail(20))

	// First boot from the installed disk (on one vCPU: under TCG a second
	// costs more than it shows here).
	v2 := vm.Start(t, vm.Options{Name: "agent-installed", Arch: arch, Disks: []string{disk}, Boot: "c", Net: "user", MemoryMB: 1024})
	_, err = v2.WaitFor(ctx, regexp.MustCompile(hosted.WorkerMarker), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v2.Tail(40))
	requireSerialLog(t, v2, "booted from disk /dev/vda1", "ignition: found /boot/ignition/config.ign")
	require.Contains(t, ep.Seen(), hosted.WantRequest, "the pointer config's headers reached the endpoint")
}

func requireSerialLog(t *testing.T, v *vm.VM, patterns ...string) {
	t.Helper()
	log := v.Log()
	for _, p := range patterns {
		require.Contains(t, log, p, "serial log of %s", v.Name)
	}
}

// `agent sanitize`, run in the discovery OS on real block devices (a
// virtio disk and an NVMe namespace, which zero ranges themselves, and an
// ATA disk, which does not), erases them all; a second NVMe controller's
// namespace is erased by the drive's own command, Format NVM with the
// user-data erase (forced: the agent would choose Write Zeroes). The test
// then reads the disk images and finds none of the previous tenant's
// markers. It goes through what only a kernel shows: sysfs, the NVMe and
// ATA identify ioctls, the NVMe admin passthrough, the exclusive open,
// BLKZEROOUT, O_DIRECT reads.
func TestAgentSanitizeDisks(t *testing.T) {
	t.Parallel()
	marker := []byte("AGENTBOOT-PREVIOUS-TENANT-MARKER")
	const size = 256 << 20
	offsets := []int64{0, 1<<20 + 17, 100 << 20, size - 4096, size - int64(len(marker))}
	disks := make([]string, 4)
	for i := range disks {
		disks[i] = filepath.Join(t.TempDir(), fmt.Sprintf("disk%d.raw", i))
		f, err := os.Create(disks[i])
		require.NoError(t, err)
		require.NoError(t, f.Truncate(size))
		for _, off := range offsets {
			_, err := f.WriteAt(marker, off)
			require.NoError(t, err)
		}
		require.NoError(t, f.Close())
	}
	// The kernel numbers NVMe controllers in the order they finish
	// probing: each namespace is found by its controller's serial.
	script := `ns() { echo /dev/$(grep -l "$1" /sys/class/nvme/nvme*/serial | cut -d/ -f5)n1; }
/usr/local/bin/agent sanitize --disk /dev/vda --disk $(ns agentboot-nvme0) --disk /dev/sda
echo agentboot-sanitize-exit=$?
/usr/local/bin/agent sanitize --method nvme-format-user-data --disk $(ns agentboot-nvme1)
echo agentboot-format-exit=$?
reboot -f
`
	override := hosted.IgnitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/usr/local/bin/sanitize.sh", "mode": 0o755,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString([]byte(script))},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "sanitize.service", "enabled": true,
			"contents": "[Service]\nExecStart=/bin/sh /usr/local/bin/sanitize.sh\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = string(override) })
	iso := download(t, ie.Status.ISODownloadURL)
	v := vm.Start(t, vm.Options{Name: "agent-sanitize", CDROM: iso, Boot: "d", Net: "user", MemoryMB: 1024, Extra: []string{
		"-drive", "file=" + disks[0] + ",if=virtio,format=raw,discard=unmap,detect-zeroes=unmap",
		"-drive", "file=" + disks[1] + ",if=none,id=nvm0,format=raw,discard=unmap", "-device", "nvme,serial=agentboot-nvme0,drive=nvm0",
		"-drive", "file=" + disks[2] + ",if=ide,index=0,format=raw",
		"-drive", "file=" + disks[3] + ",if=none,id=nvm1,format=raw,discard=unmap", "-device", "nvme,serial=agentboot-nvme1,drive=nvm1",
	}})
	_, err := v.WaitFor(t.Context(), regexp.MustCompile(`agentboot-format-exit=\d+`), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, "agentboot-sanitize-exit=0", "agentboot-format-exit=0",
		`"disk":"/dev/vda","method":"write-zeroes"`, `"method":"write-zeroes","why":"the device zeroes blocks itself (Write Zeroes)`,
		`"disk":"/dev/sda","method":"overwrite"`, `"verification":"sampled-reads-zero"`, "(read with O_DIRECT)",
		`"method":"nvme-format-user-data","why":"nvme-format-user-data was asked for (the device would get write-zeroes)"`,
		`"verification":"sampled-reads-changed"`, "no longer reads back in any 512-byte block")
	require.Regexp(t, `"disk":"/dev/nvme\dn1","method":"write-zeroes"`, v.Log())
	require.Eventually(t, v.Exited, bootTimeout, time.Second, "the VM did not end; serial log:\n%s", v.Tail(20))
	for _, d := range disks {
		data, err := os.ReadFile(d)
		require.NoError(t, err)
		require.Len(t, data, size)
		require.NotContains(t, string(data), string(marker), "%s still holds the previous tenant's marker", d)
	}
	// qemu's format zeroes the whole namespace: the markers the agent's
	// random data did not cover are gone because the drive erased them,
	// and so is that random data.
	formatted, err := os.ReadFile(disks[3])
	require.NoError(t, err)
	require.True(t, bytes.Equal(make([]byte, size), formatted), "the formatted namespace's image is not all zeros")
}
