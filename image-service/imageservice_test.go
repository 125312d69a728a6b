package imageservice_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/iso9660"
	"github.com/agentboot/agentboot/internal/liveiso"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

type response struct {
	code   int
	header http.Header
	body   []byte
}

func get(t *testing.T, s *stack.Stack, u string, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.Local(u), nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.HTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp.StatusCode, resp.Header, body}
}

func setup(t *testing.T, s *stack.Stack, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	t.Helper()
	ns := s.Namespace(t, "images")
	ie := stack.NewInfraEnv(ns, "hardware-inventory")
	if change != nil {
		change(ie)
	}
	require.NoError(t, s.Client.Create(context.Background(), ie))
	return s.WaitImage(t, client.ObjectKeyFromObject(ie))
}

func extract(t *testing.T, iso []byte, paths ...string) string {
	t.Helper()
	dir := t.TempDir()
	f := filepath.Join(dir, "x.iso")
	require.NoError(t, os.WriteFile(f, iso, 0o644))
	for _, p := range paths {
		out, err := exec.Command("xorriso", "-osirrox", "on", "-indev", f, "-extract", "/"+p, filepath.Join(dir, filepath.Base(p))).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	return dir
}

// unpackArchive decompresses an xz/gzip cpio with the real tools.
func unpackArchive(t *testing.T, archive []byte) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "xz -dc 2>/dev/null || { echo xz failed >&2; exit 1; }")
	cmd.Stdin = bytes.NewReader(archive)
	raw, err := cmd.Output()
	require.NoError(t, err)
	cp := exec.Command("cpio", "-idu", "--quiet")
	cp.Dir = dir
	cp.Stdin = bytes.NewReader(raw)
	out, err := cp.CombinedOutput()
	require.NoError(t, err, string(out))
	return dir
}

// Its stacks take turns on one control plane.
func TestMain(m *testing.M) { stack.Main(m) }

func TestServedISOCarriesIgnitionAndKargs(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := setup(t, s, func(ie *v1beta1.InfraEnv) {
		ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Operation: "append", Value: "agentboot.test=iso"}}
	})
	iso := get(t, s, ie.Status.ISODownloadURL, nil)
	require.Equal(t, http.StatusOK, iso.code, string(iso.body))
	require.Equal(t, "application/x-iso9660-image", iso.header.Get("Content-Type"))
	require.Contains(t, iso.header.Get("Content-Disposition"), "hardware-inventory-discovery.iso")
	require.NotEmpty(t, iso.header.Get("ETag"))
	require.NotEmpty(t, iso.header.Get("Last-Modified"))

	ign := get(t, s, ie.Status.BootArtifacts.DiscoveryIgnitionURL, nil)
	require.Equal(t, http.StatusOK, ign.code)

	// xorriso, xz and cpio read the embedded config back.
	dir := extract(t, iso.body, "images/ignition.img", "isolinux/isolinux.cfg", "EFI/agentboot/grub.cfg")
	area, err := os.ReadFile(filepath.Join(dir, "ignition.img"))
	require.NoError(t, err)
	cfg, err := os.ReadFile(filepath.Join(unpackArchive(t, area), "config.ign"))
	require.NoError(t, err)
	require.Equal(t, ign.body, cfg)
	for _, f := range []string{"isolinux.cfg", "grub.cfg"} {
		text, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		require.Contains(t, string(text), "ignition.platform.id=metal agentboot.test=iso\n")
	}

	// The ISO a BMC is told to insert for one BareMetalHost carries its
	// boot proof, in the same content version.
	proof := strings.Repeat("N", 22) + ".1795810000." + strings.Repeat("P", 43)
	proved := get(t, s, ie.Status.ISODownloadURL+"&bmh=worker-7&proof="+proof, nil)
	require.Equal(t, http.StatusOK, proved.code, string(proved.body))
	require.NotEqual(t, iso.header.Get("ETag"), proved.header.Get("ETag"))
	dir = extract(t, proved.body, "images/ignition.img")
	area, err = os.ReadFile(filepath.Join(dir, "ignition.img"))
	require.NoError(t, err)
	cfg, err = os.ReadFile(filepath.Join(unpackArchive(t, area), "config.ign"))
	require.NoError(t, err)
	require.Contains(t, string(cfg), `"path":"`+agentwire.BootProofPath+`"`)
	want := base64.StdEncoding.EncodeToString([]byte(`{"bareMetalHost":"worker-7","proof":"` + proof + `"}`))
	require.Contains(t, string(cfg), want)
	for q, code := range map[string]int{
		"&bmh=Not_A_Name&proof=" + proof:                 http.StatusBadRequest,
		"&bmh=worker-7&proof=a%20b":                      http.StatusBadRequest,
		"&bmh=worker-7&proof=" + strings.Repeat("P", 43): http.StatusBadRequest,
		"&bmh=worker-7":                                  http.StatusBadRequest,
	} {
		require.Equal(t, code, get(t, s, ie.Status.ISODownloadURL+q, nil).code, q)
	}
	require.Equal(t, http.StatusBadRequest, get(t, s, ie.Status.BootArtifacts.DiscoveryIgnitionURL+"&bmh=worker-7&proof="+proof, nil).code, "ISOs only")

	// The base images in the cache are untouched: no per-host copy, only
	// each image's full and minimal ISO, still pristine live ISOs.
	entries, err := filepath.Glob(filepath.Join(s.ImageCache, "images", "*", "*.iso"))
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, p := range entries {
		if strings.HasPrefix(filepath.Base(p), ".") {
			continue // a catalog's minimal ISO being written (the cache is shared)
		}
		require.Contains(t, []string{"live.iso", "minimal.iso"}, filepath.Base(p), "the full and minimal base ISOs, nothing else")
		f, err := os.Open(p)
		require.NoError(t, err)
		st, _ := f.Stat()
		l, err := liveiso.Inspect(f, st.Size())
		require.NoError(t, err, "%s: still a live ISO", p)
		area := make([]byte, l.Ignition.Length)
		_, err = f.ReadAt(area, l.Ignition.Offset)
		f.Close()
		require.NoError(t, err)
		require.Equal(t, make([]byte, len(area)), area, "%s: its Ignition area is still empty", p)
	}
}

