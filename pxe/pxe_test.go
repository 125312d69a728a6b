package pxe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv6"

	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/boottrace"
)

// binaries makes a TFTP directory with distinct content per file.
func binaries(t testing.TB) (string, map[string][]byte) {
	dir := t.TempDir()
	files := map[string][]byte{}
	for i, name := range []string{"undionly.kpxe", "ipxe.efi"} {
		data := bytes.Repeat([]byte{byte('a' + i)}, 70_000+i*33_333) // several blocks, odd sizes
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
		files[name] = data
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("not served"), 0o644))
	return dir, files
}

func freeAddr(t testing.TB, network string) string {
	switch network {
	case "udp":
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		require.NoError(t, err)
		defer c.Close()
		return c.LocalAddr().String()
	default:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		return l.Addr().String()
	}
}

// runUntilCleanup runs s until the test ends.
func runUntilCleanup(t *testing.T, s *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// startTFTPAndHTTP runs the service with DHCP on a throwaway loopback socket
// (binding port 67 needs root; the VM lab covers it).
// testMetricsToken is what /metrics asks for in these tests.
const testMetricsToken = "metrics-token-0123456789"

func startServer(t *testing.T, mode Mode, options ...func(*Config)) (*Server, string, string) {
	t.Helper()
	dir, _ := binaries(t)
	tftpAddr, httpAddr := freeAddr(t, "udp"), freeAddr(t, "tcp")
	cfg := Config{
		Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), Mode: mode,
		BootScriptURL: "http://127.0.0.1:8080/boot.ipxe", TFTPDir: dir, TFTPAddr: tftpAddr, HTTPAddr: httpAddr,
		ListenDHCP: func(string, int) (net.PacketConn, error) { return net.ListenPacket("udp4", "127.0.0.1:0") },
		// DHCPv6 needs a raw socket: TestDHCPv6WatchOnVeth has one.
		ListenDHCP6:  func(string) (*ipv6.PacketConn, error) { return nil, errors.New("no DHCPv6 watch in these tests") },
		Log:          testr.New(t),
		MetricsToken: testMetricsToken,
	}
	if mode == Authoritative {
		cfg.ServerIP, cfg.PrefixLen = netip.MustParseAddr("198.18.0.1"), 24
		cfg.PoolStart, cfg.PoolEnd = netip.MustParseAddr("198.18.0.100"), netip.MustParseAddr("198.18.0.110")
		cfg.LeaseFile = filepath.Join(t.TempDir(), "leases.json")
	}
	for _, o := range options {
		o(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	runUntilCleanup(t, s)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", httpAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	return s, tftpAddr, httpAddr
}

func TestTFTP(t *testing.T) {
	for _, singlePort := range []bool{false, true} {
		t.Run(fmt.Sprintf("single-port=%v", singlePort), func(t *testing.T) {
			_, addr, _ := startServer(t, ProxyDHCP, func(c *Config) { c.TFTPSinglePort = singlePort })
			testTFTP(t, addr)
		})
	}
}

func testTFTP(t *testing.T, addr string) {
	_, files := binaries(t)
	for name, want := range files {
		for _, blksize := range []int{512, 1468, 8192} {
			c, err := tftp.NewClient(addr)
			require.NoError(t, err)
			c.SetBlockSize(blksize)
			c.RequestTSize(true)
			wt, err := c.Receive(name, "octet")
			require.NoError(t, err)
			size, ok := wt.(tftp.IncomingTransfer).Size()
			require.True(t, ok, "tsize answered")
			require.Equal(t, int64(len(want)), size)
			var got bytes.Buffer
			_, err = wt.WriteTo(&got)
			require.NoError(t, err)
			require.Equal(t, want, got.Bytes(), "%s with blksize %d", name, blksize)
		}
	}
	for _, bad := range []string{"secret.txt", "../secret.txt", "/etc/passwd", "", "ipxe.efi/..", "."} {
		c, err := tftp.NewClient(addr)
		require.NoError(t, err)
		_, err = c.Receive(bad, "octet")
		require.Error(t, err, "%q", bad)
		require.Contains(t, err.Error(), "file not found", "%q gets an error packet", bad)
	}
	c, err := tftp.NewClient(addr)
	require.NoError(t, err)
	_, err = c.Send("upload.bin", "octet")
	require.Error(t, err, "read only")
}

func TestMaxBlockSize(t *testing.T) {
	for mtu, want := range map[int]int{1500: 1468, 9000: 8968, 65536: 65464, 576: 544, 544: 0, 1280: 1248} {
		require.Equal(t, want, maxBlockSize(mtu), "MTU %d", mtu)
	}
}

// tftp-hpa, a real client, fetches a binary.
func TestTFTPWithTFTPHPA(t *testing.T) {
	if _, err := exec.LookPath("tftp"); err != nil {
		t.Fatal("tftp (tftp-hpa) not found: install Debian package tftp-hpa (.ci/packages)")
	}
	_, addr, _ := startServer(t, ProxyDHCP)
	_, files := binaries(t)
	host, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	cmd := exec.Command("tftp", "-m", "binary", host, port, "-c", "get", "ipxe.efi")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	got, err := os.ReadFile(filepath.Join(dir, "ipxe.efi"))
	require.NoError(t, err)
	require.Equal(t, files["ipxe.efi"], got)
}

func TestHTTPServesBinariesAndMetrics(t *testing.T) {
	s, _, httpAddr := startServer(t, ProxyDHCP)
	_, files := binaries(t)
	resp, err := http.Get("http://" + httpAddr + "/ipxe/ipxe.efi")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, files["ipxe.efi"], body)
	for _, bad := range []string{"secret.txt", "..%2Fsecret.txt"} {
		resp, err := http.Get("http://" + httpAddr + "/ipxe/" + bad)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, bad)
	}

	// A malformed packet is dropped and counted; metrics are served to
	// whoever holds the token, and to nobody else on the boot network.
	require.Nil(t, s.Handle([]byte{1, 2, 3}, 67))
	require.Equal(t, 1.0, testutil.ToFloat64(s.handler.Metrics().Dropped.WithLabelValues("malformed")))
	scrape := func(token string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/metrics", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, token := range []string{"", "not-the-metrics-token"} {
		code, body := scrape(token)
		require.Equal(t, http.StatusUnauthorized, code, "token %q", token)
		require.NotContains(t, body, "agentboot_dhcp")
	}
	// The boot path's hops: a boot file offered, a boot file sent whole.
	require.NotNil(t, s.Handle(discover(t, "52:54:00:aa:00:09", iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), 67))
	c, err := tftp.NewClient(s.cfg.TFTPAddr)
	require.NoError(t, err)
	wt, err := c.Receive("ipxe.efi", "octet")
	require.NoError(t, err)
	_, err = wt.WriteTo(io.Discard)
	require.NoError(t, err)
	code, metrics := scrape(testMetricsToken)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, `agentboot_dhcp_dropped_total{reason="malformed"} 1`)
	require.Contains(t, metrics, `agentboot_boot_path_total{hop="dhcp_offer"} 1`)
	require.Eventually(t, func() bool {
		_, metrics := scrape(testMetricsToken)
		return strings.Contains(metrics, `agentboot_boot_path_total{hop="boot_file"} 2`)
	}, 5*time.Second, 20*time.Millisecond, "the transfer is counted once it ends, as the HTTP GET above was")
	_, _, offAddr := startServer(t, ProxyDHCP, func(c *Config) { c.MetricsToken = "" })
	resp, err = http.Get("http://" + offAddr + "/metrics")
	require.NoError(t, err)
	body2, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "no token configured: metrics are off")
	require.Contains(t, string(body2), "--metrics-token-file")
}

