package agentstatus

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Phases, the values of agentboot_agent_phase_seconds' phase label.
const (
	PhaseRegisteredToApproved = "registered_to_approved"
	PhaseRegisteredToReady    = "registered_to_ready"
)

var (
	phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentboot_agent_phase_seconds",
		Help:    "How long hosts took from the start of their registration session to each phase: registered_to_approved, registered_to_ready (approved, validated, connected: bindable).",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600},
	}, []string{"phase"})
	registerOnce sync.Once
)

func registerMetrics() { registerOnce.Do(func() { metrics.Registry.MustRegister(phaseSeconds) }) }

// observePhase records how long after its session began the host reached
// phase; nothing when the session's start is not known.
func observePhase(a *v1beta1.Agent, phase string, now time.Time) {
	started, err := time.Parse(time.RFC3339Nano, lifecycle.Registration(a).SessionStarted)
	if err != nil || now.Before(started) {
		return
	}
	phaseSeconds.WithLabelValues(phase).Observe(now.Sub(started).Seconds())
}
