package poolmetrics

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/agentboot/agentboot/internal/sanitize"
)

// Phases, the values of agentboot_agent_phase_seconds' phase label: how
// long a host took from one point of its life to the next.
const (
	// From the BareMetalHost controller's boot into discovery to the
	// start of the registration session that boot led to.
	PhaseBootToRegistered = "boot_to_registered"
	// From the start of the registration session to spec.approved.
	PhaseRegisteredToApproved = "registered_to_approved"
	// From the start of the registration session to ready: approved,
	// validated, connected, bindable.
	PhaseRegisteredToReady = "registered_to_ready"
	// From the binding to the Done stage of the installation.
	PhaseBoundToDone = "bound_to_done"
	// From the release of an installed host to ready (bindable) again,
	// through its reboot, registration and owed sanitization.
	PhaseReleasedToReady = "released_to_ready"
)

// Phases lists them.
var Phases = []string{PhaseBootToRegistered, PhaseRegisteredToApproved, PhaseRegisteredToReady, PhaseBoundToDone, PhaseReleasedToReady}

var (
	phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentboot_agent_phase_seconds",
		Help:    "How long hosts took for each phase: boot_to_registered, registered_to_approved, registered_to_ready, bound_to_done, released_to_ready.",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600},
	}, []string{"phase"})
	sanitizations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_sanitizations_total",
		Help: "Disk sanitization attempts judged, by outcome (done, failed).",
	}, []string{"outcome"})
	eraseSecondsPerGiB = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentboot_disk_erase_seconds_per_gib",
		Help:    "Seconds a disk's erase and its check took per GiB the method covered, by method.",
		Buckets: []float64{0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 60},
	}, []string{"method"})
	registerOnce sync.Once
)

func register() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(phaseSeconds, sanitizations, eraseSecondsPerGiB)
		// From 0: the first failure is an increase an alert sees.
		sanitizations.WithLabelValues(SanitizationDone)
		sanitizations.WithLabelValues(SanitizationFailed)
	})
}

// Register reports the metrics from the start, zeros included (the agent
// API calls it when it starts).
func Register() { register() }

// ObservePhase records that a host took from since to now for phase;
// nothing when since is unknown (zero) or after now.
func ObservePhase(phase string, since, now time.Time) {
	register()
	if since.IsZero() || now.Before(since) {
		return
	}
	phaseSeconds.WithLabelValues(phase).Observe(now.Sub(since).Seconds())
}

// Sanitization outcomes.
const (
	SanitizationDone   = "done"
	SanitizationFailed = "failed"
)

// ObserveSanitization counts a judged attempt.
func ObserveSanitization(outcome string) {
	register()
	sanitizations.WithLabelValues(outcome).Inc()
}

// ObserveErase records one disk's erase: the method as the host named it
// (a method agentboot does not know is counted as "other": the label is
// never the host's free text), the bytes it covered and how long it took.
// Disks that were spared or covered nothing are not rates and are not
// counted.
func ObserveErase(method string, bytes int64, took time.Duration) {
	register()
	if bytes <= 0 || took <= 0 {
		return
	}
	if !slices.Contains(sanitize.Methods(), sanitize.Method(method)) {
		method = "other"
	}
	eraseSecondsPerGiB.WithLabelValues(method).Observe(took.Seconds() / (float64(bytes) / (1 << 30)))
}
