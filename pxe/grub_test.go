package pxe

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"
)

// fakeGRUB is a file shaped like agentboot's netboot GRUB: binary bytes
// around the embedded config with its placeholder.
func fakeGRUB(t *testing.T, config string) string {
	p := filepath.Join(t.TempDir(), "grubnetaa64.efi")
	data := append(append([]byte("MZ\x00\x01binary"), config...), bytes.Repeat([]byte{0, 0xff}, 5000)...)
	require.NoError(t, os.WriteFile(p, data, 0o644))
	return p
}

// imageService plays the image service's HTTP listener: it records the
// requests it gets.
type imageService struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newImageService(t *testing.T, files map[string]string) *imageService {
	is := &imageService{hits: map[string]int{}}
	is.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.mu.Lock()
		is.hits[r.URL.RequestURI()]++
		is.mu.Unlock()
		if r.URL.Path == "/boot.grub" && r.URL.Query().Get("arch") == "bad" {
			http.Error(w, "malformed mac \"x\": want six hexadecimal bytes separated by colons", http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/boot.grub" {
			w.Header().Set("Cache-Control", "no-store")
			_, _ = io.WriteString(w, "echo 'script for "+r.URL.RawQuery+"'\n")
			return
		}
		if r.URL.Path == "/broken" || r.URL.Path == "/images/broken" {
			http.Error(w, "oops", http.StatusInternalServerError)
			return
		}
		body, ok := files[r.URL.RequestURI()]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(is.Close)
	return is
}

func (is *imageService) hit(uri string) int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.hits[uri]
}

func tftpGet(t *testing.T, addr, name string) ([]byte, error) {
	t.Helper()
	c, err := tftp.NewClient(addr)
	require.NoError(t, err)
	c.SetBlockSize(1468)
	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, err
	}
	var got bytes.Buffer
	_, err = wt.WriteTo(&got)
	return got.Bytes(), err
}

