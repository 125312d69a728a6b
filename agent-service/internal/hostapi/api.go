// Package hostapi is the agent API: hosts register with their InfraEnv's token,
// get a per-host token, upload inventory, heartbeat for instructions and
// report results. Every replica serves it; it keeps no state of its own,
// reads through the informer cache, and writes only when something changed
// (liveness goes to a Lease, renewed at most every 45 seconds).
package hostapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/agentboot/agentboot/agent-service/internal/debts"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/gate"
	"github.com/agentboot/agentboot/internal/signing"
)

// Options configure the API.
type Options struct {
	// Client reads through the cache and writes to the apiserver.
	Client client.Client
	// APIReader reads the apiserver directly, for objects the cache may not
	// have yet (an Agent created a moment ago by another replica).
	APIReader client.Reader
	Keys      signing.Source
	Events    events.EventRecorder
	// LeaseNamespace holds the Agents' liveness Leases.
	LeaseNamespace string
	// MinDiskSizeBytes is the default installation disk minimum.
	MinDiskSizeBytes int64
	// MaxAgents caps the Agents of one InfraEnv.
	MaxAgents int
	// MaxUnapproved caps the unapproved Agents of one InfraEnv: all a
	// holder of its registration token can create and fill.
	MaxUnapproved int
	// WriteBudgetPerInfraEnv and WriteBudgetPerProcess are the bytes per
	// second the API may write to the apiserver for one InfraEnv's hosts,
	// and in all (budget.go); 0 means no limit.
	WriteBudgetPerInfraEnv, WriteBudgetPerProcess int
	// WritesInFlight bounds the registrations and inventory uploads
	// served at once (internal/gate: one InfraEnv holds at most half,
	// and a request waits at most 250 ms for a slot); 0 means no bound.
	WritesInFlight int
	// PollInterval is how often agents heartbeat.
	PollInterval time.Duration
	// Waker, when set, lets heartbeats be held until their host has work
	// (agentwire.InstructionsRequest.WaitSeconds); nil: answered at once.
	Waker *Waker
	// LeaseRenewInterval is the most often a Lease is written.
	LeaseRenewInterval time.Duration
	// Steps provides instructions; nil gives none.
	Steps Steps
	// Debts are the erases machines owe by their hardware: an inventory
	// matching one makes its Agent owe it.
	Debts *debts.Store
	Log   logr.Logger
	Now   func() time.Time
}

// RefusedError is a step report the service will never take (no such step
// is running for the host): the host must not send it again. Any other
// error from Steps.Result is the service's trouble, and the host retries.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

// ErrReleased is Steps.Result's answer for a host released from its
// cluster while it installed.
var ErrReleased = errors.New("the host was released from its cluster while it installed: its installation is void; stay in discovery")

// Steps hands out work for hosts and takes their reports.
type Steps interface {
	Next(ctx context.Context, a *AgentRef) ([]agentwire.Step, error)
	// Result takes a step's outcome; ErrReleased says the host was
	// unbound meanwhile and must not boot what it installed.
	Result(ctx context.Context, a *AgentRef, step string, r agentwire.StepResult) error
	Progress(ctx context.Context, a *AgentRef, p agentwire.Progress) error
}

// Limits of the API.
const (
	maxBodyBytes = 64 << 10
	// A step result carries a sanitization's evidence: a few hundred
	// bytes for each of up to a few hundred disks.
	maxStepResultBytes = 256 << 10
	// Per host: a heartbeat every few seconds at most, with room for
	// bursts of step reports.
	hostRate  = 2
	hostBurst = 20
	// Status writes per host (inventory, progress, NTP sources): an
	// agent writes once a minute at most, and an installation's ~25
	// progress reports fit the burst; a host changing its inventory on
	// every request does not turn its 2 requests a second into writes.
	writeRate  = 0.2
	writeBurst = 30
	// Registrations per InfraEnv, to protect the apiserver when a rack
	// powers on at once; agents retry with backoff.
	registerRate  = 100
	registerBurst = 200
)

// Server serves the agent API.
type Server struct {
	o        Options
	limiters sync.Map // key → *limiter
	budget   *budget
	gate     *gate.Gate
}