func TestResumedDownloadMatches(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := setup(t, s, nil)
	// The boot path counts a download once, when its last byte is sent.
	isoHops := func() float64 {
		n, _ := stack.Metric(t, "agentboot_boot_path_total", map[string]string{"hop": bootpath.ISO})
		return n
	}
	before := isoHops()
	whole := get(t, s, ie.Status.ISODownloadURL, nil)
	require.Equal(t, http.StatusOK, whole.code)
	require.Equal(t, before+1, isoHops())
	half := len(whole.body) / 2
	first := get(t, s, ie.Status.ISODownloadURL, map[string]string{"Range": fmt.Sprintf("bytes=0-%d", half-1)})
	require.Equal(t, http.StatusPartialContent, first.code)
	require.Equal(t, before+1, isoHops(), "half a download is no hop")
	etag := first.header.Get("ETag")
	rest := get(t, s, ie.Status.ISODownloadURL, map[string]string{"Range": fmt.Sprintf("bytes=%d-", half), "If-Range": etag})
	require.Equal(t, http.StatusPartialContent, rest.code)
	require.Equal(t, before+2, isoHops(), "the resumed download, once finished")
	a := sha256.Sum256(whole.body)
	b := sha256.Sum256(append(first.body, rest.body...))
	require.Equal(t, hex.EncodeToString(a[:]), hex.EncodeToString(b[:]))
	require.Equal(t, fmt.Sprint(len(whole.body)), whole.header.Get("Content-Length"))

	// HEAD answers the length without the body.
	req, _ := http.NewRequest(http.MethodHead, s.Local(ie.Status.ISODownloadURL), nil)
	resp, err := s.HTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int64(len(whole.body)), resp.ContentLength)
}

func TestPXEArtifacts(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := setup(t, s, nil)
	b := ie.Status.BootArtifacts
	for _, u := range []string{b.IpxeScriptURL, b.KernelURL, b.InitrdURL, b.RootfsURL} {
		require.True(t, strings.HasPrefix(u, "http://"), "stock iPXE fetches %s over plain HTTP", u)
	}
	hops := func() map[string]float64 {
		out := map[string]float64{}
		for _, h := range []string{bootpath.Kernel, bootpath.Initrd, bootpath.RootFS} {
			out[h], _ = stack.Metric(t, "agentboot_boot_path_total", map[string]string{"hop": h})
		}
		return out
	}
	before := hops()
	script := get(t, s, b.IpxeScriptURL, nil)
	require.Equal(t, http.StatusOK, script.code)
	require.Equal(t, fmt.Sprintf("#!ipxe\ninitrd --name initrd %s\n", b.InitrdURL), strings.SplitAfterN(string(script.body), "\n", 3)[0]+strings.SplitAfterN(string(script.body), "\n", 3)[1])
	require.Contains(t, string(script.body), "kernel "+b.KernelURL+" initrd=initrd coreos.live.rootfs_url="+b.RootfsURL+" ")

	iso, err := testenv.DevImage()
	require.NoError(t, err)
	isoBytes, err := os.ReadFile(iso)
	require.NoError(t, err)
	f, _ := os.Open(iso)
	defer f.Close()
	l, err := liveiso.Inspect(f, int64(len(isoBytes)))
	require.NoError(t, err)

	kernel := get(t, s, b.KernelURL, nil)
	require.Equal(t, http.StatusOK, kernel.code)
	require.Equal(t, isoBytes[l.Kernel.Offset:l.Kernel.Offset+l.Kernel.Length], kernel.body)
	rootfs := get(t, s, b.RootfsURL, nil)
	require.Equal(t, isoBytes[l.Rootfs.Offset:l.Rootfs.Offset+l.Rootfs.Length], rootfs.body)

	initrd := get(t, s, b.InitrdURL, nil)
	require.Equal(t, http.StatusOK, initrd.code)
	base := isoBytes[l.Initrd.Offset : l.Initrd.Offset+l.Initrd.Length]
	require.True(t, bytes.HasPrefix(initrd.body, base), "the base initrd comes first, unchanged")
	require.Zero(t, len(initrd.body)%4)
	appended := initrd.body[(len(base)+3)/4*4:]
	ign := get(t, s, b.DiscoveryIgnitionURL, nil)
	cfg, err := os.ReadFile(filepath.Join(unpackArchive(t, bytes.TrimRight(appended, "\x00")), "config.ign"))
	require.NoError(t, err)
	require.Equal(t, ign.body, cfg)
	after := hops()
	for h, n := range before {
		require.Equal(t, n+1, after[h], "hop %s counted once", h)
	}
}

func TestDiskImage(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := setup(t, s, nil)
	iso, err := testenv.DevImage()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(iso), "agentboot-dev-metal.x86_64.raw"))
	require.NoError(t, err)
	// The kernel's URL names the image's architecture and version.
	u, err := url.Parse(ie.Status.BootArtifacts.KernelURL)
	require.NoError(t, err)
	parts := strings.Split(u.Path, "/")
	k := osimage.Key{Arch: parts[2], Version: parts[3]}
	diskURL := discovery.DiskImageURL(s.Settings, k)
	require.True(t, strings.HasPrefix(diskURL, "https://"), diskURL)
	var disk response
	require.Eventually(t, func() bool { disk = get(t, s, diskURL, nil); return disk.code != http.StatusServiceUnavailable }, time.Minute, 100*time.Millisecond)
	require.Equal(t, http.StatusOK, disk.code, string(disk.body))
	require.True(t, bytes.Equal(raw, disk.body), "the disk image is served unchanged")
	part := get(t, s, diskURL, map[string]string{"Range": "bytes=510-511"})
	require.Equal(t, http.StatusPartialContent, part.code)
	require.Equal(t, []byte{0x55, 0xaa}, part.body)

	missing := get(t, s, discovery.DiskImageURL(s.Settings, osimage.Key{Arch: k.Arch, Version: "0.0"}), nil)
	require.Equal(t, http.StatusBadRequest, missing.code)
	require.Contains(t, string(missing.body), "available: "+k.Version)
}