func TestConfigErrors(t *testing.T) {
	dir, _ := binaries(t)
	base := Config{Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), BootScriptURL: "http://x/boot.ipxe", TFTPDir: dir}
	cases := map[string]struct {
		change func(*Config)
		want   string
	}{
		"no interface":   {func(c *Config) { c.Interface = "" }, "interface is required"},
		"bad mode":       {func(c *Config) { c.Mode = "rogue" }, `mode "rogue"`},
		"no boot script": {func(c *Config) { c.BootScriptURL = "" }, "boot script URL is required"},
		"missing binary": {func(c *Config) { c.EFIBinary = "snponly.efi" }, "snponly.efi"},
		"path as binary": {func(c *Config) { c.EFIBinary = "../x.efi" }, "not a plain file name"},
		"no pool":        {func(c *Config) { c.Mode = Authoritative }, "needs an address pool"},
		"no lease file": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.0.9")
		}, "needs a lease file"},
		"pool outside the network": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.1.9")
		}, "198.18.1.9 is outside the boot network 198.18.0.0/24"},
		"pool over the server": {func(c *Config) {
			authoritative(c, "198.18.0.1", "198.18.0.9")
		}, "contains the server's own address 198.18.0.1"},
		"pool over the router": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.0.9")
			c.Router = netip.MustParseAddr("198.18.0.3")
		}, "contains the router 198.18.0.3"},
		"reservation outside": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.0.9")
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.0.0.1")}
		}, "reservation 52:54:00:00:00:01=10.0.0.1 is outside"},
		"prefix length": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.0.9")
			c.PrefixLen = 31
		}, "prefix length 31"},
		"server IP not on the interface": {func(c *Config) {
			authoritative(c, "198.18.0.2", "198.18.0.9")
			c.PrefixLen = 0
		}, "interface lo does not have 198.18.0.1"},
		"IPv6 server":            {func(c *Config) { c.ServerIP = netip.MustParseAddr("::1") }, "not an IPv4 address"},
		"interface without IPv4": {func(c *Config) { c.ServerIP = netip.Addr{}; c.Interface = "no-such-if0" }, "no-such-if0"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := base
			tc.change(&c)
			_, err := New(c)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// authoritative turns c into an authoritative configuration on
// 198.18.0.0/24.
func authoritative(c *Config, first, last string) {
	c.Mode = Authoritative
	c.ServerIP, c.PrefixLen = netip.MustParseAddr("198.18.0.1"), 24
	c.PoolStart, c.PoolEnd = netip.MustParseAddr(first), netip.MustParseAddr(last)
}

func discover(t testing.TB, mac string, arch iana.Arch, class string) []byte {
	hw, _ := net.ParseMAC(mac)
	p, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)), dhcpv4.WithOption(dhcpv4.OptClientArch(arch)))
	require.NoError(t, err)
	return p.ToBytes()
}