type limiter struct {
	*rate.Limiter
	// last is when the key was last used (Unix nanoseconds): requests of
	// one host write it concurrently.
	last atomic.Int64
}

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_agent_api_requests_total",
		Help: "Agent API requests by operation and HTTP status code.",
	}, []string{"operation", "code"})
	registrationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "agentboot_agent_registration_seconds",
		Help:    "Time to serve a registration.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
	writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_agent_api_writes_total",
		Help: "Writes the agent API made to the apiserver, by object.",
	}, []string{"object"})
	heldHeartbeats = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "agentboot_agent_api_held_heartbeats",
		Help: "Heartbeats the agent API holds until their host has work (a long poll).",
	})
	registerOnce sync.Once
)

// New returns the API server.
func New(o Options) *Server {
	registerOnce.Do(func() { metrics.Registry.MustRegister(requests, registrationSeconds, writes, heldHeartbeats) })
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.PollInterval == 0 {
		o.PollInterval = agentwire.DefaultPollInterval
	}
	if o.LeaseRenewInterval == 0 {
		o.LeaseRenewInterval = 45 * time.Second
	}
	return &Server{o: o, budget: newBudget(o.WriteBudgetPerInfraEnv, o.WriteBudgetPerProcess), gate: gate.New(o.WritesInFlight, o.WritesInFlight/2, gateWait, o.Now)}
}

// Handler has every route of the agent API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+agentwire.RegisterPath, s.observe("register", http.HandlerFunc(s.register)))
	mux.Handle("PUT "+agentwire.InventoryPath, s.observe("inventory", s.host(s.inventory)))
	mux.Handle("POST "+agentwire.InstructionsPath, s.observe("instructions", s.host(s.instructions)))
	mux.Handle("POST "+agentwire.StepResultPath, s.observe("step", s.host(s.stepResult)))
	mux.Handle("POST "+agentwire.ProgressPath, s.observe("progress", s.host(s.progress)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "NotFound", "no such agent API path")
	})
	return mux
}

// observe counts answers. Tokens travel in headers and are never logged.
func (s *Server) observe(op string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		requests.WithLabelValues(op, strconv.Itoa(rec.code)).Inc()
		if rec.code >= 500 {
			s.o.Log.Info("agent API error", "operation", op, "path", r.URL.Path, "code", rec.code)
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, errCode, format string, args ...any) {
	writeJSON(w, code, agentwire.Error{Code: errCode, Message: fmt.Sprintf(format, args...)})
}

// bearer returns the Authorization bearer token.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

// decode reads a strict JSON body of at most max bytes.
func decode(w http.ResponseWriter, r *http.Request, max int64, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, max)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body larger than %d bytes", max)
		}
		return fmt.Errorf("malformed JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the object")
	}
	return nil
}

// allow applies a token bucket per key; limiters idle for ten minutes are
// dropped so the map does not grow without bound.
func (s *Server) allow(key string, r rate.Limit, burst int) bool {
	now := s.o.Now()
	v, _ := s.limiters.LoadOrStore(key, &limiter{Limiter: rate.NewLimiter(r, burst)})
	l := v.(*limiter)
	l.last.Store(now.UnixNano())
	ok := l.AllowN(now, 1)
	if n := now.Unix(); n%64 == 0 {
		s.limiters.Range(func(k, v any) bool {
			if now.Sub(time.Unix(0, v.(*limiter).last.Load())) > 10*time.Minute {
				s.limiters.Delete(k)
			}
			return true
		})
	}
	return ok
}

// gateWait is the longest a registration or inventory upload waits for a
// slot of the gate: with the service time of a write under load, what a
// host waits stays well under a second.
const gateWait = 250 * time.Millisecond

// busy answers a request the gate refused.
func busy(w http.ResponseWriter, refused *gate.Refused) {
	secs := refused.Seconds()
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, "Busy", "the agent API is serving as many registrations and inventories as the apiserver takes; retry in %ds", secs)
}

func tooMany(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "5")
	writeError(w, http.StatusTooManyRequests, "TooManyRequests", "too many requests; retry later")
}