func tokenOf(t *testing.T, u string) string {
	p, err := url.Parse(u)
	require.NoError(t, err)
	return p.Query().Get("token")
}

func withToken(u, token string) string {
	p, _ := url.Parse(u)
	q := p.Query()
	q.Set("token", token)
	p.RawQuery = q.Encode()
	return p.String()
}

func TestTokensAndBadRequests(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	a := setup(t, s, nil)
	b := setup(t, s, nil)
	isoA := a.Status.ISODownloadURL
	tok := tokenOf(t, isoA)
	flip := []byte(tok)
	flip[3] ^= 1

	cases := map[string]struct {
		url  string
		code int
	}{
		"valid":                  {isoA, http.StatusOK},
		"missing token":          {strings.Split(isoA, "?")[0], http.StatusUnauthorized},
		"token of another":       {withToken(isoA, tokenOf(t, b.Status.ISODownloadURL)), http.StatusUnauthorized},
		"tampered token":         {withToken(isoA, string(flip)), http.StatusUnauthorized},
		"garbage token":          {withToken(isoA, "%%%"), http.StatusUnauthorized},
		"unknown InfraEnv":       {strings.Replace(isoA, string(a.UID), "00000000-0000-4000-8000-000000000000", 1), http.StatusUnauthorized},
		"malformed UID":          {strings.Replace(isoA, string(a.UID), "not-a-uid", 1), http.StatusBadRequest},
		"malformed version":      {strings.Replace(isoA, "/discovery.iso", "/../x/discovery.iso", 1), http.StatusBadRequest},
		"unknown file":           {strings.Replace(isoA, "discovery.iso", "passwd", 1), http.StatusNotFound},
		"repeated token":         {isoA + "&token=" + tok, http.StatusBadRequest},
		"unexpected parameter":   {isoA + "&arch=x86_64", http.StatusBadRequest},
		"ignition over HTTP":     {strings.Replace(strings.Replace(a.Status.BootArtifacts.DiscoveryIgnitionURL, "https://", "http://", 1), strings.Split(s.Settings.ImageServiceURL, "//")[1], strings.Split(s.Settings.ImageServiceHTTPURL, "//")[1], 1), http.StatusNotFound},
		"ISO over HTTP":          {strings.Replace(strings.Replace(isoA, "https://", "http://", 1), strings.Split(s.Settings.ImageServiceURL, "//")[1], strings.Split(s.Settings.ImageServiceHTTPURL, "//")[1], 1), http.StatusNotFound},
		"unsupported arch":       {s.Settings.ImageServiceHTTPURL + "/boot-artifacts/sparc/1/vmlinuz", http.StatusBadRequest},
		"unsupported version":    {s.Settings.ImageServiceHTTPURL + "/boot-artifacts/x86_64/9.9/vmlinuz", http.StatusBadRequest},
		"bad artifact parameter": {a.Status.BootArtifacts.KernelURL + "?x=1", http.StatusBadRequest},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := get(t, s, tc.url, nil)
			require.Equal(t, tc.code, r.code, string(r.body))
			if tc.code == http.StatusUnauthorized {
				require.Equal(t, "unauthorized\n", string(r.body), "no detail")
			}
		})
	}
	r := get(t, s, s.Settings.ImageServiceHTTPURL+"/boot-artifacts/x86_64/9.9/vmlinuz", nil)
	require.Contains(t, string(r.body), "available: dev-", "lists what exists")

	// A content change makes old URLs stale.
	var cur v1beta1.InfraEnv
	require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(a), &cur))
	cur.Spec.SSHAuthorizedKey = "ssh-ed25519 AAAAnother other@host"
	require.NoError(t, s.Client.Update(ctx, &cur))
	changed := s.WaitCondition(t, client.ObjectKeyFromObject(a), corev1.ConditionTrue, func(ie *v1beta1.InfraEnv) bool { return ie.Status.ISODownloadURL != isoA })
	require.Equal(t, http.StatusUnauthorized, get(t, s, isoA, nil).code, "stale")
	require.Equal(t, http.StatusOK, get(t, s, changed.Status.BootArtifacts.IpxeScriptURL, nil).code)
	require.True(t, changed.Status.CreatedTime.After(a.Status.CreatedTime.Time) || changed.Status.CreatedTime.Equal(a.Status.CreatedTime))

	// Deleting and recreating under the same name invalidates the old URLs.
	oldB := b.Status.ISODownloadURL
	require.NoError(t, s.Client.Delete(ctx, b))
	require.Eventually(t, func() bool { return get(t, s, oldB, nil).code == http.StatusNotFound }, 30*time.Second, 100*time.Millisecond)
	again := stack.NewInfraEnv(b.Namespace, b.Name)
	require.NoError(t, s.Client.Create(ctx, again))
	recreated := s.WaitImage(t, client.ObjectKeyFromObject(again))
	require.NotEqual(t, oldB, recreated.Status.ISODownloadURL)
	forged := strings.Replace(oldB, string(b.UID), string(recreated.UID), 1)
	require.Equal(t, http.StatusUnauthorized, get(t, s, forged, nil).code, "the old token does not work for the new UID")
}

