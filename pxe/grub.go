package pxe

import (
	"bytes"
	"context"
	"debug/pe"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"

	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/pxe/internal/tftpd"
)

// GRUBServerPlaceholder stands in agentboot's netboot GRUB (its embedded
// config, stored uncompressed in the EFI image) where the PXE service's
// address goes: the service writes its own address over it, padded with
// spaces, when it loads the image. A proxyDHCP offer's next-server does not
// reach GRUB 2.06 (it reads the firmware's DHCP ACK, which came from the
// site's DHCP server), so GRUB is told where to come back to.
const GRUBServerPlaceholder = "AGENTBOOT_PXE_SERVER_ADDRESS"

// GRUBEarlyConfig is the embedded config of agentboot's netboot GRUB
// (`make pxe-grub` builds it with grub-mkimage). GRUB has configured its
// network from the firmware's PXE state; the config points it at this
// service and enters normal mode, which reads GRUBConfig from the image's
// own memdisk, so that its loop runs even when nothing answers. The
// embedded config runs in GRUB's rescue parser (no loops, no if), so it
// does no more.
const GRUBEarlyConfig = `set agentboot_server=` + GRUBServerPlaceholder + `
set ` + discovery.GRUBRootVariable + `=(tftp,$agentboot_server)/` + discovery.GRUBPathPrefix + `
set prefix=(memdisk)
` + grubGreeting + `normal
`

// grubGreeting is the line each GRUB says once it knows this service.
const grubGreeting = `echo "agentboot: network boot through $agentboot_server, MAC $net_default_mac"
`

// GRUBConfig is the memdisk's grub.cfg: ask the image service, through
// this service, what the host's MAC boots, and ask again every 30 s. Each
// boot decision script ends in boot or exit, or says why the host waits
// and returns.
const GRUBConfig = `while true; do
  source "$` + discovery.GRUBRootVariable + `/boot.grub?mac=$net_default_mac&arch=$grub_cpu"
  echo "agentboot: asking $agentboot_server again in 30 seconds"
  sleep 30
done
`

// grubModules are what GRUBEarlyConfig, GRUBConfig and the boot scripts
// use.
var grubModules = []string{"efinet", "tftp", "net", "normal", "configfile", "linux", "echo", "test", "true", "sleep", "minicmd", "gzio",
	"search", "search_fs_file", "chain", "part_gpt", "part_msdos", "fat", "memdisk", "tar"}

// GRUBModules lists the grub-mkimage modules agentboot's netboot GRUB needs.
func GRUBModules() []string { return append([]string(nil), grubModules...) }

// loadGRUB reads agentboot's netboot GRUB and writes server over its
// placeholder.
func loadGRUB(file string, server netip.Addr) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("pxe: the arm64 boot loader: %w (build it with make pxe-grub)", err)
	}
	if n := bytes.Count(data, []byte(GRUBServerPlaceholder)); n != 1 {
		return nil, fmt.Errorf("pxe: %s is not agentboot's netboot GRUB: it has %d server address placeholders, want 1 (build it with make pxe-grub; a stock GRUB cannot find this service behind a proxyDHCP offer)", file, n)
	}
	// Both configs are stored uncompressed (the embedded one and the
	// memdisk's tar).
	if !bytes.Contains(data, []byte(GRUBEarlyConfig)) || !bytes.Contains(data, []byte(GRUBConfig)) {
		return nil, fmt.Errorf("pxe: %s was built for another agentboot version (its configs differ from this one's): build it again with make pxe-grub", file)
	}
	addr := []byte(server.String())
	if len(addr) > len(GRUBServerPlaceholder) {
		return nil, fmt.Errorf("pxe: server address %s does not fit the GRUB's placeholder", server)
	}
	return bytes.Replace(data, []byte(GRUBServerPlaceholder), append(addr, bytes.Repeat([]byte(" "), len(GRUBServerPlaceholder)-len(addr))...), 1), nil
}

// imageProxy serves the image service's files over TFTP to agentboot's
// netboot GRUB: Debian 12's GRUB 2.06 speaks HTTP only on port 80. Only the
// image service's boot files are reachable, by their path and query
// relative to the boot script URL's directory; files shared by many hosts
// (kernels, an InfraEnv's initrd) are kept for a minute so that a rack
// booting at once fetches each once.
type imageProxy struct {
	log    logr.Logger
	base   *url.URL
	client *http.Client
	// maxBytes bounds one file, cacheBytes all files kept.
	maxBytes, cacheBytes int64

	group singleflight.Group
	// fetching bounds the fetches in flight, and so the memory they hold.
	fetching chan struct{}
	mu       sync.Mutex
	cache    map[string]cachedFile
	held     int64
	now      func() time.Time
}

