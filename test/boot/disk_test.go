package boot_test

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

// workerMarker is what the worker config, fetched through the pointer
// config, prints on the console.
const workerMarker = "agentboot-test: worker config applied"

// ignitionEndpoint plays a hosted cluster's Ignition endpoint (HTTPS with
// its own CA, a bearer token) and returns the pointer config HyperShift
// would put in the NodePool's user-data Secret, and what the endpoint saw.
func ignitionEndpoint(t *testing.T) (pointer []byte, seen func() []string) {
	t.Helper()
	certFile, keyFile, caPEM, err := stack.Certificates(t.TempDir(), hostFromGuest)
	require.NoError(t, err)
	const token = "bm9kZXBvb2wtdG9rZW4"
	var mu sync.Mutex
	var requests []string
	worker := ignitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/usr/local/bin/joined", "mode": 0o755,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho "+workerMarker+" > /dev/ttyS0\n"))},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "joined.service", "enabled": true,
			"contents": "[Service]\nExecStart=/usr/local/bin/joined\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get("NodePool"))
		mu.Unlock()
		if r.URL.Path != "/ignition" || r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "wrong token", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write(worker)
	})}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})) }()
	t.Cleanup(func() { srv.Close() })
	pointer = ignitionConfig(t, map[string]any{
		"ignition": map[string]any{
			"version": "3.4.0",
			"config": map[string]any{"merge": []any{map[string]any{
				"source": fmt.Sprintf("https://%s:%d/ignition", hostFromGuest, ln.Addr().(*net.TCPAddr).Port),
				"httpHeaders": []any{
					map[string]any{"name": "Authorization", "value": "Bearer " + token},
					map[string]any{"name": "NodePool", "value": "clusters/vcluster2"},
				},
			}}},
			"security": map[string]any{"tls": map[string]any{"certificateAuthorities": []any{
				map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString(caPEM)},
			}}},
		},
	})
	return pointer, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), requests...)
	}
}

const wantRequest = "/ignition Bearer bm9kZXBvb2wtdG9rZW4 clusters/vcluster2"

func devDisk(t *testing.T) string {
	t.Helper()
	iso, err := testenv.DevImage()
	require.NoError(t, err)
	return filepath.Join(filepath.Dir(iso), "agentboot-dev-metal.x86_64.raw")
}

// The dev OS's raw disk image with a pointer Ignition config where
// CoreOS's installer puts it (ignition/config.ign on the boot partition)
// boots from disk with BIOS, fetches the worker config with the token and
// applies it.
func TestInstalledDiskFetchesPointerIgnition(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(devDisk(t))
	require.NoError(t, err, "make dev-image builds the raw disk image")
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, data, 0o644))
	pointer, seen := ignitionEndpoint(t)
	ign := filepath.Join(t.TempDir(), "config.ign")
	require.NoError(t, os.WriteFile(ign, pointer, 0o644))
	if out, err := exec.Command("mcopy", "-i", disk+"@@1M", ign, "::ignition/config.ign").CombinedOutput(); err != nil {
		t.Fatalf("mcopy: %v: %s", err, out)
	}
	v := vm.Start(t, vm.Options{Name: "installed-disk", Disks: []string{disk}, Boot: "c", Net: "user", MemoryMB: 1024})
	_, err = v.WaitFor(t.Context(), regexp.MustCompile(workerMarker), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, "booted from disk /dev/vda1", "ignition: found /boot/ignition/config.ign")
	require.Contains(t, seen(), wantRequest, "the pointer config's headers reached the endpoint")
}

// `agent install`, run in the discovery OS booted from the InfraEnv ISO,
// writes the raw disk image to the VM's disk (checksum verified) with the
// pointer config on its boot partition and reboots; the VM then boots from
// that disk into the worker config.
func TestAgentInstallThenBootFromDisk(t *testing.T) {
	t.Parallel()
	image := devDisk(t)
	data, err := os.ReadFile(image)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	imgSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, image) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = imgSrv.Serve(ln) }()
	t.Cleanup(func() { imgSrv.Close() })
	pointer, seen := ignitionEndpoint(t)

	cmd := fmt.Sprintf("/usr/local/bin/agent install --disk /dev/vda --image-url http://%s:%d/disk.raw --image-sha256 %s --ignition-file /etc/agentboot-test/pointer.ign --reboot",
		hostFromGuest, ln.Addr().(*net.TCPAddr).Port, hex.EncodeToString(sum[:]))
	override := ignitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/etc/agentboot-test/pointer.ign", "mode": 0o600,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString(pointer)},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "install.service", "enabled": true,
			"contents": "[Service]\nExecStart=" + cmd + "\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = string(override) })
	iso := download(t, ie.Status.ISODownloadURL)
	disk := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(disk, nil, 0o644))
	require.NoError(t, os.Truncate(disk, 2<<30))

	// Discovery: the install runs, and the reboot ends qemu (-no-reboot).
	v := vm.Start(t, vm.Options{Name: "agent-install", CDROM: iso, Boot: "d", Net: "user", MemoryMB: 1024, Disks: []string{disk}})
	_, err = v.WaitFor(t.Context(), regexp.MustCompile(`msg=Rebooting percentage=100`), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	requireSerialLog(t, v, `msg="Starting installation"`, `msg="Writing image to disk" percentage=90`)
	require.Eventually(t, v.Exited, bootTimeout, time.Second, "the VM did not reboot; serial log:\n%s", v.Tail(20))

	// First boot from the installed disk.
	v2 := vm.Start(t, vm.Options{Name: "agent-installed", Disks: []string{disk}, Boot: "c", Net: "user", MemoryMB: 1024})
	_, err = v2.WaitFor(t.Context(), regexp.MustCompile(workerMarker), bootTimeout)
	require.NoError(t, err, "serial log:\n%s", v2.Tail(40))
	require.Contains(t, seen(), wantRequest)
}

func ignitionConfig(t *testing.T, c map[string]any) []byte {
	t.Helper()
	if _, ok := c["ignition"]; !ok {
		c["ignition"] = map[string]any{"version": "3.4.0"}
	}
	data, err := json.Marshal(c)
	require.NoError(t, err)
	return data
}

func requireSerialLog(t *testing.T, v *vm.VM, patterns ...string) {
	t.Helper()
	log := v.Log()
	for _, p := range patterns {
		require.Contains(t, log, p, "serial log of %s", v.Name)
	}
}
