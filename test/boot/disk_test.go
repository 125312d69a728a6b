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
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
	"github.com/agentboot/agentboot/test/hosted"
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

// The dev OS's raw disk image with a pointer Ignition config where
// CoreOS's installer puts it (ignition/config.ign on the boot partition)
// boots from disk with BIOS, fetches the worker config with the token and
// applies it.
func TestInstalledDiskFetchesPointerIgnition(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(devDisk(t, "x86_64"))
	require.NoError(t, err, "make dev-image builds the raw disk image")
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, data, 0o644))
	ep := ignitionEndpoint(t)
	ign := filepath.Join(t.TempDir(), "config.ign")
	require.NoError(t, os.WriteFile(ign, ep.Pointer, 0o644))
	if out, err := exec.Command("mcopy", "-i", disk+"@@1M", ign, "::ignition/config.ign").CombinedOutput(); err != nil {
		t.Fatalf("mcopy: %v: %s", err, out)
	}
	v := vm.Start(t, vm.Options{Name: "installed-disk", Disks: []string{disk}, Boot: "c", Net: "user", MemoryMB: 1024})
	_, err = v.WaitFor(t.Context(), regexp.MustCompile(hosted.WorkerMarker), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, "booted from disk /dev/vda1", "ignition: found /boot/ignition/config.ign")
	require.Contains(t, ep.Seen(), hosted.WantRequest, "the pointer config's headers reached the endpoint")
}

// `agent install`, run in the discovery OS booted from the InfraEnv ISO,
// writes the raw disk image to the VM's disk (checksum verified) with the
// pointer config on its boot partition and reboots; the VM then boots from
// that disk into the worker config: a PC with BIOS, and an aarch64 server
// with UEFI, whose firmware finds the installed EFI system partition.
func TestAgentInstallThenBootFromDisk(t *testing.T) {
	t.Parallel()
	for _, arch := range []string{"x86_64", "aarch64"} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			agentInstallThenBootFromDisk(t, arch)
		})
	}
}

func agentInstallThenBootFromDisk(t *testing.T, arch string) {
	image := devDisk(t, arch)
	data, err := os.ReadFile(image)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	imgSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, image) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = imgSrv.Serve(ln) }()
	t.Cleanup(func() { imgSrv.Close() })
	ep := ignitionEndpoint(t)

	cmd := fmt.Sprintf("/usr/local/bin/agent install --disk /dev/vda --image-url http://%s:%d/disk.raw --image-sha256 %s --ignition-file /etc/agentboot-test/pointer.ign --reboot",
		hostFromGuest, ln.Addr().(*net.TCPAddr).Port, hex.EncodeToString(sum[:]))
	override := hosted.IgnitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/etc/agentboot-test/pointer.ign", "mode": 0o600,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString(ep.Pointer)},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "install.service", "enabled": true,
			"contents": "[Service]\nExecStart=" + cmd + "\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.IgnitionConfigOverride = string(override)
		ie.Spec.CPUArchitecture = arch
	})
	iso := download(t, ie.Status.ISODownloadURL)
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, nil, 0o644))
	require.NoError(t, os.Truncate(disk, 2<<30))

	// Discovery: the install runs, and the reboot ends qemu (-no-reboot).
	v := vm.Start(t, vm.Options{Name: "agent-install", Arch: arch, CDROM: iso, Boot: "d", Net: "user", MemoryMB: 1024, Disks: []string{disk}})
	_, err = v.WaitFor(t.Context(), regexp.MustCompile(`msg=Rebooting percentage=100`), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, `msg="Starting installation"`, `msg="Writing image to disk" percentage=90`)
	require.Eventually(t, v.Exited, bootTimeout, time.Second, "the VM did not reboot; serial log:\n%s", v.Tail(20))

	// First boot from the installed disk.
	v2 := vm.Start(t, vm.Options{Name: "agent-installed", Arch: arch, Disks: []string{disk}, Boot: "c", Net: "user", MemoryMB: 1024})
	_, err = v2.WaitFor(t.Context(), regexp.MustCompile(hosted.WorkerMarker), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v2.Tail(40))
	require.Contains(t, ep.Seen(), hosted.WantRequest)
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