// arm64 UEFI clients get agentboot's netboot GRUB with this server's
// address in it, over TFTP (arch 11) and HTTP (arch 19); it fetches its
// boot decision and the files it names from the image service through the
// TFTP server, and nothing else.
func TestGRUBNetboot(t *testing.T) {
	kernel := strings.Repeat("K", 200_000)
	is := newImageService(t, map[string]string{
		"/boot-artifacts/aarch64/v1/vmlinuz":    kernel,
		"/images/uid-1/v2/initrd.img?token=abc": "initrd bytes",
		"/secret":                               "never served through TFTP",
	})
	grubFile := fakeGRUB(t, GRUBEarlyConfig+"\x00tar header\x00"+GRUBConfig)
	original, err := os.ReadFile(grubFile)
	require.NoError(t, err)
	s, tftpAddr, httpAddr := startServer(t, ProxyDHCP, func(c *Config) {
		c.ARM64Binary = grubFile
		c.BootScriptURL = is.URL + "/boot.ipxe"
	})

	want := bytes.Replace(original, []byte(GRUBServerPlaceholder), []byte("127.0.0.1"+strings.Repeat(" ", len(GRUBServerPlaceholder)-9)), 1)
	got, err := tftpGet(t, tftpAddr, "grubnetaa64.efi")
	require.NoError(t, err)
	require.Equal(t, want, got, "the GRUB carries this server's address, its length unchanged")

	script, err := tftpGet(t, tftpAddr, "/agentboot/boot.grub?mac=52:54:00:aa:00:01&arch=arm64")
	require.NoError(t, err)
	require.Equal(t, "echo 'script for arch=arm64&mac=52%3A54%3A00%3Aaa%3A00%3A01'\n", string(script), "the query as the image service gets it: one encoding for one file")
	for range 3 {
		got, err := tftpGet(t, tftpAddr, "agentboot/boot-artifacts/aarch64/v1/vmlinuz")
		require.NoError(t, err)
		require.Equal(t, kernel, string(got))
	}
	require.Equal(t, 1, is.hit("/boot-artifacts/aarch64/v1/vmlinuz"), "hosts booting together share one fetch")
	got, err = tftpGet(t, tftpAddr, "agentboot/images/uid-1/v2/initrd.img?token=abc")
	require.NoError(t, err)
	require.Equal(t, "initrd bytes", string(got))
	_, _ = tftpGet(t, tftpAddr, "agentboot/boot.grub?mac=52:54:00:aa:00:01&arch=arm64")
	require.Equal(t, 2, is.hit("/boot.grub?arch=arm64&mac=52%3A54%3A00%3Aaa%3A00%3A01"), "boot decisions are never kept")

	for name, why := range map[string]string{
		"agentboot/secret":                                         "file not found",
		"agentboot/images/../secret":                               "file not found",
		"agentboot/boot-artifacts/../../secret":                    "file not found",
		"agentboot/images/a b":                                     "file not found",
		"agentboot/images/missing?token=t":                         "file not found",
		"agentboot/images/broken?token=t":                          "image service: 500 Internal Server Error",
		"agentboot":                                                "file not found",
		"grubnetaa64.efi/../secret":                                "file not found",
		"agentboot/boot.grub?mac=%zz":                              "file not found",
		"agentboot/http://198.18.0.9/boot.grub":                    "file not found",
		"agentboot//boot-artifacts/aarch64/v1/vm":                  "file not found",
		"agentboot/boot-artifacts/aarch64/v1/vmlinuz?again=1":      "file not found",
		"agentboot/images/uid-1/v2/initrd.img?token=abc&token=abc": "file not found",
		"agentboot/images/uid-1/v2/initrd.img?token=abc&other=1":   "file not found",
		"agentboot/boot.grub.bak?mac=52:54:00:aa:00:01&arch=arm64": "file not found",
		"agentboot/boot.grub?mac=52:54:00:aa:00:01":                "file not found",
	} {
		_, err := tftpGet(t, tftpAddr, name)
		require.ErrorContains(t, err, why, name)
	}
	require.Zero(t, is.hit("/secret"), "only the image service's boot files are reachable")

	// DHCP: arm64 PXE firmware is sent to the GRUB over TFTP; arm64 HTTP
	// boot is not answered (GRUB 2.06 finds no network there), and the
	// GRUB is not served over HTTP.
	reply := s.Handle(discover(t, "52:54:00:aa:00:01", iana.EFI_ARM64, "PXEClient:Arch:00011:UNDI:003000"), 67)
	require.NotNil(t, reply)
	require.Equal(t, "grubnetaa64.efi", reply.Response().BootFileName)
	require.Nil(t, s.Handle(discover(t, "52:54:00:aa:00:02", iana.EFI_ARM64_HTTP, "HTTPClient:Arch:00019:UNDI:003000"), 67))
	resp, err := http.Get("http://" + httpAddr + "/ipxe/grubnetaa64.efi")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// The arm64 boot loader must be agentboot's netboot GRUB: a stock GRUB
// would not find this service behind a proxyDHCP offer.
func TestGRUBRefusedWithoutPlaceholder(t *testing.T) {
	dir, _ := binaries(t)
	base := Config{Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), BootScriptURL: "http://x/boot.ipxe", TFTPDir: dir}
	for file, want := range map[string]string{
		fakeGRUB(t, "set prefix=(tftp)/grub\n"):                                                             "is not agentboot's netboot GRUB: it has 0 server address placeholders",
		fakeGRUB(t, GRUBServerPlaceholder+GRUBServerPlaceholder):                                            "it has 2 server address placeholders",
		fakeGRUB(t, "set agentboot_server="+GRUBServerPlaceholder+"\nset prefix=$agentboot_root\nnormal\n"): "was built for another agentboot version",
		fakeGRUB(t, GRUBEarlyConfig+"\x00older loop\x00"):                                                   "was built for another agentboot version",
		"grubnetaa64.efi": "build it with make pxe-grub",
	} {
		c := base
		c.ARM64Binary = file
		_, err := New(c)
		require.ErrorContains(t, err, want, file)
	}
}

// A file larger than the proxy's limit is refused, whether the image
// service announces its length or not.
func TestProxyLimit(t *testing.T) {
	is := newImageService(t, map[string]string{"/images/big?token=t": strings.Repeat("x", 2000)})
	p, err := newImageProxy(is.URL+"/boot.ipxe", 1000, 10_000, testr.New(t))
	require.NoError(t, err)
	_, err = p.get(context.Background(), "images/big?token=t")
	require.ErrorContains(t, err, "more than the 1000 bytes this service proxies")
	chunked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for range 20 {
			_, _ = w.Write(bytes.Repeat([]byte("y"), 100))
			w.(http.Flusher).Flush()
		}
	}))
	defer chunked.Close()
	p, err = newImageProxy(chunked.URL+"/boot.ipxe", 1000, 10_000, testr.New(t))
	require.NoError(t, err)
	_, err = p.get(context.Background(), "images/big?token=t")
	require.ErrorContains(t, err, "more than the 1000 bytes")
}

