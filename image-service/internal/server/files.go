package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/diskboot"
	"github.com/agentboot/agentboot/internal/gate"
	"github.com/agentboot/agentboot/internal/initramfs"
	"github.com/agentboot/agentboot/internal/nmstate"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/overlay"
	"github.com/agentboot/agentboot/internal/signing"
)

func readerAtSeeker(f *os.File) io.ReadSeeker {
	st, err := f.Stat()
	if err != nil {
		return io.NewSectionReader(f, 0, 0)
	}
	return io.NewSectionReader(f, 0, st.Size())
}

// renderCache keeps recent renderings: virtual media and resumed downloads
// send many range requests for the same content.
type renderCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]renderEntry
}

type renderEntry struct {
	out  *discovery.Output
	img  *osimage.Image
	used time.Time
}

func newRenderCache(max int) *renderCache {
	return &renderCache{max: max, entries: map[string]renderEntry{}}
}

func (c *renderCache) get(k string) (renderEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if ok {
		e.used = time.Now()
		c.entries[k] = e
	}
	return e, ok
}

func (c *renderCache) put(k string, e renderEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		var oldest string
		for key, v := range c.entries {
			if oldest == "" || v.used.Before(c.entries[oldest].used) {
				oldest = key
			}
		}
		delete(c.entries, oldest)
	}
	e.used = time.Now()
	c.entries[k] = e
}

// render returns the InfraEnv's current content, from the cache when nothing
// it depends on changed.
func (h *Handler) render(ctx context.Context, ie *v1beta1.InfraEnv, key signing.Key) (*discovery.Output, *osimage.Image, error) {
	k, err := h.opts.Catalog.Resolve(ie.Spec.CPUArchitecture, ie.Spec.OSImageVersion)
	if err != nil {
		return nil, nil, errUnprocessable{msg: err.Error()}
	}
	st := h.opts.Catalog.Status(k)
	if st.State != osimage.Ready {
		return nil, nil, errNotReady{msg: fmt.Sprintf("OS image %s is not ready yet", k)}
	}
	nm, err := nmstate.Select(ctx, h.opts.Reader, ie)
	if err != nil {
		return nil, nil, err
	}
	cacheKey := strings.Join([]string{string(ie.UID), fmt.Sprint(ie.Generation), ie.Annotations[signing.RotateAnnotation], nmstate.Fingerprint(nm), st.Image.ID, key.Token(signing.PurposeImage, "render-cache", "")}, "|")
	if e, ok := h.renders.get(cacheKey); ok {
		return e.out, e.img, nil
	}
	out, err := discovery.Render(discovery.Input{InfraEnv: ie, NMStateConfigs: nm, Image: st.Image, ImageKey: k, Key: key}, h.opts.Settings)
	if err != nil {
		return nil, nil, err
	}
	h.renders.put(cacheKey, renderEntry{out: out, img: st.Image})
	return out, st.Image, nil
}

// withBootProof is out with a BareMetalHost's boot proof, cached as
// renderings are: the BMC reads the ISO in many ranges.
func (h *Handler) withBootProof(out *discovery.Output, img *osimage.Image, p agentwire.BootProof) (*discovery.Output, error) {
	key := strings.Join([]string{"boot-proof", out.Version, img.ID, p.BareMetalHost, p.Proof}, "|")
	if e, ok := h.renders.get(key); ok {
		return e.out, nil
	}
	proved, err := out.WithBootProof(p, img.Layout.Ignition.Length)
	if err != nil {
		return nil, err
	}
	h.renders.put(key, renderEntry{out: proved, img: img})
	return proved, nil
}

