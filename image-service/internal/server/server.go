// Package server is the image service's HTTP handler.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/gate"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
)

// Cache indexes.
const (
	UIDIndex = "metadata.uid"
)

// Options configure a Handler.
type Options struct {
	Reader      client.Reader // an informer cache with UIDIndex and the macindex indexes
	Catalog     *osimage.Catalog
	Keys        signing.Source
	Settings    discovery.Settings
	MaxInFlight int
	// MaxPerClient bounds the downloads one client address has in flight
	// (8), so that one client cannot take every slot; MaxPerInfraEnv those
	// of one InfraEnv's content (a quarter of MaxInFlight), so that the
	// holders of one InfraEnv's image token cannot either.
	MaxPerClient, MaxPerInfraEnv int
	// TrustedProxies are the addresses of proxies (an ingress) whose
	// X-Forwarded-For names the client; from any other address the header
	// is ignored. Empty: the connection's address is the client.
	TrustedProxies []netip.Prefix
	// StallTimeout is how long a download may make no progress (each
	// chunk of it must be taken within it; 60s): a client reading a byte
	// a second gives its slot back.
	StallTimeout time.Duration
	// BootNS are the namespaces designated to claim network-booting hosts.
	BootNS Namespaces
	// Trace, when set, gathers the boot path's hops by MAC (docs/trace.md);
	// ObservationsToken, when set, lets the PXE service post its own.
	Trace             *boottrace.Journal
	ObservationsToken string
	Log               logr.Logger
}

// Namespaces is a set of namespaces, or every namespace.
type Namespaces struct {
	all   bool
	names map[string]bool
}

// ParseNamespaces reads a comma-separated list; "*" is every namespace and
// "" none.
func ParseNamespaces(s string) (Namespaces, error) {
	n := Namespaces{names: map[string]bool{}}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
		case name == "*":
			n.all = true
		default:
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				return Namespaces{}, fmt.Errorf("namespace %q: %s", name, strings.Join(errs, "; "))
			}
			n.names[name] = true
		}
	}
	return n, nil
}

// Has reports whether ns is in the set.
func (n Namespaces) Has(ns string) bool { return n.all || n.names[ns] }

// String lists the set for messages.
func (n Namespaces) String() string {
	if n.all {
		return "*"
	}
	names := make([]string, 0, len(n.names))
	for k := range n.names {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// Handler answers image requests.
type Handler struct {
	opts Options
	// agents are the open agent binaries by sha256.
	agents map[string]agentFile
	// slots bounds per-InfraEnv downloads (ISOs, initrds), one
	// InfraEnv's at most MaxPerInfraEnv; publicSlots the OS images' own
	// files (kernels, root filesystems, disk images), which every booting
	// host fetches: one kind cannot starve the other.
	slots, publicSlots *gate.Gate
	clientsMu          sync.Mutex
	clients            map[string]int // downloads in flight per client address
	renders            *renderCache
	macs               boottrace.Addresses // for the boot trace
}

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_image_requests_total",
		Help: "Image service requests by file and HTTP status code.",
	}, []string{"file", "code"})
	inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "agentboot_image_downloads_in_flight",
		Help: "Image downloads being served.",
	})
	bytesSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_image_bytes_sent_total",
		Help: "Bytes of image content sent, by file.",
	}, []string{"file"})
	registerOnce sync.Once
)

// agentFile is one architecture's agent binary, open for serving.
type agentFile struct {
	f   *os.File
	mod time.Time
}