// A fetched file is served from memory for a minute after it was fetched,
// however often it is asked for, and then fetched again: a token the image
// service stopped accepting stops working here too.
func TestProxyKeepsFilesAMinute(t *testing.T) {
	is := newImageService(t, map[string]string{"/images/u/v/initrd.img?token=t": "initrd"})
	p, err := newImageProxy(is.URL+"/boot.ipxe", 1000, 10_000, testr.New(t))
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	p.now = func() time.Time { return now }
	for range 5 {
		got, err := p.get(context.Background(), "images/u/v/initrd.img?token=t")
		require.NoError(t, err)
		require.Equal(t, "initrd", string(got))
		now = now.Add(10 * time.Second)
	}
	require.Equal(t, 1, is.hit("/images/u/v/initrd.img?token=t"))
	now = now.Add(20 * time.Second)
	_, err = p.get(context.Background(), "images/u/v/initrd.img?token=t")
	require.NoError(t, err)
	require.Equal(t, 2, is.hit("/images/u/v/initrd.img?token=t"), "fetched again a minute after the first fetch")
}

// An image service refusing a boot decision request says why, and GRUB
// shows it; a boot script URL without a path means the root.
func TestProxyErrors(t *testing.T) {
	is := newImageService(t, nil)
	p, err := newImageProxy(is.URL, 1000, 10_000, testr.New(t))
	require.NoError(t, err)
	_, err = p.get(context.Background(), "boot.grub?mac=x&arch=bad")
	require.EqualError(t, err, `image service: 400 Bad Request: malformed mac "x": want six hexadecimal bytes separated by colons`)
	require.Equal(t, 1, is.hit("/boot.grub?arch=bad&mac=x"), "no ./ in the path")
}

// The Secure Boot path: x86-64 UEFI PXE firmware gets Debian's signed
// shim, which fetches the signed network GRUB beside it, which reads
// grub/grub.cfg, written with this server's address; HTTP boot clients keep
// iPXE. Binaries without a signature are refused at start.
func TestSecureBootChain(t *testing.T) {
	shim, grub := "/usr/lib/shim/shimx64.efi.signed", "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed"
	for _, f := range []string{shim, grub} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%v: install Debian packages shim-signed and grub-efi-amd64-signed (.ci/packages)", err)
		}
	}
	s, tftpAddr, httpAddr := startServer(t, ProxyDHCP, func(c *Config) {
		c.SecureBoot, c.ShimBinary, c.SignedGRUBBinary = true, shim, grub
	})
	reply := s.Handle(discover(t, "52:54:00:aa:00:61", iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), 67)
	require.NotNil(t, reply)
	require.Equal(t, "shimx64.efi", reply.Response().BootFileName)
	reply = s.Handle(discover(t, "52:54:00:aa:00:62", iana.EFI_X86_64_HTTP, "HTTPClient:Arch:00016:UNDI:003001"), 67)
	require.NotNil(t, reply)
	require.Equal(t, "http://"+httpAddr+"/ipxe/ipxe.efi", string(reply.Response().GetOneOption(dhcpv4.OptionBootfileName)))
	reply = s.Handle(discover(t, "52:54:00:aa:00:63", iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001"), 67)
	require.NotNil(t, reply)
	require.Equal(t, "undionly.kpxe", reply.Response().BootFileName, "BIOS has no Secure Boot")

	get := func(name string) []byte {
		c, err := tftp.NewClient(tftpAddr)
		require.NoError(t, err)
		c.SetBlockSize(1468)
		wt, err := c.Receive(name, "octet")
		require.NoError(t, err, name)
		var b bytes.Buffer
		_, err = wt.WriteTo(&b)
		require.NoError(t, err)
		return b.Bytes()
	}
	for name, path := range map[string]string{"shimx64.efi": shim, "grubx64.efi": grub} {
		want, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, want, get(name), name)
	}
	require.Equal(t, "set agentboot_server=127.0.0.1\nset agentboot_root=(tftp,$agentboot_server)/agentboot\n"+
		"echo \"agentboot: network boot through $agentboot_server, MAC $net_default_mac\"\n"+GRUBConfig, string(get("grub/grub.cfg")))

	dir, _ := binaries(t)
	for _, bad := range []struct{ shim, grub, want string }{
		{filepath.Join(dir, "ipxe.efi"), grub, "not an EFI application"},
		{shim, "/usr/lib/ipxe/ipxe.efi", "not signed: firmware with Secure Boot on would refuse it"},
		{shim, filepath.Join(dir, "missing.efi"), "no such file"},
	} {
		_, err := New(Config{Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), BootScriptURL: "http://x/boot.ipxe", TFTPDir: dir,
			SecureBoot: true, ShimBinary: bad.shim, SignedGRUBBinary: bad.grub})
		require.ErrorContains(t, err, bad.want)
	}
}