// FuzzDHCP sends arbitrary packets through parsing and both modes'
// answers: dropped or answered, never a crash.
func FuzzDHCP(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/dhcp-*.bin")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(discover(f, "52:54:00:00:00:01", iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001"))
	f.Add(discover(f, "52:54:00:00:00:02", iana.EFI_X86_64_HTTP, "HTTPClient"))
	servers := map[Mode]*Server{}
	for _, mode := range []Mode{ProxyDHCP, Authoritative} {
		dir, _ := binaries(f)
		cfg := Config{Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), Mode: mode, BootScriptURL: "http://127.0.0.1/boot.ipxe", TFTPDir: dir}
		if mode == Authoritative {
			authoritative(&cfg, "198.18.0.2", "198.18.0.250")
			cfg.LeaseFile = filepath.Join(f.TempDir(), "l.json")
		}
		s, err := New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		servers[mode] = s
	}
	f.Fuzz(func(t *testing.T, packet []byte) {
		for _, s := range servers {
			for _, port := range []int{67, 4011} {
				if r := s.Handle(packet, port); r != nil {
					require.NotEmpty(t, r.Response().ToBytes())
				}
			}
		}
	})
}

// FuzzTFTPName feeds arbitrary requested names through the allowlist.
func FuzzTFTPName(f *testing.F) {
	for _, s := range []string{"undionly.kpxe", "/ipxe.efi", "../../etc/passwd", "ipxe.efi\x00.txt", "IPXE.EFI", ""} {
		f.Add(s)
	}
	dir, _ := binaries(f)
	s, err := New(Config{Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), BootScriptURL: "http://x/", TFTPDir: dir})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, ok := s.tftp.Allowed(name)
		if ok && got != "undionly.kpxe" && got != "ipxe.efi" {
			t.Fatalf("%q allowed as %q", name, got)
		}
		if ok && strings.ContainsAny(got, "/\x00") {
			t.Fatalf("path in %q", got)
		}
	})
}