// NewHandler opens the agent binaries and prepares the handler.
func NewHandler(opts Options) (*Handler, error) {
	registerOnce.Do(func() { metrics.Registry.MustRegister(requests, inFlight, bytesSent, bootScripts) })
	agents := map[string]agentFile{}
	for _, a := range opts.Settings.Agents {
		f, err := os.Open(a.Path)
		if err != nil {
			return nil, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		agents[a.SHA256] = agentFile{f: f, mod: st.ModTime()}
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	if opts.MaxPerClient <= 0 {
		opts.MaxPerClient = 8
	}
	if opts.MaxPerInfraEnv <= 0 {
		opts.MaxPerInfraEnv = max(opts.MaxInFlight/4, 1)
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = time.Minute
	}
	return &Handler{opts: opts, agents: agents, renders: newRenderCache(128),
		slots:       gate.New(opts.MaxInFlight, opts.MaxPerInfraEnv, downloadWait, time.Now),
		publicSlots: gate.New(opts.MaxInFlight, opts.MaxInFlight, downloadWait, time.Now), clients: map[string]int{}}, nil
}

// HTTPS is the handler of the HTTPS listener: everything.
func (h *Handler) HTTPS() http.Handler { return h.routes(true) }

// HTTP is the handler of the plain-HTTP listener: only what stock iPXE and
// the live initramfs fetch (and the ISO when configured for BMCs).
func (h *Handler) HTTP() http.Handler { return h.routes(false) }

// routes lists every route of one listener.
// Route patterns; metric labels are derived from them (fileLabel).
const (
	routeImage    = "GET /images/{uid}/{version}/{file}"
	routeArtifact = "GET /boot-artifacts/{arch}/{version}/{file}"
	routeBootMAC  = "GET /boot.ipxe"
	routeBootGRUB = "GET /boot.grub"
	routeAgent    = "GET /agent/{sha256}"
	routeHealth   = "GET /healthz"
)

func (h *Handler) routes(secure bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(routeImage, h.serveImage(secure))
	mux.HandleFunc(routeArtifact, h.serveArtifact)
	mux.HandleFunc(routeBootMAC, h.serveBootScript)
	mux.HandleFunc(routeBootGRUB, h.serveGRUBScript)
	if secure {
		mux.HandleFunc(routeAgent, h.serveAgent)
	}
	mux.HandleFunc(routeHealth, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if secure {
		// Its token must not cross the boot network in clear.
		mux.HandleFunc(routeObservations, h.serveObservations)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "not found", http.StatusNotFound) })
	return h.count(mux)
}

// count counts responses by file and code, and records boot files'
// downloads in the boot trace. It never logs query strings, which carry
// tokens.
func (h *Handler) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		start := time.Now()
		next.ServeHTTP(rec, r)
		file := fileLabel(r)
		requests.WithLabelValues(file, strconv.Itoa(rec.code)).Inc()
		if rec.bytes > 0 {
			bytesSent.WithLabelValues(file).Add(float64(rec.bytes))
		}
		if hop := fileHops[file]; hop != "" && rec.code/100 == 2 && rec.whole() {
			bootpath.Count(hop)
		}
		h.observeDownload(r, file, rec)
		if rec.code >= 400 || rec.bytes > 1<<20 {
			h.opts.Log.V(1).Info("request", "method", r.Method, "path", r.URL.Path, "code", rec.code, "bytes", rec.bytes, "duration", time.Since(start).String(), "remote", r.RemoteAddr)
		}
	})
}

// fileLabel names what a request asked for, from the route it matched
// (the request's Pattern, set by the mux) and only known file names: a
// label never comes from the raw path, or every made-up path would be a
// new metric series.
func fileLabel(r *http.Request) string {
	switch r.Pattern {
	case routeImage, routeArtifact:
		if f := r.PathValue("file"); knownFiles[f] {
			return f
		}
		return "unknown-file"
	case routeBootMAC:
		return "boot.ipxe-by-mac"
	case routeBootGRUB:
		return "boot.grub-by-mac"
	case routeAgent:
		return "agent"
	case routeHealth:
		return "healthz"
	case routeObservations:
		return "boot-observations"
	}
	return "other"
}

var knownFiles = map[string]bool{
	discovery.FileISO: true, discovery.FileFullISO: true, discovery.FileMinimalISO: true, discovery.FileKernel: true,
	discovery.FileInitrd: true, discovery.FileRootfs: true, discovery.FileIPXE: true, discovery.FileIgnition: true,
	discovery.FileDisk: true,
}

// fileHops are the boot-path hops of the files hosts boot from.
var fileHops = map[string]string{
	discovery.FileKernel: bootpath.Kernel, discovery.FileInitrd: bootpath.Initrd, discovery.FileRootfs: bootpath.RootFS,
	discovery.FileISO: bootpath.ISO, discovery.FileFullISO: bootpath.ISO, discovery.FileMinimalISO: bootpath.ISO,
}

