// Package boot_test boots what the image service serves in real virtual
// machines (qemu, TCG when KVM is unusable) on qemu's user-mode network, so it
// needs no root: the ISO from a CD with BIOS, the minimal ISO with UEFI, and
// network boot through qemu's own iPXE firmware. The dev OS image's init
// reports on the serial console what it found and did.
package boot_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// qemu's user network reaches the host's loopback at 10.0.2.2.
const hostFromGuest = "10.0.2.2"

var s *stack.Stack

func TestMain(m *testing.M) {
	var stop func()
	var err error
	s, stop, err = stack.StartMain(stack.Options{AdvertiseHost: hostFromGuest})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// bootTimeout is generous: a loaded two-core machine under TCG is slow.
const bootTimeout = 6 * time.Minute

func infraEnv(t *testing.T, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	t.Helper()
	ie := stack.NewInfraEnv(s.Namespace(t, "boot"), "env")
	if change != nil {
		change(ie)
	}
	require.NoError(t, s.Client.Create(context.Background(), ie))
	return s.WaitImage(t, client.ObjectKeyFromObject(ie))
}

func download(t *testing.T, url string) string {
	t.Helper()
	resp, err := s.HTTP.Get(s.Local(url))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := filepath.Join(t.TempDir(), "discovery.iso")
	f, err := os.Create(p)
	require.NoError(t, err)
	_, err = io.Copy(f, resp.Body)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return p
}

// expect waits for each line in order of appearance.
func expect(t *testing.T, v *vm.VM, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		_, err := v.WaitFor(context.Background(), regexp.MustCompile(p), bootTimeout)
		require.NoError(t, err)
	}
}

// appliedDiscoveryIgnition are the lines of a host that found and applied its
// discovery Ignition and started the agent fetched from the image service.
func appliedDiscoveryIgnition() []string {
	return []string{
		`devinit: ignition: found /config.ign`,
		regexp.QuoteMeta(fmt.Sprintf("devinit: ignition: wrote /usr/local/bin/agent (")) + `\d+ bytes, from ` + regexp.QuoteMeta(s.Settings.AgentBinaryURL()) + `, sha512 verified\)`,
		`devinit: ignition: user core: 1 SSH keys`,
		`devinit: starting agent.service: /usr/local/bin/agent run --config /etc/agentboot/agent.json`,
	}
}

func TestISOBootsWithBIOS(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	iso := download(t, ie.Status.ISODownloadURL)
	v := vm.Start(t, vm.Options{Name: "iso-bios", CDROM: iso, Boot: "d", Net: "user"})
	expect(t, v, append([]string{`devinit: booted from ISO agentboot-dev-\S+ on /dev/sr0`}, appliedDiscoveryIgnition()...)...)
}

func TestMinimalISOBootsWithUEFI(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Spec.ImageType = v1beta1.ImageTypeMinimalISO })
	iso := download(t, ie.Status.ISODownloadURL)
	v := vm.Start(t, vm.Options{Name: "minimal-uefi", CDROM: iso, Boot: "d", Net: "user", UEFI: true})
	expect(t, v, append([]string{`devinit: fetched root filesystem from ` + regexp.QuoteMeta(ie.Status.BootArtifacts.RootfsURL) + ` \(\d+ bytes, sha256 verified\)`}, appliedDiscoveryIgnition()...)...)
}

// qemu's DHCP hands iPXE the script URL as its boot file: the firmware's iPXE
// fetches the script, kernel and initrd; the kernel unpacks the served initrd
// (base plus the appended config archive) and the OS fetches the rootfs.
func TestNetworkBootWithIPXE(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	// qemu's DHCP takes boot file names of up to 127 bytes: a TFTP-served
	// script chains the InfraEnv's longer URL, as a site's PXE server would.
	tftp := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(tftp, "boot.ipxe"), []byte("#!ipxe\nchain "+ie.Status.BootArtifacts.IpxeScriptURL+"\n"), 0o644))
	v := vm.Start(t, vm.Options{Name: "ipxe", Boot: "n", Net: "user,tftp=" + tftp + ",bootfile=boot.ipxe", MAC: "52:54:00:12:34:56"})
	expect(t, v, append([]string{`devinit: fetched root filesystem from ` + regexp.QuoteMeta(ie.Status.BootArtifacts.RootfsURL)}, appliedDiscoveryIgnition()...)...)
	cmdline, err := v.WaitFor(context.Background(), regexp.MustCompile(`Kernel command line:`), time.Second)
	require.NoError(t, err)
	require.Contains(t, cmdline, "BOOTIF=01-52-54-00-12-34-56", "iPXE expanded the booting MAC")
}
