package osimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentboot/agentboot/internal/atomicfile"
	"github.com/agentboot/agentboot/internal/filehash"
	"github.com/agentboot/agentboot/internal/liveiso"
)

// download tracks one source URL (several catalog keys may share it): a
// live ISO, or with disk set an OS disk image (then entry's URL and SHA256
// are the disk image's).
type download struct {
	entry Entry
	disk  bool

	mu       sync.Mutex
	state    State
	progress string
	err      error
	image    *Image
}

func (d *download) status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Status{State: d.state, Progress: d.progress, Err: d.err, Image: d.image}
}

func (d *download) set(state State, progress string, err error, img *Image) {
	d.mu.Lock()
	d.state, d.progress, d.err = state, progress, err
	if img != nil {
		d.image = img
	}
	d.mu.Unlock()
}

// keep makes the image ready and retries with capped, jittered backoff
// until it is, or ctx ends.
func (c *Catalog) keep(ctx context.Context, d *download) {
	delay := c.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		img, err := c.fetch(ctx, d)
		if err == nil {
			d.set(Ready, "", nil, img)
			c.notify(d.entry.URL)
			if d.disk {
				return
			}
			// Minimal ISOs are made ahead of the first request for one.
			if min, err := img.Minimal(); err != nil {
				c.cfg.Log.Error(err, "minimal ISOs unavailable for this image", "version", d.entry.Version, "arch", d.entry.CPUArchitecture)
			} else {
				c.cfg.Log.Info("minimal ISO ready", "version", d.entry.Version, "arch", d.entry.CPUArchitecture, "sha256", min.SHA256)
			}
			c.notify(d.entry.URL)
			return
		}
		if ctx.Err() != nil {
			return
		}
		wait := delay/2 + rand.N(delay/2+1)
		c.cfg.Log.Error(err, "OS image unavailable; retrying", "url", redactURL(d.entry.URL), "attempt", attempt, "retryIn", wait.Round(time.Second).String())
		d.set(Failed, "", err, nil)
		c.notify(d.entry.URL)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		delay = min(delay*2, c.cfg.RetryMax)
	}
}

// cacheMeta is written next to a cached image.
type cacheMeta struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

func (c *Catalog) dirFor(u string) string {
	sum := sha256.Sum256([]byte(u))
	return filepath.Join(c.cfg.CacheDir, "images", hex.EncodeToString(sum[:8]))
}

// fetch returns the image from the cache, downloading it first if needed.
func (c *Catalog) fetch(ctx context.Context, d *download) (*Image, error) {
	e := d.entry
	dir := c.dirFor(e.URL)
	isoPath := filepath.Join(dir, "live.iso")
	open, what := openImage, "OS image"
	if d.disk {
		isoPath, open, what = filepath.Join(dir, "disk.img"), openDisk, "OS disk image"
	}
	metaPath := filepath.Join(dir, "meta.json")
	if meta, ok := readMeta(metaPath); ok && meta.URL == e.URL && (e.SHA256 == "" || strings.EqualFold(meta.SHA256, e.SHA256)) {
		if err := verifyCached(isoPath, meta); err != nil {
			c.cfg.Log.Info(what+" in the cache is not usable: downloading it again", "version", e.Version, "arch", e.CPUArchitecture, "path", isoPath, "reason", err.Error())
		} else if img, err := open(isoPath, meta, dir); err == nil {
			c.cfg.Log.Info(what+" ready (cached, sha256 verified)", "version", e.Version, "arch", e.CPUArchitecture, "path", isoPath)
			return img, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d.set(Downloading, "starting", nil, nil)
	c.notify(e.URL)
	meta, err := c.downloadTo(ctx, d, isoPath)
	if err != nil {
		return nil, err
	}
	if err := writeJSONAtomic(metaPath, meta); err != nil {
		return nil, err
	}
	if d.disk {
		img, err := openDisk(isoPath, meta, dir)
		if err != nil {
			return nil, err
		}
		c.cfg.Log.Info("OS disk image ready", "version", e.Version, "arch", e.CPUArchitecture, "sha256", meta.SHA256)
		return img, nil
	}
	img, err := openImage(isoPath, meta, dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not a usable live ISO: %w", redactURL(e.URL), err)
	}
	c.cfg.Log.Info("OS image ready", "version", e.Version, "arch", e.CPUArchitecture, "volumeID", img.Layout.VolumeID, "sha256", meta.SHA256)
	return img, nil
}

func readMeta(p string) (cacheMeta, bool) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return cacheMeta{}, false
	}
	var m cacheMeta
	if json.Unmarshal(raw, &m) != nil || m.SHA256 == "" {
		return cacheMeta{}, false
	}
	return m, true
}