type statusRecorder struct {
	http.ResponseWriter
	code  int
	bytes int64
	// length is the Content-Length the answer announced, -1 for none;
	// toEnd, whether it reaches the end of the file (a whole file, or a
	// range through its last byte); headed, whether the header was sent.
	length int64
	toEnd  bool
	headed bool
}

// head notes what the header announces as it is sent.
func (s *statusRecorder) head() {
	if s.headed {
		return
	}
	s.headed, s.length = true, -1
	if n, err := strconv.ParseInt(s.Header().Get("Content-Length"), 10, 64); err == nil {
		s.length = n
	}
	s.toEnd = true
	if cr := s.Header().Get("Content-Range"); cr != "" {
		// bytes first-last/size
		var first, last, size int64
		_, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &first, &last, &size)
		s.toEnd = err == nil && last == size-1
	}
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.head()
	s.ResponseWriter.WriteHeader(code)
}

// whole reports whether every byte the answer announced was sent, and
// they reached the end of the file: a download resumed by ranges counts
// once, when its last range is sent.
func (s *statusRecorder) whole() bool { return s.length >= 0 && s.bytes == s.length && s.toEnd }

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.head()
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

// ReadFrom passes large copies to the connection (sendfile on plain HTTP).
func (s *statusRecorder) ReadFrom(src io.Reader) (int64, error) {
	s.head()
	rf, ok := s.ResponseWriter.(io.ReaderFrom)
	if !ok {
		n, err := io.Copy(writerOnly{s.ResponseWriter}, src)
		s.bytes += n
		return n, err
	}
	n, err := rf.ReadFrom(src)
	s.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

var (
	versionPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)
	artifactPart   = regexp.MustCompile(`^[A-Za-z0-9._+-]{1,128}$`)
)

// imageRequest is a parsed /images/... request.
type imageRequest struct {
	uid, version, file, token, mac string
	// bootProof: an ISO the BMC controller inserts for one BareMetalHost.
	bootProof *agentwire.BootProof
}

// big files go through the download slots.
var big = map[string]bool{
	discovery.FileISO: true, discovery.FileFullISO: true, discovery.FileMinimalISO: true, discovery.FileInitrd: true,
}

var known = map[string]bool{discovery.FileIPXE: true, discovery.FileIgnition: true}

func parseImageRequest(r *http.Request) (imageRequest, error) {
	req := imageRequest{uid: r.PathValue("uid"), version: r.PathValue("version"), file: r.PathValue("file")}
	if !big[req.file] && !known[req.file] {
		return req, errNotFound
	}
	if !agentwire.UUIDForm.MatchString(req.uid) {
		return req, fmt.Errorf("malformed InfraEnv UID %q", req.uid)
	}
	if !versionPattern.MatchString(req.version) {
		return req, fmt.Errorf("malformed version %q", req.version)
	}
	q := r.URL.Query()
	for k, v := range q {
		switch {
		case k == "token" && len(v) == 1:
			req.token = v[0]
		case k == "mac" && len(v) == 1 && req.file == discovery.FileIPXE:
			req.mac = strings.ToLower(v[0])
		case (k == "bmh" || k == "proof") && len(v) == 1 && isISO(req.file):
			if req.bootProof == nil {
				req.bootProof = &agentwire.BootProof{}
			}
			if k == "bmh" {
				req.bootProof.BareMetalHost = v[0]
			} else {
				req.bootProof.Proof = v[0]
			}
		case len(v) > 1:
			return req, fmt.Errorf("query parameter %q given %d times", k, len(v))
		default:
			return req, fmt.Errorf("unexpected query parameter %q", k)
		}
	}
	if req.token == "" {
		return req, errUnauthorized
	}
	if !signing.TokenForm.MatchString(req.token) {
		return req, errUnauthorized
	}
	if _, ok := q["mac"]; ok && !agentwire.MACForm.MatchString(req.mac) {
		return req, fmt.Errorf("malformed mac %q", req.mac)
	}
	if p := req.bootProof; p != nil {
		if errs := validation.IsDNS1123Subdomain(p.BareMetalHost); len(errs) > 0 {
			return req, fmt.Errorf("malformed bmh %q: %s", p.BareMetalHost, strings.Join(errs, "; "))
		}
		if !signing.BootProofPattern.MatchString(p.Proof) {
			return req, fmt.Errorf("malformed proof: bmh and proof come together, from the BareMetalHost controller")
		}
	}
	return req, nil
}