func TestTooBigIgnitionIs422(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ie := setup(t, s, nil)
	iso := ie.Status.ISODownloadURL
	// Random bytes do not compress: 300 KiB cannot fit 256 KiB.
	random := make([]byte, 300<<10)
	_, _ = rand.Read(random)
	var cur v1beta1.InfraEnv
	require.NoError(t, s.Client.Get(context.Background(), client.ObjectKeyFromObject(ie), &cur))
	cur.Spec.IgnitionConfigOverride = bigOverride(random)
	require.NoError(t, s.Client.Update(context.Background(), &cur))
	failed := s.WaitCondition(t, client.ObjectKeyFromObject(ie), corev1.ConditionFalse, nil)
	require.Contains(t, stack.Message(failed), "ignitionConfigOverride")
	require.Contains(t, stack.Message(failed), "embed area holds 256 KiB")
	require.Empty(t, failed.Status.ISODownloadURL, "no URL for an image that cannot be built")

	// A URL for the new content version still gets 422 from the service.
	r := get(t, s, iso, nil)
	require.Equal(t, http.StatusUnprocessableEntity, r.code, string(r.body))
	require.Contains(t, string(r.body), "embed area")
}

func bigOverride(data []byte) string {
	return `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/big","contents":{"source":"data:;base64,` +
		base64.StdEncoding.EncodeToString(data) + `"}}]}}`
}

func TestConcurrencyLimit(t *testing.T) {
	s := stack.Start(t, stack.Options{MaxConcurrentDownloads: 1})
	ie := setup(t, s, nil)
	req, _ := http.NewRequest(http.MethodGet, s.Local(ie.Status.ISODownloadURL), nil)
	resp, err := s.HTTP.Do(req)
	require.NoError(t, err)
	// Hold the first download open without reading it to the end.
	_, err = io.ReadFull(resp.Body, make([]byte, 4096))
	require.NoError(t, err)
	second := get(t, s, ie.Status.ISODownloadURL, nil)
	require.Equal(t, http.StatusServiceUnavailable, second.code)
	// Its turn: the one slot frees up in about a second (the time a
	// download is assumed to hold one until one has been measured).
	require.Equal(t, "1", second.header.Get("Retry-After"))
	// Those refused after it get the turns after its: a storm comes back
	// spread at the rate the slot serves, not all at once 30 s later.
	require.Equal(t, "2", get(t, s, ie.Status.ISODownloadURL, nil).header.Get("Retry-After"))
	require.Equal(t, "3", get(t, s, ie.Status.ISODownloadURL, nil).header.Get("Retry-After"))
	// Small files are not limited.
	require.Equal(t, http.StatusOK, get(t, s, ie.Status.BootArtifacts.IpxeScriptURL, nil).code)
	resp.Body.Close()
	require.Eventually(t, func() bool { return get(t, s, ie.Status.ISODownloadURL, nil).code == http.StatusOK }, 10*time.Second, 50*time.Millisecond)
}

// Download slots a slow client cannot keep: one client address has at
// most --max-downloads-per-client of them, one InfraEnv's content at most
// --max-downloads-per-infraenv (another InfraEnv's hosts still download),
// a client that stops reading loses its slot after
// --download-stall-timeout, and the OS images' own files (kernels, root
// filesystems) have slots of their own.
func TestDownloadSlotsAgainstSlowClients(t *testing.T) {
	s := stack.Start(t, stack.Options{MaxConcurrentDownloads: 3, MaxDownloadsPerInfraEnv: 2, MaxDownloadsPerClient: 1, DownloadStallTimeout: 2 * time.Second, ISOOverHTTP: true})
	ie := setup(t, s, nil)
	other := setup(t, s, nil)
	otherISO := s.Local(other.Status.ISODownloadURL)
	iso, err := url.Parse(s.Local(ie.Status.ISODownloadURL))
	require.NoError(t, err)
	// stalled asks for the ISO from source address from and never reads
	// (a small receive window, as curl --limit-rate 1 leaves).
	stalled := func(from string, iso *url.URL) (status string, conn net.Conn) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}
		conn, err := d.Dial("tcp", iso.Host)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", iso.RequestURI(), iso.Host)
		require.NoError(t, err)
		line, err := bufio.NewReaderSize(conn, 64).ReadString('\n')
		require.NoError(t, err)
		return strings.TrimSpace(line), conn
	}
	client := func(from string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	fetch := func(from, u string) (int, string) {
		t.Helper()
		resp, err := client(from).Get(u)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}

	status, _ := stalled("127.0.0.2", iso)
	require.Equal(t, "HTTP/1.1 200 OK", status)
	code, body := fetch("127.0.0.2", iso.String())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "this client (127.0.0.2) already has 1 downloads in progress")
	status, _ = stalled("127.0.0.3", iso)
	require.Equal(t, "HTTP/1.1 200 OK", status)
	code, body = fetch("127.0.0.4", iso.String())
	require.Equal(t, http.StatusServiceUnavailable, code, "the InfraEnv's two slots are held")
	require.Contains(t, body, "this InfraEnv's content already has 2 downloads in progress")
	u, err := url.Parse(otherISO)
	require.NoError(t, err)
	status, _ = stalled("127.0.0.4", u)
	require.Equal(t, "HTTP/1.1 200 OK", status, "another InfraEnv's hosts still download")
	code, body = fetch("127.0.0.5", otherISO)
	require.Equal(t, http.StatusServiceUnavailable, code, "all three slots are held")
	require.Contains(t, body, "too many downloads in progress")
	code, _ = fetch("127.0.0.5", s.Local(ie.Status.BootArtifacts.KernelURL))
	require.Equal(t, http.StatusOK, code, "kernels do not wait for ISO slots")

	// The stalled clients lose their slots: a reading client gets one.
	start := time.Now()
	require.Eventually(t, func() bool {
		code, _ := fetch("127.0.0.5", iso.String())
		return code == http.StatusOK
	}, 60*time.Second, 500*time.Millisecond)
	t.Logf("stalled downloads gave their slots back after %s", time.Since(start).Round(100*time.Millisecond))
}