// What the PXE service sees of a MAC's boot is posted to the image service
// with the token: its DHCP requests (how they were answered) and the boot
// file it fetched over TFTP from the address it said it has.
func TestBootObservations(t *testing.T) {
	var mu sync.Mutex
	var got []boottrace.Observation
	var auth []string
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b boottrace.Batch
		require.NoError(t, json.NewDecoder(r.Body).Decode(&b))
		mu.Lock()
		got = append(got, b.Observations...)
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer images.Close()
	s, tftpAddr, _ := startServer(t, ProxyDHCP, func(c *Config) {
		c.ObservationsURL, c.ObservationsToken = images.URL+"/boot-observations", "observations-token-0123456789"
	})
	mac := "52:54:00:aa:00:42"
	for i := 0; i < 2; i++ {
		require.NotNil(t, s.Handle(discover(t, mac, iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), 67))
	}
	// The ProxyDHCP request comes from the address the client has.
	hw, _ := net.ParseMAC(mac)
	req, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64)), dhcpv4.WithClientIP(net.ParseIP("127.0.0.1")))
	require.NoError(t, err)
	require.NotNil(t, s.Handle(req.ToBytes(), 4011))
	require.Nil(t, s.Handle(discover(t, "52:54:00:aa:00:43", iana.Arch(0x99), "HTTPClient:Arch:00153"), 67), "an architecture it has no boot file for")
	c, err := tftp.NewClient(tftpAddr)
	require.NoError(t, err)
	wt, err := c.Receive("ipxe.efi", "octet")
	require.NoError(t, err)
	_, err = wt.WriteTo(io.Discard)
	require.NoError(t, err)

	find := func(mac, hop string) *boottrace.Observation {
		mu.Lock()
		defer mu.Unlock()
		var last *boottrace.Observation
		for i := range got {
			if got[i].MAC == mac && got[i].Hop == hop {
				last = &got[i]
			}
		}
		return last
	}
	require.Eventually(t, func() bool { return find(mac, boottrace.BootFile) != nil }, 10*time.Second, 50*time.Millisecond, "%+v", &got)
	d := find(mac, boottrace.DHCP)
	require.NotNil(t, d)
	require.True(t, d.OK)
	require.Contains(t, d.Outcome, "ACK with boot file ipxe.efi")
	f := find(mac, boottrace.BootFile)
	require.True(t, f.OK)
	require.Contains(t, f.Detail, "ipxe.efi over TFTP from 127.0.0.1")
	refused := find("52:54:00:aa:00:43", boottrace.DHCP)
	require.NotNil(t, refused)
	require.False(t, refused.OK)
	require.Contains(t, refused.Outcome, "not answered: its firmware's architecture")
	mu.Lock()
	for _, a := range auth {
		require.Equal(t, "Bearer observations-token-0123456789", a)
	}
	var discovers int64
	for _, o := range got {
		if o.MAC == mac && o.Hop == boottrace.DHCP {
			discovers += o.Count
		}
	}
	mu.Unlock()
	require.EqualValues(t, 3, discovers, "two DISCOVERs and the REQUEST, counted")
}