// serveFile sends one file of the rendered content.
func (h *Handler) serveFile(w http.ResponseWriter, r *http.Request, req imageRequest, ie *v1beta1.InfraEnv, out *discovery.Output, img *osimage.Image) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "private, no-transform")
	etag := out.Version + "-" + req.file
	if p := req.bootProof; p != nil {
		// One BareMetalHost's ISO is not another's.
		sum := sha256.Sum256([]byte(p.BareMetalHost + "\x00" + p.Proof))
		etag += "-" + hex.EncodeToString(sum[:6])
	}
	hdr.Set("ETag", `"`+etag+`"`)
	modTime := contentTime(ie, out)

	switch req.file {
	case discovery.FileIPXE:
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
		http.ServeContent(w, r, "", modTime, strings.NewReader(h.ipxeScript(r.Context(), ie, out, req.mac)))
		return
	case discovery.FileIgnition:
		hdr.Set("Content-Type", "application/vnd.coreos.ignition+json")
		http.ServeContent(w, r, "", modTime, strings.NewReader(string(out.Ignition)))
		return
	}

	release, ok := h.acquire(w, r, h.slots, string(ie.UID))
	if !ok {
		return
	}
	defer release()

	if req.bootProof != nil {
		// Rendered within the download's slot: made-up proofs cost the
		// client its slots, not the service unbounded work. Checked by
		// the agent API when the host registers; the image service holds
		// no key to check it with.
		var err error
		if out, err = h.withBootProof(out, img, *req.bootProof); err != nil {
			h.fail(w, err)
			return
		}
	}
	content, name, err := h.content(req.file, out, img)
	if err != nil {
		h.fail(w, err)
		return
	}
	hdr.Set("Content-Type", "application/octet-stream")
	if strings.HasSuffix(name, ".iso") {
		hdr.Set("Content-Type", "application/x-iso9660-image")
		hdr.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s-%s"`, ie.Name, name))
	}
	serveStream(w, r, modTime, content, h.opts.StallTimeout)
}

// serveStream is http.ServeContent (ranges, conditionals, HEAD) with the
// body written by Stream.WriteRange, so the base image goes out with
// sendfile on plain HTTP.
func serveStream(w http.ResponseWriter, r *http.Request, modTime time.Time, s *overlay.Stream, stall time.Duration) {
	http.ServeContent(&streamWriter{ResponseWriter: w, stream: s, stall: stall, start: time.Now()}, r, "", modTime, s)
}

type streamWriter struct {
	http.ResponseWriter
	stream *overlay.Stream
	stall  time.Duration
	start  time.Time // when the download began: its floor rises with time
}

// ReadFrom is what io.CopyN in http.ServeContent calls with the stream,
// positioned at the start of the range and limited to its length.
func (sw *streamWriter) ReadFrom(src io.Reader) (int64, error) {
	lr, ok := src.(*io.LimitedReader)
	if !ok || lr.R != io.Reader(sw.stream) {
		// Multipart ranges: every write gets the stall deadline.
		return io.Copy(stallWriter{w: sw.ResponseWriter, stall: sw.stall, start: sw.start, pending: new(int64)}, src)
	}
	pos, err := sw.stream.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	// In chunks, each with its own write deadline: a client must take a
	// chunk (floorChunk) per StallTimeout or lose the connection and its
	// slot; a steady one is never cut, however long the file.
	rc := http.NewResponseController(sw.ResponseWriter)
	want := min(lr.N, sw.stream.Size()-pos)
	var total int64
	for total < want {
		if sw.stall > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(sw.stall))
		}
		n, err := sw.stream.WriteRange(sw.ResponseWriter, pos+total, min(floorChunk(time.Since(sw.start)), want-total))
		total += n
		if err != nil {
			lr.N -= total
			_, _ = sw.stream.Seek(total, io.SeekCurrent)
			return total, err
		}
	}
	_ = rc.SetWriteDeadline(time.Time{})
	lr.N -= total
	_, _ = sw.stream.Seek(total, io.SeekCurrent)
	return total, nil
}

// stallChunk is how much of a download a client must take per
// StallTimeout at first: 4 MiB a minute (70 KB/s) by default.
const stallChunk = 4 << 20

// floorDoubling is how long a download lasts before its floor doubles.
const floorDoubling = 10 * time.Minute

// floorChunk is how much a client must take per StallTimeout elapsed into
// its download: stallChunk, doubling every floorDoubling up to four times
// that (16 MiB a minute, 280 KB/s, from the 20th minute on). A slot held
// for hours must move ever more bytes to stay held; a client slower than
// that on a file that large loses its connection and resumes with a range.
func floorChunk(elapsed time.Duration) int64 {
	return int64(stallChunk) << min(max(elapsed/floorDoubling, 0), 2)
}

// writerOnly hides ReadFrom, so io.Copy does not recurse.
type writerOnly struct{ io.Writer }

// stallWriter holds a client to floorChunk bytes per stall, as the chunked
// path does: the deadline moves on only once that much was written. It
// hides ReadFrom, so io.Copy does not recurse.
type stallWriter struct {
	w       http.ResponseWriter
	stall   time.Duration
	start   time.Time
	pending *int64 // bytes written since the deadline last moved
}

