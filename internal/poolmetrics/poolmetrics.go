// Package poolmetrics reports the pool of hosts to Prometheus: how many
// Agents each InfraEnv has in each state of the pool (agentboot_agents),
// counted from the manager's cache at each scrape, by the elected manager
// only. Its labels are bounded: the state is one of States, and the
// namespaces and InfraEnvs, which tenants name, are reported for the
// MaxSeries pairs with the most Agents; the others are summed under
// namespace and infraenv "_other".
package poolmetrics

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// The states of the pool, in the order a host meets them: the answer to
// "where is my server?" for each Agent.
const (
	Discovering  = "discovering"  // registered; no inventory, or validations pending
	Insufficient = "insufficient" // fails a validation
	Unapproved   = "unapproved"   // meets the requirements, waits for an admin's approval
	Free         = "free"         // approved and ready, unbound: bindable
	Disconnected = "disconnected" // stopped heartbeating
	Bound        = "bound"        // bound to a cluster, not installing yet
	Installing   = "installing"
	Installed    = "installed"
	Error        = "error"       // its installation failed
	Unbinding    = "unbinding"   // released from its cluster, not back in discovery yet
	Quarantined  = "quarantined" // owes a disk sanitization it is not running
	Sanitizing   = "sanitizing"  // erasing its disks
)

// States lists them all.
var States = []string{Discovering, Insufficient, Unapproved, Free, Disconnected, Bound, Installing, Installed, Error, Unbinding, Quarantined, Sanitizing}

// State is the Agent's state in the pool.
func State(a *v1beta1.Agent) string {
	state := a.Status.DebugInfo.State
	switch {
	case lifecycle.SanitizationRunning(a):
		return Sanitizing
	case lifecycle.SanitizationOwed(a):
		return Quarantined
	case state == lifecycle.StateError:
		return Error
	case state == lifecycle.StateAddedToExistingCluster:
		return Installed
	case state == lifecycle.StateInstalling || state == lifecycle.StateInstallingInProgress:
		return Installing
	case state == lifecycle.StateUnbinding || state == lifecycle.StateUnbindingPendingUserAct:
		return Unbinding
	case strings.HasPrefix(state, "disconnected"):
		return Disconnected
	case lifecycle.Bound(a):
		return Bound
	case strings.HasPrefix(state, "insufficient"):
		return Insufficient
	case strings.HasPrefix(state, "known") && a.Spec.Approved:
		return Free
	case strings.HasPrefix(state, "known"):
		return Unapproved
	default:
		return Discovering
	}
}

// DefaultMaxSeries is how many (namespace, InfraEnv) pairs are reported
// by name.
const DefaultMaxSeries = 500

// Other names the pairs past MaxSeries, and Agents with no InfraEnv.
const Other = "_other"

var agentsDesc = prometheus.NewDesc("agentboot_agents",
	"Agents by namespace, InfraEnv (the one the host registered through) and state in the pool ("+strings.Join(States, ", ")+").",
	[]string{"namespace", "infraenv", "state"}, nil)

var longestDesc = prometheus.NewDesc("agentboot_agents_longest_in_state_seconds",
	"How long the Agent that has been longest in its state, of those of a namespace, InfraEnv and state, has been in it (0 when there are none); alerts on hosts stuck in a state use it.",
	[]string{"namespace", "infraenv", "state"}, nil)

// Collector counts the Agents a reader (the manager's cache) holds.
type Collector struct {
	// Now is the clock (time.Now unless a test sets one).
	Now    func() time.Time
	Reader client.Reader
	// MaxSeries bounds the pairs reported by name (default
	// DefaultMaxSeries).
	MaxSeries int
	Log       logr.Logger
}

// Describe sends the metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- agentsDesc; ch <- longestDesc }

type pair struct{ namespace, infraenv string }

// Collect counts the Agents. Every state of every pair reported is sent,
// zeros included, so that a series does not vanish when its last host
// moves on.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var list v1beta1.AgentList
	// Read only: the cache's objects as they are, not copies of every
	// Agent's inventory at each scrape.
	if err := c.Reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		c.Log.Error(err, "count Agents for metrics")
		// The scrape fails, saying why, rather than the series vanishing.
		ch <- prometheus.NewInvalidMetric(agentsDesc, err)
		ch <- prometheus.NewInvalidMetric(longestDesc, err)
		return
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	counts := map[pair]map[string]int{}
	oldest := map[pair]map[string]time.Time{}
	totals := map[pair]int{}
	for i := range list.Items {
		a := &list.Items[i]
		p := pair{a.Namespace, lifecycle.Registration(a).InfraEnv}
		if p.infraenv == "" {
			p.infraenv = Other
		}
		if counts[p] == nil {
			counts[p], oldest[p] = map[string]int{}, map[string]time.Time{}
		}
		s := State(a)
		counts[p][s]++
		totals[p]++
		if e, at := Entered(a, s), oldest[p][s]; at.IsZero() || e.Before(at) {
			oldest[p][s] = e
		}
	}
	pairs := make([]pair, 0, len(counts))
	for p := range counts {
		pairs = append(pairs, p)
	}
	// The most Agents first, then by name: which pairs are named is stable.
	slices.SortFunc(pairs, func(x, y pair) int {
		if totals[x] != totals[y] {
			return totals[y] - totals[x]
		}
		return strings.Compare(x.namespace+"/"+x.infraenv, y.namespace+"/"+y.infraenv)
	})
	max := c.MaxSeries
	if max <= 0 {
		max = DefaultMaxSeries
	}
	if len(pairs) > max {
		rest, restOldest := map[string]int{}, map[string]time.Time{}
		for _, p := range pairs[max:] {
			for s, n := range counts[p] {
				rest[s] += n
				if at, ok := restOldest[s]; !ok || oldest[p][s].Before(at) {
					restOldest[s] = oldest[p][s]
				}
			}
		}
		// No namespace is named _other (namespaces are DNS labels).
		other := pair{Other, Other}
		counts[other], oldest[other] = rest, restOldest
		pairs = append(pairs[:max], other)
	}
	for _, p := range pairs {
		for _, s := range States {
			ch <- prometheus.MustNewConstMetric(agentsDesc, prometheus.GaugeValue, float64(counts[p][s]), p.namespace, p.infraenv, s)
			longest := 0.0
			if at, ok := oldest[p][s]; ok && at.Before(now) {
				longest = now.Sub(at).Seconds()
			}
			ch <- prometheus.MustNewConstMetric(longestDesc, prometheus.GaugeValue, longest, p.namespace, p.infraenv, s)
		}
	}
}

// Runnable registers the collector with controller-runtime's registry
// while this manager leads (the others' caches need not hold every
// Agent), and takes it out when it stops leading.
type Runnable struct{ Collector *Collector }

// NeedLeaderElection is true: only the elected manager counts.
func (r Runnable) NeedLeaderElection() bool { return true }

// Start registers the collector until ctx ends.
func (r Runnable) Start(ctx context.Context) error {
	if err := metrics.Registry.Register(r.Collector); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			// Another manager in this process (tests) reports already.
			r.Collector.Log.V(1).Info("pool metrics already reported in this process")
			return nil
		}
		return err
	}
	<-ctx.Done()
	metrics.Registry.Unregister(r.Collector)
	return nil
}