func isISO(file string) bool {
	return file == discovery.FileISO || file == discovery.FileFullISO || file == discovery.FileMinimalISO
}

var (
	errNotFound     = errors.New("not found")
	errUnauthorized = errors.New("unauthorized")
)

// httpFiles may be fetched over plain HTTP.
func (h *Handler) overHTTP(file string) bool {
	switch file {
	case discovery.FileIPXE, discovery.FileInitrd:
		return true
	case discovery.FileISO, discovery.FileFullISO, discovery.FileMinimalISO:
		return h.opts.Settings.ISOOverHTTP
	}
	return false
}

func (h *Handler) serveImage(secure bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, err := parseImageRequest(r)
		switch {
		case errors.Is(err, errNotFound):
			http.Error(w, "not found", http.StatusNotFound)
			return
		case errors.Is(err, errUnauthorized):
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !secure && !h.overHTTP(req.file) {
			http.Error(w, req.file+" is served over HTTPS only", http.StatusNotFound)
			return
		}
		key, err := h.opts.Keys.Key()
		if err != nil {
			retryLater(w, "the service is starting: signing key not loaded yet")
			return
		}
		// The token first: an unknown InfraEnv and someone else's answer
		// the same, and nothing is read for a request we did not sign.
		if !key.Verify(req.token, signing.PurposeImage, req.uid, req.version) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		ie, err := h.infraEnvByUID(r.Context(), req.uid)
		if err != nil {
			h.fail(w, err)
			return
		}
		out, img, err := h.render(r.Context(), ie, key)
		if err != nil {
			h.fail(w, err)
			return
		}
		if out.Version != req.version {
			// A valid token for content that changed since: stale.
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}

		h.serveFile(w, r, req, ie, out, img)
	}
}

// errNotReady makes a 503: retrying later will help.
type errNotReady struct{ msg string }

func (e errNotReady) Error() string { return e.msg }

// errUnprocessable makes a 422: the InfraEnv asks for what cannot be built.
type errUnprocessable struct{ msg string }

func (e errUnprocessable) Error() string { return e.msg }

type errNoInfraEnv struct{}

func (errNoInfraEnv) Error() string { return "unknown InfraEnv" }

func (h *Handler) fail(w http.ResponseWriter, err error) {
	var notReady errNotReady
	var input *discovery.InputError
	var unprocessable errUnprocessable
	switch {
	case errors.As(err, &unprocessable):
		http.Error(w, unprocessable.msg, http.StatusUnprocessableEntity)
	case errors.As(err, &notReady):
		retryLater(w, notReady.msg)
	case errors.As(err, &input):
		http.Error(w, input.Error(), http.StatusUnprocessableEntity)
	case errors.Is(err, errNoInfraEnv{}):
		http.Error(w, "unknown InfraEnv", http.StatusNotFound)
	default:
		h.opts.Log.Error(err, "image request failed")
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

func retryLater(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "30")
	http.Error(w, msg, http.StatusServiceUnavailable)
}

func (h *Handler) infraEnvByUID(ctx context.Context, uid string) (*v1beta1.InfraEnv, error) {
	var list v1beta1.InfraEnvList
	if err := h.opts.Reader.List(ctx, &list, client.MatchingFields{UIDIndex: uid}); err != nil {
		return nil, err
	}
	if len(list.Items) != 1 || !list.Items[0].DeletionTimestamp.IsZero() {
		return nil, errNoInfraEnv{}
	}
	return &list.Items[0], nil
}

// serveAgent serves an agent binary at its content address: the digest
// an InfraEnv's Ignition names for its architecture.
func (h *Handler) serveAgent(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	a, ok := h.agents[sum]
	if !ok || r.URL.RawQuery != "" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+sum+`"`)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	http.ServeContent(w, r, "agent", a.mod, readerAtSeeker(a.f))
}