func (s stallWriter) Write(p []byte) (int, error) {
	if s.stall > 0 && (*s.pending == 0 || *s.pending >= floorChunk(time.Since(s.start))) {
		_ = http.NewResponseController(s.w).SetWriteDeadline(time.Now().Add(s.stall))
		*s.pending = 0
	}
	n, err := s.w.Write(p)
	*s.pending += int64(n)
	return n, err
}

// content builds the stream of a large file without copying the base image.
func (h *Handler) content(file string, out *discovery.Output, img *osimage.Image) (*overlay.Stream, string, error) {
	l := img.Layout
	switch file {
	case discovery.FileInitrd:
		base := l.Initrd
		pad := (4 - base.Length%4) % 4
		return overlay.Concat(
			overlay.FileSection(img.Path, img.ReaderAt(), base.Offset, base.Length),
			overlay.Zeros(pad),
			overlay.Bytes(initramfs.Pad4(append([]byte(nil), out.Archive...))),
		), file, nil
	}
	minimal := file == discovery.FileMinimalISO || (file == discovery.FileISO && out.ImageType == v1beta1.ImageTypeMinimalISO)
	kargs, base, name := out.FullKargs, img, "discovery.iso"
	if minimal {
		m, err := img.Minimal()
		if err != nil {
			return nil, "", err
		}
		kargs, base, name = out.MinimalKargs, m, "discovery-minimal.iso"
	}
	patches, err := base.Layout.Patches(out.Archive, kargs)
	if err != nil {
		return nil, "", err
	}
	s, err := overlay.New(overlay.FileSection(base.Path, base.ReaderAt(), 0, base.Layout.Size), patches...)
	return s, name, err
}