func TestISOOverHTTPAndMinimal(t *testing.T) {
	s := stack.Start(t, stack.Options{ISOOverHTTP: true})
	ie := setup(t, s, func(ie *v1beta1.InfraEnv) { ie.Spec.ImageType = v1beta1.ImageTypeMinimalISO })
	require.True(t, strings.HasPrefix(ie.Status.ISODownloadURL, "http://"))
	iso := get(t, s, ie.Status.ISODownloadURL, nil)
	require.Equal(t, http.StatusOK, iso.code, string(iso.body))
	dir := t.TempDir()
	p := filepath.Join(dir, "m.iso")
	require.NoError(t, os.WriteFile(p, iso.body, 0o644))
	fs, err := iso9660.Open(bytes.NewReader(iso.body))
	require.NoError(t, err)
	_, err = fs.Stat(liveiso.RootfsPath)
	require.ErrorIs(t, err, iso9660.ErrNotExist, "no root filesystem in a minimal ISO")
	cfgDir := extract(t, iso.body, "isolinux/isolinux.cfg")
	text, _ := os.ReadFile(filepath.Join(cfgDir, "isolinux.cfg"))
	require.Contains(t, string(text), "coreos.live.rootfs_url="+ie.Status.BootArtifacts.RootfsURL)
	require.NotContains(t, string(text), "coreos.liveiso=")
}

func TestBootOrderControl(t *testing.T) {
	diskBoot := testenv.NewPasses()
	s := stack.Start(t, stack.Options{DiskBootPasses: diskBoot.Observe})
	ctx := context.Background()
	ie := setup(t, s, func(ie *v1beta1.InfraEnv) { ie.Spec.IPXEScriptType = v1beta1.BootOrderControl })
	script := get(t, s, ie.Status.BootArtifacts.IpxeScriptURL, nil)
	require.Equal(t, "#!ipxe\nchain "+ie.Status.BootArtifacts.IpxeScriptURL+"&mac=${net0/mac}\n", string(script.body))

	mac := "52:54:00:12:34:56"
	withMAC := ie.Status.BootArtifacts.IpxeScriptURL + "&mac=" + url.QueryEscape(mac)
	boot := get(t, s, withMAC, nil)
	require.Contains(t, string(boot.body), "initrd --name initrd", "unknown host: discovery")

	agent := &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "d9a4d1e0-0000-4000-8000-000000000001", Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
		Spec:       v1beta1.AgentSpec{Role: v1beta1.AgentRoleWorker, Approved: true, ClusterDeploymentName: &v1beta1.ClusterReference{Name: "c1", Namespace: "clusters-c1"}},
	}
	require.NoError(t, s.Client.Create(ctx, agent))
	// Merge patches: the Agent controller writes the same status.
	setStatus := func(change func(*v1beta1.Agent)) {
		patch := client.MergeFrom(agent.DeepCopy())
		change(agent)
		require.NoError(t, s.Client.Status().Patch(ctx, agent, patch))
	}
	setStatus(func(a *v1beta1.Agent) {
		a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{Name: "eth0", MacAddress: strings.ToUpper(mac), IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{}}}
		a.Status.Progress.CurrentStage = v1beta1.StageInstalling
		// As the agent API records a registration: the InfraEnv the
		// host registered through is what counts, not the label.
		a.Status.Registration = &v1beta1.AgentRegistration{InfraEnv: ie.Name, InfraEnvUID: string(ie.UID)}
	})
	diskBoot.Settle(t, client.ObjectKeyFromObject(agent))
	require.Contains(t, string(get(t, s, withMAC, nil).body), "initrd --name initrd", "still installing")
	setStatus(func(a *v1beta1.Agent) { a.Status.Progress.CurrentStage = v1beta1.StageRebooting })
	require.Eventually(t, func() bool { return strings.Contains(string(get(t, s, withMAC, nil).body), "\nexit\n") }, 10*time.Second, 100*time.Millisecond,
		"an installed host boots from disk")
	require.Equal(t, http.StatusBadRequest, get(t, s, ie.Status.BootArtifacts.IpxeScriptURL+"&mac=zz", nil).code)
}

func TestAgentBinary(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	url, err := s.Settings.AgentBinaryURL("x86_64")
	require.NoError(t, err)
	r := get(t, s, url, nil)
	require.Equal(t, http.StatusOK, r.code)
	want, err := os.ReadFile(s.AgentBin)
	require.NoError(t, err)
	require.Equal(t, want, r.body)
	require.Equal(t, http.StatusNotFound, get(t, s, s.Settings.ImageServiceURL+"/agent/"+strings.Repeat("0", 64), nil).code)
}

// Each InfraEnv's Ignition names the agent of its architecture, and the
// image service serves exactly that binary, with the kernel of the dev OS
// image built for it (the dev stream lists both architectures).
func TestArchitectures(t *testing.T) {
	s := stack.Start(t, stack.Options{AgentArm64: true})
	envs := map[string]*v1beta1.InfraEnv{}
	for arch, machine := range map[string]elf.Machine{"x86_64": elf.EM_X86_64, "aarch64": elf.EM_AARCH64} {
		ie := s.CreateInfraEnv(t, "arch", strings.ReplaceAll(arch, "_", "-"), func(ie *v1beta1.InfraEnv) { ie.Spec.CPUArchitecture = arch })
		envs[arch] = ie
		var ign struct {
			Storage struct {
				Files []struct {
					Path     string
					Contents struct{ Source string }
				}
			}
		}
		require.NoError(t, json.Unmarshal(get(t, s, ie.Status.BootArtifacts.DiscoveryIgnitionURL, nil).body, &ign))
		var source string
		for _, f := range ign.Storage.Files {
			if f.Path == "/usr/local/bin/agent" {
				source = f.Contents.Source
			}
		}
		want, err := s.Settings.AgentBinaryURL(arch)
		require.NoError(t, err)
		require.Equal(t, want, source, arch)
		r := get(t, s, source, nil)
		require.Equal(t, http.StatusOK, r.code)
		f, err := elf.NewFile(bytes.NewReader(r.body))
		require.NoError(t, err)
		require.Equal(t, machine, f.Machine, "an %s InfraEnv's hosts got an agent for %s", arch, f.Machine)

		kernel := get(t, s, ie.Status.BootArtifacts.KernelURL, nil)
		require.Equal(t, http.StatusOK, kernel.code)
		require.Equal(t, arch, kernelArch(kernel.body), "the kernel an %s InfraEnv publishes", arch)
	}
	t.Run("grub", func(t *testing.T) { testGRUBBootScript(t, s, envs) })
}