type cachedFile struct {
	data    []byte
	expires time.Time
}

// proxyTTL is how long a fetched file is kept, and maxFetches how many
// files are fetched at once.
const (
	proxyTTL   = time.Minute
	maxFetches = 4
)

// proxiedPaths are the image service's paths GRUB may fetch, each with the
// query parameters it takes, exactly once each: its boot decision, an
// InfraEnv's files (by token) and the OS images' boot artifacts (public,
// no query).
var proxiedPaths = []struct {
	prefix string
	query  []string
}{
	{"boot.grub", []string{"arch", "mac"}},
	{"images/", []string{"token"}},
	{"boot-artifacts/", nil},
}

func newImageProxy(bootScriptURL string, maxBytes, cacheBytes int64, log logr.Logger) (*imageProxy, error) {
	u, err := url.Parse(bootScriptURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("pxe: boot script URL %q is not a plain http:// URL", bootScriptURL)
	}
	dir := "/"
	if u.Path != "" {
		dir = path.Dir(u.Path)
	}
	base := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: dir}
	if !strings.HasSuffix(base.Path, "/") {
		base.Path += "/"
	}
	return &imageProxy{log: log, base: base, maxBytes: maxBytes, cacheBytes: cacheBytes, cache: map[string]cachedFile{}, now: time.Now,
		fetching: make(chan struct{}, maxFetches),
		client:   &http.Client{Timeout: 5 * time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// relative checks a requested name (below discovery.GRUBPathPrefix) and
// returns the one URL it stands for: its path as written (no escapes) and
// its query re-encoded, so that no file can be fetched, and held, under
// several names.
func (p *imageProxy) relative(rel string) (string, error) {
	for _, c := range rel {
		if c <= ' ' || c > '~' || c == '#' || c == '\\' {
			return "", tftpd.ErrNotFound
		}
	}
	pathPart, rawQuery, hasQuery := strings.Cut(rel, "?")
	if pathPart != path.Clean(pathPart) || strings.ContainsAny(pathPart, "%;") || strings.Contains(pathPart, "..") {
		return "", tftpd.ErrNotFound
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil || (hasQuery && len(query) == 0) {
		return "", tftpd.ErrNotFound
	}
	for _, allowed := range proxiedPaths {
		if !strings.HasPrefix(pathPart, allowed.prefix) || (allowed.prefix == "boot.grub" && pathPart != allowed.prefix) {
			continue
		}
		var names []string
		for k, v := range query {
			if len(v) != 1 || v[0] == "" {
				return "", tftpd.ErrNotFound
			}
			names = append(names, k)
		}
		slices.Sort(names)
		if !slices.Equal(names, allowed.query) {
			return "", tftpd.ErrNotFound
		}
		u := p.base.String() + pathPart
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		if _, err := url.Parse(u); err != nil {
			return "", tftpd.ErrNotFound
		}
		return u, nil
	}
	return "", tftpd.ErrNotFound
}

// get returns the file at rel, from the cache or the image service.
func (p *imageProxy) get(ctx context.Context, rel string) ([]byte, error) {
	u, err := p.relative(rel)
	if err != nil {
		return nil, err
	}
	if data, ok := p.cached(u); ok {
		return data, nil
	}
	// Hosts asking at once share one fetch. ctx is the TFTP server's: it
	// ends only at shutdown.
	ch := p.group.DoChan(u, func() (any, error) {
		select {
		case p.fetching <- struct{}{}:
			defer func() { <-p.fetching }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return p.fetch(ctx, u)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.([]byte), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// cached returns u's content for proxyTTL after it was fetched, never
// longer: a token the image service stopped accepting stops working here
// within that time too. Expired files are dropped.
func (p *imageProxy) cached(u string) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(p.now())
	c, ok := p.cache[u]
	return c.data, ok
}

// expire drops the files whose time is up; p.mu is held.
func (p *imageProxy) expire(now time.Time) {
	for k, c := range p.cache {
		if !now.Before(c.expires) {
			p.held -= int64(len(c.data))
			delete(p.cache, k)
		}
	}
}

func (p *imageProxy) fetch(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, tftpd.ErrNotFound // relative parsed it; never the URL in an error
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// The client sees no addresses; the log has them, but not the
		// query, which carries the InfraEnv's token.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		p.log.Error(err, "fetching a file for GRUB", "path", req.URL.Path)
		return nil, errors.New("image service unreachable")
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, tftpd.ErrNotFound
	case resp.StatusCode != http.StatusOK && strings.HasPrefix(req.URL.Path, p.base.Path+"boot.grub"):
		// A boot decision's error names what was wrong with the request
		// and carries no token: GRUB shows it.
		line, _, _ := strings.Cut(string(readSome(resp.Body, 200)), "\n")
		return nil, fmt.Errorf("image service: %s: %s", resp.Status, strings.TrimSpace(line))
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("image service: %s", resp.Status)
	case resp.ContentLength > p.maxBytes:
		return nil, fmt.Errorf("image service: a file of %s, more than the %s this service proxies", size(resp.ContentLength), size(p.maxBytes))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, p.maxBytes+1))
	if err != nil {
		p.log.Error(err, "reading a file for GRUB", "path", req.URL.Path)
		return nil, errors.New("image service: the download broke off")
	}
	if int64(len(data)) > p.maxBytes {
		return nil, fmt.Errorf("image service: a file of more than the %s this service proxies", size(p.maxBytes))
	}
	if !strings.Contains(resp.Header.Get("Cache-Control"), "no-store") {
		p.keep(u, data)
	}
	return data, nil
}

// keep caches data for proxyTTL while the cache has room.
func (p *imageProxy) keep(u string, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.expire(now)
	if old, ok := p.cache[u]; ok {
		p.held -= int64(len(old.data))
	}
	if p.held+int64(len(data)) > p.cacheBytes {
		delete(p.cache, u)
		return
	}
	p.cache[u] = cachedFile{data: data, expires: now.Add(proxyTTL)}
	p.held += int64(len(data))
}

// readSome is the first n bytes of r, or what there is.
func readSome(r io.Reader, n int64) []byte {
	b, _ := io.ReadAll(io.LimitReader(r, n))
	return b
}

// size says n bytes in MiB when it is that large.
func size(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// The Secure Boot path's TFTP names: what Debian's signed shim loads next
// (grubx64.efi, beside itself) and where Debian's signed network GRUB,
// whose built-in prefix is /grub, reads its config.
const (
	SignedShimName = "shimx64.efi"
	SignedGRUBName = "grubx64.efi"
	SignedGRUBCfg  = "grub/grub.cfg"
)

// signedGRUBConfig is grub/grub.cfg for Debian's signed network GRUB: the
// netboot GRUB's two configs in one, with this server's address, since
// the signed binary cannot carry it.
func signedGRUBConfig(server netip.Addr) []byte {
	return []byte("set agentboot_server=" + server.String() + "\nset " + discovery.GRUBRootVariable + "=(tftp,$agentboot_server)/" +
		discovery.GRUBPathPrefix + "\n" + grubGreeting + GRUBConfig)
}

// loadSignedChain reads the shim and GRUB of the Secure Boot path and
// refuses binaries without an Authenticode signature: firmware with
// Secure Boot on would refuse them, and the host would boot nothing.
func loadSignedChain(cfg Config) (map[string][]byte, error) {
	out := map[string][]byte{SignedGRUBCfg: signedGRUBConfig(cfg.ServerIP)}
	for _, f := range []struct{ name, path, pkg string }{
		{SignedShimName, cfg.ShimBinary, "shim-signed"},
		{SignedGRUBName, cfg.SignedGRUBBinary, "grub-efi-amd64-signed"},
	} {
		if f.path == "" {
			return nil, fmt.Errorf("pxe: Secure Boot: no file for %s (Debian package %s)", f.name, f.pkg)
		}
		data, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("pxe: Secure Boot: %w (Debian package %s)", err, f.pkg)
		}
		if err := checkSigned(data); err != nil {
			return nil, fmt.Errorf("pxe: Secure Boot: %s: %v: firmware with Secure Boot on would refuse it", f.path, err)
		}
		out[f.name] = data
	}
	return out, nil
}

// checkSigned says whether data is an x86-64 EFI application with an
// Authenticode signature (a certificate table), without judging whose.
func checkSigned(data []byte) error {
	f, err := pe.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an EFI application: %v", err)
	}
	defer f.Close()
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok || f.Machine != pe.IMAGE_FILE_MACHINE_AMD64 {
		return errors.New("not an x86-64 EFI application")
	}
	if len(oh.DataDirectory) <= pe.IMAGE_DIRECTORY_ENTRY_SECURITY || oh.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size == 0 {
		return errors.New("not signed")
	}
	return nil
}