// serveArtifact serves a file of an OS image itself: the same for every
// InfraEnv, public, and cacheable by anyone.
func (h *Handler) serveArtifact(w http.ResponseWriter, r *http.Request) {
	arch, version, file := r.PathValue("arch"), r.PathValue("version"), r.PathValue("file")
	if file != discovery.FileKernel && file != discovery.FileRootfs && file != discovery.FileDisk {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if !artifactPart.MatchString(arch) || !artifactPart.MatchString(version) || r.URL.RawQuery != "" {
		http.Error(w, "malformed boot artifact request", http.StatusBadRequest)
		return
	}
	k, err := h.opts.Catalog.Resolve(arch, version)
	if err != nil || k.Arch != osimage.NormalizeArch(arch) || k.Version != version {
		msg := "unsupported architecture or version"
		if err != nil {
			msg = err.Error()
		}
		http.Error(w, msg, http.StatusBadRequest)
		return
	}
	if file == discovery.FileDisk {
		h.serveDisk(w, r, k)
		return
	}
	st := h.opts.Catalog.Status(k)
	if st.State != osimage.Ready {
		retryLater(w, fmt.Sprintf("OS image %s is not ready yet", k))
		return
	}
	area := st.Image.Layout.Kernel
	if file == discovery.FileRootfs {
		area = st.Image.Layout.Rootfs
	}
	if area.Length == 0 {
		http.Error(w, "this OS image has no "+file, http.StatusNotFound)
		return
	}
	release, ok := h.acquire(w, r, h.publicSlots, "")
	if !ok {
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", fmt.Sprintf(`"%s-%s"`, st.Image.ID, file))
	w.Header().Set("Cache-Control", "public, max-age=86400")
	serveStream(w, r, time.Time{}, overlay.Concat(overlay.FileSection(st.Image.Path, st.Image.ReaderAt(), area.Offset, area.Length)), h.opts.StallTimeout)
}

// serveDisk serves the OS disk image of k as the catalog cached it.
func (h *Handler) serveDisk(w http.ResponseWriter, r *http.Request, k osimage.Key) {
	st := h.opts.Catalog.DiskStatus(k)
	switch {
	case errors.Is(st.Err, osimage.ErrNoDiskImage):
		http.Error(w, st.Err.Error(), http.StatusNotFound)
		return
	case st.State != osimage.Ready:
		retryLater(w, fmt.Sprintf("the disk image of OS image %s is not ready yet", k))
		return
	}
	release, ok := h.acquire(w, r, h.publicSlots, "")
	if !ok {
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", fmt.Sprintf(`"%s-disk"`, st.Image.ID))
	w.Header().Set("Cache-Control", "public, max-age=86400")
	serveStream(w, r, time.Time{}, overlay.Concat(overlay.FileSection(st.Image.Path, st.Image.ReaderAt(), 0, st.Image.Size)), h.opts.StallTimeout)
}

// downloadWait is the longest a download waits for a slot when every one
// is taken; one InfraEnv's past its share is refused at once.
const downloadWait = time.Second

// acquire takes a slot of pool for the request's client, or answers 503
// with the Retry-After of a turn (internal/gate): when infraEnv holds its
// share of the pool, when the pool stays full for downloadWait, or (30 s)
// when the client already has MaxPerClient downloads in flight. A boot
// storm of one InfraEnv's hosts is served its share at a time, the rest
// coming back as slots free up rather than all 30 s later.
func (h *Handler) acquire(w http.ResponseWriter, r *http.Request, pool *gate.Gate, infraEnv string) (release func(), ok bool) {
	client := h.clientAddr(r)
	h.clientsMu.Lock()
	if h.clients[client] >= h.opts.MaxPerClient {
		h.clientsMu.Unlock()
		retryLater(w, fmt.Sprintf("this client (%s) already has %d downloads in progress", client, h.opts.MaxPerClient))
		return nil, false
	}
	h.clients[client]++
	h.clientsMu.Unlock()
	unclaim := func() {
		h.clientsMu.Lock()
		if h.clients[client]--; h.clients[client] <= 0 {
			delete(h.clients, client)
		}
		h.clientsMu.Unlock()
	}
	leave, refused := pool.Enter(r.Context(), infraEnv)
	if refused != nil {
		unclaim()
		secs := refused.Seconds()
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		msg := fmt.Sprintf("too many downloads in progress; retry in %ds", secs)
		if refused.Share && infraEnv != "" {
			msg = fmt.Sprintf("this InfraEnv's content already has %d downloads in progress; retry in %ds", h.opts.MaxPerInfraEnv, secs)
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return nil, false
	}
	inFlight.Inc()
	return func() {
		inFlight.Dec()
		leave()
		unclaim()
	}, true
}

// clientAddr is the address a request came from: the connection's, or,
// when that is a trusted proxy's, the last address in X-Forwarded-For that
// is not a trusted proxy's (what the proxy nearest the client saw).
// Whoever connects directly cannot choose their address with the header.
func (h *Handler) clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if !h.trusted(host) {
		return host
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		for _, hop := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(hop))
		}
	}
	for i := len(hops) - 1; i >= 0; i-- {
		addr, err := netip.ParseAddr(hops[i])
		if ap, perr := netip.ParseAddrPort(hops[i]); err != nil && perr == nil {
			addr, err = ap.Addr(), nil // some proxies add the client's port
		}
		if err != nil {
			return host // a malformed header: the proxy is the client
		}
		if !h.trusted(addr.String()) {
			return addr.Unmap().String()
		}
	}
	return host
}

func (h *Handler) trusted(ip string) bool {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	for _, p := range h.opts.TrustedProxies {
		if p.Contains(addr.Unmap()) {
			return true
		}
	}
	return false
}

// contentTime is when the controller published this content, if it did.
func contentTime(ie *v1beta1.InfraEnv, out *discovery.Output) time.Time {
	if ie.Status.CreatedTime != nil && ie.Status.ISODownloadURL == out.URLs.ISO {
		return ie.Status.CreatedTime.Time
	}
	return time.Time{}
}

// ipxeScript is the boot script, or for BootOrderControl the chain script
// and, once the host with mac is installed, the exit script.
func (h *Handler) ipxeScript(ctx context.Context, ie *v1beta1.InfraEnv, out *discovery.Output, mac string) string {
	if ie.Spec.IPXEScriptType != v1beta1.BootOrderControl {
		return out.IPXEScript()
	}
	if mac == "" {
		return out.IPXEChainScript()
	}
	if disk, err := h.bootsFromDisk(ctx, ie.Namespace, mac, ie.Name); err == nil && disk {
		return discovery.IPXEExitScript
	}
	return out.IPXEScript() // when in doubt, discovery: it finds the disk's installation
}

// bootsFromDisk is whether an Agent with mac in namespace (registered
// through InfraEnv infraEnv, when it is not "") was installed and now
// boots from its disk: its host is then sent to the disk instead of
// discovery. The manager's records say so (package diskboot): the image
// service reads no Agent.
func (h *Handler) bootsFromDisk(ctx context.Context, namespace, mac, infraEnv string) (bool, error) {
	return diskboot.BootsFromDisk(ctx, h.opts.Reader, namespace, mac, infraEnv)
}