// testGRUBBootScript walks /boot.grub?mac=&arch=, what agentboot's netboot
// GRUB asks the PXE service for: the discovery boot of the host's InfraEnv
// with files named relative to the image service, and refusals when the
// host's architecture is not the InfraEnv's.
func testGRUBBootScript(t *testing.T, s *stack.Stack, envs map[string]*v1beta1.InfraEnv) {
	ctx := context.Background()
	grub := func(query string) response {
		t.Helper()
		return get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.grub?"+query, nil)
	}
	for _, bad := range []string{"", "mac=52:54:00:00:00:01", "arch=arm64", "mac=52:54:00:00:00:01&arch=", "mac=52:54:00:00:00:01&arch=arm64&arch=x86_64",
		"mac=52:54:00:00:00:01&arch=arm64&x=1", "mac=zz&arch=arm64"} {
		r := grub(bad)
		require.Equal(t, http.StatusBadRequest, r.code, bad)
	}
	bmc := metal3.BMCDetails{Address: "ipmi://198.18.0.9", CredentialsName: "bmc-secret"}
	for arch, mac := range map[string]string{"aarch64": "52:54:00:ab:00:01", "x86_64": "52:54:00:ab:00:02"} {
		ie := envs[arch]
		h := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "host-" + strings.ReplaceAll(arch, "_", "-"),
			Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}, Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
			Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: bmc}}
		require.NoError(t, s.Client.Create(ctx, h))
	}
	var script string
	require.Eventually(t, func() bool {
		r := grub("mac=52:54:00:ab:00:01&arch=arm64")
		script = string(r.body)
		return r.code == http.StatusOK && strings.Contains(script, "\nboot\n")
	}, 10*time.Second, 100*time.Millisecond, "the aarch64 host's discovery boot: %s", script)
	lines := strings.Split(strings.TrimSuffix(script, "\n"), "\n")
	require.Len(t, lines, 5, script)
	kernelLine := regexp.MustCompile(`^linux "\$agentboot_root/(\S+)" (.*)$`).FindStringSubmatch(lines[1])
	require.NotNil(t, kernelLine, script)
	require.Contains(t, kernelLine[2], "'BOOTIF=01-52-54-00-ab-00-01'", "the kernel learns the MAC it booted from")
	require.Contains(t, kernelLine[2], "'ignition.firstboot'")
	require.NotContains(t, kernelLine[2], "initrd=", "iPXE's initrd name would send the EFI stub looking for a file")
	initrdLine := regexp.MustCompile(`^initrd "\$agentboot_root/(\S+)"$`).FindStringSubmatch(lines[3])
	require.NotNil(t, initrdLine, script)
	// The PXE service fetches these paths from the image service's HTTP root.
	kernel := get(t, s, s.Settings.ImageServiceHTTPURL+"/"+kernelLine[1], nil)
	require.Equal(t, http.StatusOK, kernel.code)
	require.Equal(t, "aarch64", kernelArch(kernel.body))
	initrd := get(t, s, s.Settings.ImageServiceHTTPURL+"/"+initrdLine[1], nil)
	require.Equal(t, http.StatusOK, initrd.code)
	require.Equal(t, string(get(t, s, envs["aarch64"].Status.BootArtifacts.InitrdURL, nil).body), string(initrd.body))

	// A host of the other architecture is told why and boots on.
	for query, why := range map[string]string{
		"mac=52:54:00:ab:00:01&arch=x86_64":  "boots aarch64 hosts and this host is x86_64",
		"mac=52:54:00:ab:00:02&arch=arm64":   "boots x86_64 hosts and this host is aarch64",
		"mac=52:54:00:ab:00:02&arch=riscv64": "runs on \"riscv64\", which agentboot does not boot",
	} {
		r := grub(query)
		require.Equal(t, http.StatusOK, r.code)
		require.Contains(t, string(r.body), why, query)
		require.True(t, strings.HasSuffix(string(r.body), "\nexit\n"), string(r.body))
		require.NotContains(t, string(r.body), "linux ")
	}
	// ... to its own disk when it has one: EDK2 firmware would stop at its
	// menu after a plain exit.
	require.Contains(t, string(grub("mac=52:54:00:ab:00:02&arch=arm64").body), "  chainloader /EFI/BOOT/BOOTAA64.EFI\n")
	require.Contains(t, string(grub("mac=52:54:00:ab:00:01&arch=x86_64").body), "  chainloader /EFI/BOOT/BOOTX64.EFI\n")
	require.NotContains(t, string(grub("mac=52:54:00:ab:00:02&arch=riscv64").body), "chainloader", "no loader is known for it")
	r := grub("mac=52:54:00:ab:00:02&arch=x86_64")
	require.Contains(t, string(r.body), "linux \"$agentboot_root/boot-artifacts/x86_64/", "an x86_64 GRUB boots its own InfraEnv")

	// A kernel argument GRUB would change on its way is refused, by name.
	ie := envs["aarch64"]
	patch := client.MergeFrom(ie.DeepCopy())
	ie.Spec.KernelArguments = []v1beta1.KernelArgument{{Operation: "append", Value: `agentboot.note="two words"`}}
	require.NoError(t, s.Client.Patch(ctx, ie, patch))
	require.Eventually(t, func() bool {
		return strings.Contains(string(grub("mac=52:54:00:ab:00:01&arch=arm64").body), "cannot be passed through GRUB unchanged")
	}, 10*time.Second, 100*time.Millisecond)

	// An installed host chainloads its disk's boot loader: EDK2 firmware
	// would stop at its menu after a plain exit.
	agent := &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "d9a4d1e0-0000-4000-8000-0000000000a1", Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
		Spec:       v1beta1.AgentSpec{Role: v1beta1.AgentRoleWorker, Approved: true, ClusterDeploymentName: &v1beta1.ClusterReference{Name: "c1", Namespace: "clusters-c1"}},
	}
	require.NoError(t, s.Client.Create(ctx, agent))
	apatch := client.MergeFrom(agent.DeepCopy())
	agent.Status.Inventory.Interfaces = []v1beta1.HostInterface{{Name: "eth0", MacAddress: "52:54:00:ab:00:01", IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{}}}
	agent.Status.Progress.CurrentStage = v1beta1.StageDone
	require.NoError(t, s.Client.Status().Patch(ctx, agent, apatch))
	require.Eventually(t, func() bool {
		body := string(grub("mac=52:54:00:ab:00:01&arch=arm64").body)
		return strings.Contains(body, "search --no-floppy --file --set=agentboot_disk /EFI/BOOT/BOOTAA64.EFI\n") &&
			strings.Contains(body, "  chainloader /EFI/BOOT/BOOTAA64.EFI\n  boot\n") && strings.HasSuffix(body, "\nexit\n")
	}, 10*time.Second, 100*time.Millisecond, "the installed aarch64 host boots its disk")
}

