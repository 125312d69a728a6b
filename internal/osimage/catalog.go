// Package osimage is the catalog of discovery OS images: it learns which
// live ISOs exist (configured entries and CoreOS stream metadata), downloads
// each one once into a cache on disk (sha256-verified when the source gives a
// digest, renamed into place atomically), inspects its live-ISO layout, and
// reports per image whether it is ready, still downloading or failed, retrying
// failures with backoff. Every InfraEnv of the same architecture and version
// shares one cached image; nothing here is per host or per InfraEnv.
package osimage

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Entry is one OS image of the catalog.
type Entry struct {
	// Version identifies the image; InfraEnvs choose it with osImageVersion.
	Version string `json:"version"`
	// CPUArchitecture is x86_64, aarch64, ppc64le or s390x.
	CPUArchitecture string `json:"cpuArchitecture"`
	// URL of the live ISO: http(s)://, file:// or an absolute path.
	URL string `json:"url"`
	// SHA256 of the ISO, when known; the download is checked against it.
	SHA256 string `json:"sha256,omitempty"`
	// DiskURL is the OS disk image hosts install (raw, raw.gz or raw.xz:
	// the agent tells them apart by their first bytes), with its sha256.
	// Optional: without it, hosts of this image discover but cannot be
	// installed.
	DiskURL    string `json:"diskURL,omitempty"`
	DiskSHA256 string `json:"diskSHA256,omitempty"`
}

// Key names an image by architecture and version.
type Key struct {
	Arch, Version string
}

func (k Key) String() string { return k.Arch + "/" + k.Version }

// NormalizeArch maps the names InfraEnvs accept to the catalog's.
func NormalizeArch(a string) string {
	switch a {
	case "", "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return a
}

// Config configures a Catalog.
type Config struct {
	// Images are entries given directly.
	Images []Entry
	// Streams are CoreOS stream metadata URLs (http(s)://, file:// or a
	// path); their x86_64 and aarch64 live ISOs join the catalog.
	Streams []string
	// CacheDir holds downloaded images.
	CacheDir string
	// Client downloads; nil means a client with sane timeouts.
	Client *http.Client
	// RetryMin and RetryMax bound the backoff between failed attempts.
	RetryMin, RetryMax time.Duration
	// StreamRefresh is how often stream metadata is read again.
	StreamRefresh time.Duration
	Log           logr.Logger
}

// State of an image.
type State int

// Image states.
const (
	Pending State = iota
	Downloading
	Ready
	Failed
)

// Status is what the catalog knows about one image now.
type Status struct {
	State State
	// Progress is a human-readable download progress.
	Progress string
	// Err is the last failure, for Failed.
	Err error
	// Image is set when Ready.
	Image *Image
}

// ErrUnknownImage is returned by Resolve for an architecture or version the
// catalog does not have; its message lists what exists.
var ErrUnknownImage = errors.New("no such OS image")

// Catalog knows and fetches OS images. It is safe for concurrent use.
type Catalog struct {
	cfg Config

	mu      sync.Mutex
	entries map[Key]Entry
	images  map[string]*download // by URL
	subs    []chan Key
	wake    chan struct{}
}

// New validates cfg; downloads begin with Start.
func New(cfg Config) (*Catalog, error) {
	if cfg.CacheDir == "" {
		return nil, errors.New("osimage: CacheDir is required")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			ResponseHeaderTimeout: 30 * time.Second,
			IdleConnTimeout:       90 * time.Second,
		}}
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = 10 * time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 5 * time.Minute
	}
	if cfg.StreamRefresh == 0 {
		cfg.StreamRefresh = 6 * time.Hour
	}
	c := &Catalog{cfg: cfg, entries: map[Key]Entry{}, images: map[string]*download{}, wake: make(chan struct{}, 1)}
	for _, e := range cfg.Images {
		if err := c.add(e); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Catalog) add(e Entry) error {
	e.CPUArchitecture = NormalizeArch(e.CPUArchitecture)
	if e.Version == "" || e.URL == "" {
		return fmt.Errorf("osimage: entry %+v needs version and url", e)
	}
	switch e.CPUArchitecture {
	case "x86_64", "aarch64", "ppc64le", "s390x":
	default:
		return fmt.Errorf("osimage: entry %s: unknown cpuArchitecture %q", e.Version, e.CPUArchitecture)
	}
	if e.SHA256 != "" && len(e.SHA256) != 64 {
		return fmt.Errorf("osimage: entry %s: sha256 must be 64 hex digits", e.Version)
	}
	if e.DiskSHA256 != "" && len(e.DiskSHA256) != 64 {
		return fmt.Errorf("osimage: entry %s: diskSHA256 must be 64 hex digits", e.Version)
	}
	if e.DiskSHA256 != "" && e.DiskURL == "" {
		return fmt.Errorf("osimage: entry %s: diskSHA256 without diskURL", e.Version)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := Key{e.CPUArchitecture, e.Version}
	if old, ok := c.entries[k]; ok && old.URL != e.URL {
		c.cfg.Log.Info("OS image replaced", "image", k.String(), "url", redactURL(e.URL))
	}
	c.entries[k] = e
	c.track(e, false)
	if e.DiskURL != "" {
		c.track(Entry{Version: e.Version, CPUArchitecture: e.CPUArchitecture, URL: e.DiskURL, SHA256: e.DiskSHA256}, true)
	}
	return nil
}

// track adds a download for e.URL unless there is one (taking a digest
// learnt later). Call with c.mu held.
func (c *Catalog) track(e Entry, disk bool) {
	if d, ok := c.images[e.URL]; !ok {
		c.images[e.URL] = &download{entry: e, disk: disk}
	} else if e.SHA256 != "" {
		d.entry.SHA256 = e.SHA256
	}
}

// Resolve picks the image for an architecture and version; an empty version
// picks the newest of the architecture.
func (c *Catalog) Resolve(arch, version string) (Key, error) {
	arch = NormalizeArch(arch)
	c.mu.Lock()
	defer c.mu.Unlock()
	var versions []string
	for k := range c.entries {
		if k.Arch == arch {
			versions = append(versions, k.Version)
		}
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[i], versions[j]) })
	if version == "" && len(versions) > 0 {
		return Key{arch, versions[len(versions)-1]}, nil
	}
	for _, v := range versions {
		if v == version {
			return Key{arch, v}, nil
		}
	}
	if len(versions) == 0 {
		return Key{}, fmt.Errorf("%w for architecture %s; the catalog has: %s", ErrUnknownImage, arch, c.describeLocked())
	}
	return Key{}, fmt.Errorf("%w: version %q for %s; available: %s", ErrUnknownImage, version, arch, strings.Join(versions, ", "))
}