// A UEFI HTTP boot client's boot file is a hop of its boot path as a TFTP
// transfer is: the whole file sent by GET, not the firmware's HEAD for the
// size, nor a range.
func TestHTTPBootFileObserved(t *testing.T) {
	var mu sync.Mutex
	var got []boottrace.Observation
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b boottrace.Batch
		require.NoError(t, json.NewDecoder(r.Body).Decode(&b))
		mu.Lock()
		got = append(got, b.Observations...)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer images.Close()
	s, _, httpAddr := startServer(t, ProxyDHCP, func(c *Config) {
		c.ObservationsURL, c.ObservationsToken = images.URL+"/boot-observations", "observations-token-0123456789"
	})
	const mac, class = "52:54:00:aa:00:44", "HTTPClient:Arch:00016:UNDI:003001"
	offer := s.Handle(discover(t, mac, iana.EFI_X86_64_HTTP, class), 67)
	require.NotNil(t, offer)
	reply := offer.Response()
	require.Equal(t, "http://"+httpAddr+"/ipxe/ipxe.efi", string(reply.GetOneOption(dhcpv4.OptionBootfileName)))
	require.Equal(t, "HTTPClient", reply.ClassIdentifier(), "edk2 takes boot information only from an offer marked HTTPClient")
	// The client's REQUEST to the site's DHCP server says its address.
	hw, _ := net.ParseMAC(mac)
	req, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64_HTTP)), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("127.0.0.1"))))
	require.NoError(t, err)
	require.Nil(t, s.Handle(req.ToBytes(), 67))

	_, files := binaries(t)
	do := func(method, rng string) []byte {
		r, err := http.NewRequest(method, "http://"+httpAddr+"/ipxe/ipxe.efi", nil)
		require.NoError(t, err)
		if rng != "" {
			r.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, "application/efi", resp.Header.Get("Content-Type"))
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return body
	}
	require.Empty(t, do(http.MethodHead, ""))
	cond, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/ipxe/ipxe.efi", nil)
	require.NoError(t, err)
	cond.Header.Set("If-Modified-Since", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
	resp, err := http.DefaultClient.Do(cond)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotModified, resp.StatusCode)
	require.Equal(t, files["ipxe.efi"][:10], do(http.MethodGet, "bytes=0-9"))
	require.Equal(t, files["ipxe.efi"], do(http.MethodGet, ""))

	var bf []boottrace.Observation
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		bf = nil
		for _, o := range got {
			if o.MAC == mac && o.Hop == boottrace.BootFile {
				bf = append(bf, o)
			}
		}
		return len(bf) > 0
	}, 10*time.Second, 50*time.Millisecond)
	require.Len(t, bf, 1, "one boot file: not the HEAD, the range, nor the conditional GET answered 304")
	require.True(t, bf[0].OK)
	require.EqualValues(t, 1, bf[0].Count)
	require.Equal(t, "ipxe.efi over HTTP from 127.0.0.1", bf[0].Detail)
	require.Equal(t, fmt.Sprintf("sent, %d bytes", len(files["ipxe.efi"])), bf[0].Outcome)
	require.Equal(t, 1.0, testutil.ToFloat64(s.hops.WithLabelValues(bootpath.BootFile)))
}

// In authoritative mode an installed system's DHCP is answered with an
// address and is no hop of a boot path: only network-boot clients are
// observed.
func TestBootObservationsAuthoritative(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b boottrace.Batch
		require.NoError(t, json.NewDecoder(r.Body).Decode(&b))
		mu.Lock()
		for _, o := range b.Observations {
			seen[o.MAC] = true
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer images.Close()
	s, _, _ := startServer(t, Authoritative, func(c *Config) {
		c.ObservationsURL, c.ObservationsToken = images.URL+"/boot-observations", "observations-token-0123456789"
	})
	require.NotNil(t, s.Handle(discover(t, "52:54:00:aa:00:51", iana.INTEL_X86PC, "udhcp 1.35.0"), 67), "an address for the installed system")
	require.NotNil(t, s.Handle(discover(t, "52:54:00:aa:00:52", iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), 67))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["52:54:00:aa:00:52"]
	}, 10*time.Second, 50*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.False(t, seen["52:54:00:aa:00:51"], "posted in the same batch as the boot client's, had it been observed")
}