// kernelArch tells an x86 bzImage (its setup header's "HdrS") from an arm64
// Image (its header's "ARM\x64" magic), by the boot protocols' headers.
func kernelArch(k []byte) string {
	switch {
	case len(k) > 0x206 && string(k[0x202:0x206]) == "HdrS":
		return "x86_64"
	case len(k) > 60 && string(k[56:60]) == "ARM\x64":
		return "aarch64"
	}
	return "unknown"
}

// TestBootScriptByMAC walks /boot.ipxe?mac= through every way a MAC resolves.
func TestBootScriptByMAC(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	byMAC := func(mac string) response {
		t.Helper()
		return get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.ipxe?mac="+url.QueryEscape(mac), nil)
	}
	script := func(mac string) string {
		t.Helper()
		r := byMAC(mac)
		require.Equal(t, http.StatusOK, r.code, string(r.body))
		require.True(t, strings.HasPrefix(string(r.body), "#!ipxe\n"), string(r.body))
		return string(r.body)
	}
	requireExit := func(mac, why string) {
		t.Helper()
		body := script(mac)
		require.Contains(t, body, why)
		require.True(t, strings.HasSuffix(body, "\nexit\n"), body)
		require.NotContains(t, body, "kernel ")
	}

	for _, bad := range []string{"/boot.ipxe", "/boot.ipxe?mac=zz", "/boot.ipxe?mac=52:54:00:00:00:01&mac=52:54:00:00:00:02",
		"/boot.ipxe?mac=52:54:00:00:00:01&x=1", "/boot.ipxe?mac=52:54:00:00:00:01:02"} {
		r := get(t, s, s.Settings.ImageServiceHTTPURL+bad, nil)
		require.Equal(t, http.StatusBadRequest, r.code, bad)
	}
	requireExit("52:54:00:00:00:01", "no BareMetalHost has boot MAC 52:54:00:00:00:01 and no InfraEnv is labelled agentboot.io/pxe-default=true")

	// The PXE default catches every unclaimed MAC, over HTTP and HTTPS.
	def := setup(t, s, func(ie *v1beta1.InfraEnv) { ie.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"} })
	want := string(get(t, s, def.Status.BootArtifacts.IpxeScriptURL, nil).body)
	require.Contains(t, want, "kernel ")
	require.Equal(t, want, script("52:54:00:00:00:01"))
	require.Equal(t, want, script("52-54-00-00-00-01"), "hyphens and upper case are the same MAC")
	r := get(t, s, s.Settings.ImageServiceURL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
	require.Equal(t, want, string(r.body))

	ns := def.Namespace
	other := stack.NewInfraEnv(ns, "second-default")
	other.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"}
	require.NoError(t, s.Client.Create(ctx, other))
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:00:00:01").body), "InfraEnvs "+ns+"/hardware-inventory, "+ns+"/second-default are all labelled")
	}, 10*time.Second, 100*time.Millisecond, "two defaults: the host is told, and boots on")
	patch := client.MergeFrom(other.DeepCopy())
	other.Labels = nil
	require.NoError(t, s.Client.Patch(ctx, other, patch))
	other = s.WaitImage(t, client.ObjectKeyFromObject(other))
	wantOther := string(get(t, s, other.Status.BootArtifacts.IpxeScriptURL, nil).body)
	require.NotEqual(t, want, wantOther)

	// A BareMetalHost claims its boot MAC for the InfraEnv it is labelled with.
	bmc := metal3.BMCDetails{Address: "ipmi://198.18.0.9", CredentialsName: "bmc-secret"}
	// No BMC answers there: the BareMetalHost controller must leave them be.
	detached := map[string]string{"baremetalhost.metal3.io/detached": ""}
	bmh := func(name, mac, infraEnv string) *metal3.BareMetalHost {
		h := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: detached}, Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: bmc}}
		if infraEnv != "" {
			h.Labels = map[string]string{v1beta1.InfraEnvNameLabel: infraEnv}
		}
		require.NoError(t, s.Client.Create(ctx, h))
		return h
	}
	bmh("worker-0", "52:54:00:AA:00:01", "second-default")
	require.Eventually(t, func() bool { return string(byMAC("52:54:00:aa:00:01").body) == wantOther }, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, want, script("52:54:00:00:00:01"), "other MACs still boot the default")

	bmh("worker-1", "52:54:00:aa:00:02", "")
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:02").body), "BareMetalHost "+ns+"/worker-1 has no infraenvs.agent-install.openshift.io label")
	}, 10*time.Second, 100*time.Millisecond)
	requireExit("52:54:00:aa:00:02", "has no infraenvs.agent-install.openshift.io label")

	bmh("worker-2", "52:54:00:aa:00:03", "gone")
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:03").body), "names InfraEnv gone, which does not exist")
	}, 10*time.Second, 100*time.Millisecond)

	external := bmh("worker-4", "52:54:00:aa:00:05", "second-default")
	patch = client.MergeFrom(external.DeepCopy())
	external.Spec.ExternallyProvisioned = true
	require.NoError(t, s.Client.Patch(ctx, external, patch))
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:05").body), "BareMetalHost "+ns+"/worker-4 is externally provisioned")
	}, 10*time.Second, 100*time.Millisecond)

	otherNS := s.Namespace(t, "elsewhere")
	twin := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: "twin", Annotations: detached}, Spec: metal3.BareMetalHostSpec{BootMACAddress: "52:54:00:aa:00:01", BMC: bmc}}
	require.NoError(t, s.Client.Create(ctx, twin))
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:01").body), "BareMetalHosts "+otherNS+"/twin, "+ns+"/worker-0 all have boot MAC 52:54:00:aa:00:01")
	}, 10*time.Second, 100*time.Millisecond)
	requireExit("52:54:00:aa:00:01", "all have boot MAC")
	require.NoError(t, s.Client.Delete(ctx, twin))

	// An installed host goes to its disk.
	agent := &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "d9a4d1e0-0000-4000-8000-000000000002", Labels: map[string]string{v1beta1.InfraEnvNameLabel: "second-default"}},
		Spec:       v1beta1.AgentSpec{Role: v1beta1.AgentRoleWorker, Approved: true, ClusterDeploymentName: &v1beta1.ClusterReference{Name: "c1", Namespace: "clusters-c1"}},
	}
	require.NoError(t, s.Client.Create(ctx, agent))
	patch = client.MergeFrom(agent.DeepCopy())
	agent.Status.Inventory.Interfaces = []v1beta1.HostInterface{{Name: "eth0", MacAddress: "52:54:00:aa:00:01", IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{}}}
	agent.Status.Progress.CurrentStage = v1beta1.StageDone
	require.NoError(t, s.Client.Status().Patch(ctx, agent, patch))
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:01").body), "this host is installed; booting from disk")
	}, 10*time.Second, 100*time.Millisecond)
	requireExit("52:54:00:aa:00:01", "booting from disk")

	// An InfraEnv that is not ready keeps the host waiting and asking.
	broken := stack.NewInfraEnv(ns, "broken")
	broken.Spec.PullSecretRef.Name = "missing"
	require.NoError(t, s.Client.Create(ctx, broken))
	s.WaitCondition(t, client.ObjectKeyFromObject(broken), corev1.ConditionFalse, nil)
	bmh("worker-3", "52:54:00:aa:00:04", "broken")
	require.Eventually(t, func() bool {
		return strings.Contains(string(byMAC("52:54:00:aa:00:04").body), "InfraEnv "+ns+"/broken is not ready")
	}, 10*time.Second, 100*time.Millisecond)
	body := script("52:54:00:aa:00:04")
	require.Contains(t, body, "missing")
	require.True(t, strings.HasSuffix(body, "\nsleep 30\nchain --replace --autofree http://"+s.HTTPAddr+"/boot.ipxe?mac=52:54:00:aa:00:04\n"), body)
}