func (c *Catalog) describeLocked() string {
	var all []string
	for k := range c.entries {
		all = append(all, k.String())
	}
	if len(all) == 0 {
		return "nothing (configure OS images or streams)"
	}
	sort.Strings(all)
	return strings.Join(all, ", ")
}

// Status reports the state of the image for k.
func (c *Catalog) Status(k Key) Status {
	c.mu.Lock()
	e, ok := c.entries[k]
	var d *download
	if ok {
		d = c.images[e.URL]
	}
	c.mu.Unlock()
	if d == nil {
		return Status{State: Failed, Err: fmt.Errorf("%w: %s", ErrUnknownImage, k)}
	}
	return d.status()
}

// ErrNoDiskImage is returned by DiskStatus for an OS image whose catalog
// entry has no disk image.
var ErrNoDiskImage = errors.New("no OS disk image")

// DiskStatus reports the state of the disk image hosts of k install.
func (c *Catalog) DiskStatus(k Key) Status {
	c.mu.Lock()
	e, ok := c.entries[k]
	var d *download
	if ok && e.DiskURL != "" {
		d = c.images[e.DiskURL]
	}
	c.mu.Unlock()
	switch {
	case !ok:
		return Status{State: Failed, Err: fmt.Errorf("%w: %s", ErrUnknownImage, k)}
	case d == nil:
		return Status{State: Failed, Err: fmt.Errorf("%w for OS image %s: give its catalog entry a diskURL, or its stream a metal raw, raw.gz or raw.xz format", ErrNoDiskImage, k)}
	}
	return d.status()
}

// Subscribe returns a channel that receives the key of every image whose
// status changes. The channel is buffered; a slow reader misses nothing that
// matters because it can always read Status.
func (c *Catalog) Subscribe() <-chan Key {
	ch := make(chan Key, 256)
	c.mu.Lock()
	c.subs = append(c.subs, ch)
	c.mu.Unlock()
	return ch
}

func (c *Catalog) notify(url string) {
	c.mu.Lock()
	var keys []Key
	for k, e := range c.entries {
		if e.URL == url || e.DiskURL == url {
			keys = append(keys, k)
		}
	}
	subs := append([]chan Key(nil), c.subs...)
	c.mu.Unlock()
	for _, k := range keys {
		for _, s := range subs {
			select {
			case s <- k:
			default:
			}
		}
	}
}

// versionLess orders versions by their numeric parts, so "4.10" follows "4.9".
func versionLess(a, b string) bool {
	pa, pb := splitVersion(a), splitVersion(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] != pb[i] {
			na, ea := atoi(pa[i])
			nb, eb := atoi(pb[i])
			if ea && eb && na != nb {
				return na < nb
			}
			return pa[i] < pb[i]
		}
	}
	return len(pa) < len(pb)
}

func splitVersion(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == '.' || r == '-' || r == '+' || r == '_' })
}

func atoi(s string) (int, bool) {
	n := 0
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
		n = n*10 + int(r-'0')
	}
	return n, true
}

// Start reads the streams and downloads every image, retrying failures, until
// ctx ends. It is a controller-runtime Runnable.
func (c *Catalog) Start(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(c.cfg.CacheDir, "images"), 0o755); err != nil {
		return fmt.Errorf("OS image cache %s: %w", c.cfg.CacheDir, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if len(c.cfg.Streams) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watchStreams(ctx)
		}()
	}
	started := map[string]bool{}
	for {
		c.mu.Lock()
		var fresh []*download
		for url, d := range c.images {
			if !started[url] {
				started[url] = true
				fresh = append(fresh, d)
			}
		}
		c.mu.Unlock()
		for _, d := range fresh {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.keep(ctx, d)
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		}
	}
}

// NeedLeaderElection is false: every replica needs its own cache.
func (c *Catalog) NeedLeaderElection() bool { return false }