// open returns the source as a stream with its size (-1 when unknown).
func (c *Catalog) open(ctx context.Context, src string) (io.ReadCloser, int64, error) {
	u, err := url.Parse(src)
	if err != nil {
		return nil, 0, fmt.Errorf("image URL: %w", err)
	}
	switch u.Scheme {
	case "", "file":
		p := u.Path
		if u.Scheme == "" {
			p = src
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, st.Size(), nil
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
		if err != nil {
			return nil, 0, err
		}
		resp, err := c.cfg.Client.Do(req)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				// url.Error repeats the URL, query string (token) included.
				return nil, 0, fmt.Errorf("GET %s: %w", redactURL(src), ue.Err)
			}
			return nil, 0, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("GET %s: %s", redactURL(src), resp.Status)
		}
		return resp.Body, resp.ContentLength, nil
	default:
		return nil, 0, fmt.Errorf("image URL scheme %q is not supported (http, https, file)", u.Scheme)
	}
}

// downloadTo streams the source into a temporary file next to dst while
// hashing it, checks the digest, and renames it into place.
func (c *Catalog) downloadTo(ctx context.Context, d *download, dst string) (cacheMeta, error) {
	e := d.entry
	body, size, err := c.open(ctx, e.URL)
	if err != nil {
		return cacheMeta{}, err
	}
	defer body.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".download-*")
	if err != nil {
		return cacheMeta{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	pr := &progressReader{r: body, total: size, log: func(p string) {
		d.set(Downloading, p, nil, nil)
		c.cfg.Log.Info("downloading OS image", "version", e.Version, "arch", e.CPUArchitecture, "progress", p)
	}}
	n, err := io.Copy(io.MultiWriter(tmp, h), &ctxReader{ctx: ctx, r: pr})
	if err != nil {
		return cacheMeta{}, fmt.Errorf("download %s: failed after %d bytes: %w", redactURL(e.URL), n, err)
	}
	if size >= 0 && n != size {
		return cacheMeta{}, fmt.Errorf("download %s: got %d of %d bytes", redactURL(e.URL), n, size)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if e.SHA256 != "" && !strings.EqualFold(sum, e.SHA256) {
		return cacheMeta{}, fmt.Errorf("download %s: sha256 %s does not match the expected %s", redactURL(e.URL), sum, e.SHA256)
	}
	if err := tmp.Sync(); err != nil {
		return cacheMeta{}, err
	}
	if err := tmp.Close(); err != nil {
		return cacheMeta{}, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return cacheMeta{}, err
	}
	return cacheMeta{URL: e.URL, SHA256: sum, Size: n}, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// progressReader reports progress every 10 seconds or 10 percent.
type progressReader struct {
	r           io.Reader
	total, done int64
	lastPct     int64
	lastTime    time.Time
	log         func(string)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	now := time.Now()
	if p.lastTime.IsZero() {
		p.lastTime = now
	}
	pct := int64(-1)
	if p.total > 0 {
		pct = p.done * 100 / p.total
	}
	if now.Sub(p.lastTime) >= 10*time.Second || (pct >= 0 && pct/10 > p.lastPct/10) {
		p.lastTime, p.lastPct = now, pct
		if pct >= 0 {
			p.log(fmt.Sprintf("%d%% (%d of %d MiB)", pct, p.done>>20, p.total>>20))
		} else {
			p.log(fmt.Sprintf("%d MiB", p.done>>20))
		}
	}
	return n, err
}

func writeJSONAtomic(p string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(p, data, 0o644)
}

// lockFile takes an exclusive lock on p, creating it, and waits for it
// as long as another process or catalog holds it.
func lockFile(p string) (unlock func(), err error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// redactURL drops credentials and query strings from URLs in logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "…"
	}
	return u.String()
}

// Image is a cached, inspected live ISO, or a cached OS disk image (then
// Layout is nil).
type Image struct {
	// ID identifies the content: the first 16 hex digits of its sha256.
	ID     string
	SHA256 string
	Path   string
	Size   int64
	Layout *liveiso.Layout
	file   *os.File
	dir    string

	minimalOnce sync.Once
	minimalDone chan struct{}
	minimal     *Image
	minimalErr  error
}

// verifyCached hashes a file found in the cache and compares it with the
// digest recorded when it was written: the cache is a volume that outlives
// the process (an emptyDir across container restarts), and a process
// killed, a disk that failed or a hand that edited it may have left it
// other than it was. It costs one read of the file per process start.
func verifyCached(p string, meta cacheMeta) error {
	sum, n, err := filehash.SHA256(p)
	if err != nil {
		return err
	}
	if n != meta.Size {
		return fmt.Errorf("cached image is %d bytes, %d were recorded", n, meta.Size)
	}
	if !strings.EqualFold(sum, meta.SHA256) {
		return fmt.Errorf("cached image's sha256 is %s, %s was recorded", sum, meta.SHA256)
	}
	return nil
}

// openCached opens a cached file, checking it is as large as recorded.
func openCached(p string, meta cacheMeta) (*os.File, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() != meta.Size {
		f.Close()
		return nil, fmt.Errorf("cached image is %d bytes, expected %d", st.Size(), meta.Size)
	}
	return f, nil
}

func openImage(p string, meta cacheMeta, dir string) (*Image, error) {
	f, err := openCached(p, meta)
	if err != nil {
		return nil, err
	}
	l, err := liveiso.Inspect(f, meta.Size)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Image{ID: meta.SHA256[:16], SHA256: meta.SHA256, Path: p, Size: meta.Size, Layout: l, file: f, dir: dir, minimalDone: make(chan struct{})}, nil
}

// openDisk opens a cached disk image; its content is the agent's to check.
func openDisk(p string, meta cacheMeta, dir string) (*Image, error) {
	f, err := openCached(p, meta)
	if err != nil {
		return nil, err
	}
	return &Image{ID: meta.SHA256[:16], SHA256: meta.SHA256, Path: p, Size: meta.Size, file: f, dir: dir, minimalDone: make(chan struct{})}, nil
}

// ReaderAt reads the image; it is safe for concurrent use.
func (i *Image) ReaderAt() io.ReaderAt { return i.file }

// File is the open image file, for callers that can send it without copying.
func (i *Image) File() *os.File { return i.file }

// ErrNoMinimal is returned when a minimal ISO cannot be made.
var ErrNoMinimal = errors.New("cannot make a minimal ISO")

// Minimal returns this image without its root filesystem, made once (with
// xorriso, keeping the BIOS and UEFI boot setup) and cached next to it.
func (i *Image) Minimal() (*Image, error) {
	i.minimalOnce.Do(func() {
		i.minimal, i.minimalErr = i.makeMinimal()
		close(i.minimalDone)
	})
	return i.minimal, i.minimalErr
}

// MinimalIfReady is Minimal without waiting: ready is false while the
// minimal ISO is still being made.
func (i *Image) MinimalIfReady() (img *Image, err error, ready bool) {
	select {
	case <-i.minimalDone:
		return i.minimal, i.minimalErr, true
	default:
		return nil, nil, false
	}
}

func (i *Image) makeMinimal() (*Image, error) {
	if i.Layout.Rootfs.Length == 0 {
		return i, nil // already minimal
	}
	p := filepath.Join(i.dir, "minimal.iso")
	metaPath := filepath.Join(i.dir, "minimal.json")
	// Another catalog on the same cache (a second process, or a restart
	// overlapping the old one) may be making the same minimal ISO: one
	// makes it, the others wait and then use it.
	unlock, err := lockFile(filepath.Join(i.dir, ".minimal.lock"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoMinimal, err)
	}
	defer unlock()
	if meta, ok := readMeta(metaPath); ok && meta.URL == i.SHA256 && verifyCached(p, meta) == nil {
		if img, err := openImage(p, meta, i.dir); err == nil {
			return img, nil
		}
	}
	meta, err := makeMinimalISO(i.Path, p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoMinimal, err)
	}
	meta.URL = i.SHA256 // the source this minimal ISO derives from
	if err := writeJSONAtomic(metaPath, meta); err != nil {
		return nil, err
	}
	return openImage(p, meta, i.dir)
}