// On a boot network shared by teams, only namespaces the admin designated
// (--boot-network-namespaces) decide where network-booting hosts go: a
// tenant's pxe-default InfraEnv captures nothing, and its BareMetalHost
// with another host's boot MAC neither steals nor blocks that host.
func TestBootNetworkNamespaces(t *testing.T) {
	s := stack.Start(t, stack.Options{BootNetworkNamespaces: "pxe-admin"})
	ctx := context.Background()
	byMAC := func(mac string) string {
		t.Helper()
		r := get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.ipxe?mac="+url.QueryEscape(mac), nil)
		require.Equal(t, http.StatusOK, r.code, string(r.body))
		return string(r.body)
	}
	tenant := setup(t, s, func(ie *v1beta1.InfraEnv) { ie.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"} })
	bmc := metal3.BMCDetails{Address: "ipmi://198.18.0.9", CredentialsName: "bmc-secret"}
	claim := &metal3.BareMetalHost{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant.Namespace, Name: "not-mine", Labels: map[string]string{v1beta1.InfraEnvNameLabel: tenant.Name},
			Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}},
		Spec: metal3.BareMetalHostSpec{BootMACAddress: "52:54:00:bb:00:01", BMC: bmc},
	}
	require.NoError(t, s.Client.Create(ctx, claim))
	require.Eventually(t, func() bool {
		body := byMAC("52:54:00:bb:00:01")
		return strings.Contains(body, "BareMetalHosts "+tenant.Namespace+"/not-mine ignored: not in a namespace designated for network boot (--boot-network-namespaces=pxe-admin)") &&
			strings.Contains(body, "InfraEnvs "+tenant.Namespace+"/hardware-inventory ignored") && strings.HasSuffix(body, "\nexit\n")
	}, 10*time.Second, 100*time.Millisecond, "a tenant's claims are ignored, and the host is told")

	// The designated namespace's default takes every unclaimed host,
	// including the one the tenant tried to claim.
	// The namespace has a fixed name; a run before this one on the same
	// control plane (-count=2) left it and its Secret.
	created := func(err error) bool { return err == nil || apierrors.IsAlreadyExists(err) }
	require.True(t, created(s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pxe-admin"}})))
	require.True(t, created(s.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "pxe-admin", Name: "pull-secret"},
		Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"quay.io":{"auth":"bWU6c2VjcmV0"}}}`)}})))
	def := stack.NewInfraEnv("pxe-admin", "pool")
	def.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"}
	require.NoError(t, s.Client.Create(ctx, def))
	def = s.WaitImage(t, client.ObjectKeyFromObject(def))
	want := string(get(t, s, def.Status.BootArtifacts.IpxeScriptURL, nil).body)
	require.Contains(t, want, "kernel ")
	require.Eventually(t, func() bool { return byMAC("52:54:00:bb:00:01") == want }, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, want, byMAC("52:54:00:bb:00:02"))
}
