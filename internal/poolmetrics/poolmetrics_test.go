package poolmetrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/internal/scheme"
	"github.com/agentboot/agentboot/test/stack"
)

func TestMain(m *testing.M) { stack.Main(m) }

func agent(ns, name, infraenv, state string, change func(*v1beta1.Agent)) *v1beta1.Agent {
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	a.Status.DebugInfo.State = state
	if infraenv != "" {
		a.Status.Registration = &v1beta1.AgentRegistration{InfraEnv: infraenv, SessionStarted: "s1"}
	}
	if change != nil {
		change(a)
	}
	return a
}

// Each Agent is in exactly one state of the pool, the one an operator
// asks about first.
func TestState(t *testing.T) {
	approved := func(a *v1beta1.Agent) { a.Spec.Approved = true }
	bound := func(a *v1beta1.Agent) {
		name := "c"
		a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Name: name}
	}
	owes := func(a *v1beta1.Agent) {
		a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{Required: "erase", State: v1beta1.SanitizationPending}
	}
	running := func(a *v1beta1.Agent) {
		a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{Required: "erase", State: v1beta1.SanitizationRunning, Session: "s1"}
	}
	for _, tc := range []struct {
		state  string
		change func(*v1beta1.Agent)
		want   string
	}{
		{lifecycle.StateDiscoveringUnbound, nil, poolmetrics.Discovering},
		{"", nil, poolmetrics.Discovering},
		{lifecycle.StateInsufficientUnbound, approved, poolmetrics.Insufficient},
		{lifecycle.StateKnownUnbound, nil, poolmetrics.Unapproved},
		{lifecycle.StateKnownUnbound, approved, poolmetrics.Free},
		{lifecycle.StateDisconnectedUnbound, approved, poolmetrics.Disconnected},
		{"known", func(a *v1beta1.Agent) { approved(a); bound(a) }, poolmetrics.Bound},
		{lifecycle.StateInstalling, bound, poolmetrics.Installing},
		{lifecycle.StateInstallingInProgress, bound, poolmetrics.Installing},
		{lifecycle.StateAddedToExistingCluster, bound, poolmetrics.Installed},
		{lifecycle.StateError, bound, poolmetrics.Error},
		{lifecycle.StateUnbinding, nil, poolmetrics.Unbinding},
		{lifecycle.StateUnbindingPendingUserAct, nil, poolmetrics.Unbinding},
		{lifecycle.StateKnownUnbound, func(a *v1beta1.Agent) { approved(a); owes(a) }, poolmetrics.Quarantined},
		{lifecycle.StateKnownUnbound, func(a *v1beta1.Agent) { approved(a); running(a) }, poolmetrics.Sanitizing},
	} {
		require.Equal(t, tc.want, poolmetrics.State(agent("ns", "a", "env", tc.state, tc.change)), "%s", tc.state)
	}
}

// series gathers agentboot_agents from a registry: "namespace/infraenv/state"
// → value.
func series(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "agentboot_agents" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[key(m)] = m.GetGauge().GetValue()
		}
	}
	return out
}

func key(m *dto.Metric) string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l["namespace"] + "/" + l["infraenv"] + "/" + l["state"]
}

// Every state of every pair is reported, zeros included; past MaxSeries
// the pairs with the fewest Agents are summed under _other, so that
// tenants' names cannot grow the series without bound.
func TestCollectorBoundsItsSeries(t *testing.T) {
	s, err := scheme.New()
	require.NoError(t, err)
	var objs []client.Object
	// Three InfraEnvs with 3, 2 and 1 Agents; one Agent with none.
	for i, n := range []int{3, 2, 1} {
		for j := 0; j < n; j++ {
			objs = append(objs, agent(fmt.Sprintf("team-%d", i), fmt.Sprintf("a-%d", j), "env", lifecycle.StateKnownUnbound, nil))
		}
	}
	objs = append(objs, agent("team-0", "stray", "", lifecycle.StateDiscoveringUnbound, nil))
	c := &poolmetrics.Collector{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build(), MaxSeries: 2, Log: logr.Discard()}
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	got := series(t, reg)
	require.Equal(t, 3.0, got["team-0/env/unapproved"])
	require.Equal(t, 2.0, got["team-1/env/unapproved"])
	require.Equal(t, 0.0, got["team-0/env/free"], "zeros are reported")
	// team-0's stray (1) and team-2 (1) are past the two largest.
	require.Equal(t, 1.0, got["_other/_other/unapproved"])
	require.Equal(t, 1.0, got["_other/_other/discovering"])
	require.NotContains(t, got, "team-2/env/unapproved")
	require.Len(t, got, 3*len(poolmetrics.States), "three pairs, every state")
}

// phaseCount is how many hosts agentboot_agent_phase_seconds counted in
// phase so far.
func phaseCount(t *testing.T, phase string) uint64 {
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "agentboot_agent_phase_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" && l.GetValue() == phase {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// The elected manager reports the pool as hosts move through it, and how
// long they took to be approved and ready.
func TestManagerReportsThePool(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ie := s.CreateInfraEnv(t, "pool", "env", nil)
	approved, ready := phaseCount(t, "registered_to_approved"), phaseCount(t, "registered_to_ready")
	hop := func(h string) float64 {
		n, _ := stack.Metric(t, "agentboot_boot_path_total", map[string]string{"hop": h})
		return n
	}
	registered, inventories := hop(bootpath.Registered), hop(bootpath.Inventory)
	hosts := []*stack.Host{s.Register(t, ie, 1), s.Register(t, ie, 2)}
	require.Equal(t, registered+2, hop(bootpath.Registered), "the boot path's registered hop, once a host")
	require.Equal(t, inventories+2, hop(bootpath.Inventory), "and its inventory hop")
	var a v1beta1.Agent
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, client.ObjectKey{Namespace: hosts[0].NS, Name: hosts[0].ID}, &a) != nil {
			return false
		}
		p := client.MergeFrom(a.DeepCopy())
		a.Spec.Approved = true
		return s.Client.Patch(ctx, &a, p) == nil
	}, time.Minute, 100*time.Millisecond)
	prefix := ie.Namespace + "/" + ie.Name + "/"
	var got map[string]float64
	require.Eventually(t, func() bool {
		got = series(t, metrics.Registry)
		return got[prefix+poolmetrics.Free] == 1 && got[prefix+poolmetrics.Unapproved] == 1
	}, time.Minute, 200*time.Millisecond, "agentboot_agents: %v", got)
	require.Eventually(t, func() bool {
		return phaseCount(t, "registered_to_approved") == approved+1 && phaseCount(t, "registered_to_ready") == ready+1
	}, time.Minute, 200*time.Millisecond, "one host approved and ready, counted once each")
}

// How long a host has been in its state is read from the times its
// status records for that state, so that a restarted manager tells the
// same.
func TestEntered(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	cond := func(typ v1beta1.ConditionType, status string, m int) v1beta1.Condition {
		return v1beta1.Condition{Type: typ, Status: corev1.ConditionStatus(status), LastTransitionTime: metav1.NewTime(at(m))}
	}
	base := func(a *v1beta1.Agent) {
		a.CreationTimestamp = metav1.NewTime(at(0))
		a.Status.Registration.SessionStarted = at(10).Format(time.RFC3339Nano)
		a.Status.Conditions = []v1beta1.Condition{
			cond(v1beta1.ValidatedCondition, "True", 12), cond(v1beta1.RequirementsMetCondition, "True", 14),
			cond(v1beta1.ConnectedCondition, "True", 10), cond(v1beta1.BoundCondition, "False", 5),
		}
	}
	with := func(change func(a *v1beta1.Agent)) *v1beta1.Agent {
		return agent("ns", "a", "env", "", func(a *v1beta1.Agent) {
			base(a)
			if change != nil {
				change(a)
			}
		})
	}
	for _, tc := range []struct {
		state string
		a     *v1beta1.Agent
		want  time.Time
	}{
		{poolmetrics.Discovering, with(nil), at(10)},
		{poolmetrics.Unapproved, with(nil), at(12)},
		{poolmetrics.Free, with(nil), at(14)},
		// A condition that turned before this session began: the session.
		{poolmetrics.Insufficient, with(func(a *v1beta1.Agent) {
			a.Status.Conditions[0] = cond(v1beta1.ValidatedCondition, "False", 3)
		}), at(10)},
		{poolmetrics.Disconnected, with(func(a *v1beta1.Agent) {
			a.Status.Conditions[2] = cond(v1beta1.ConnectedCondition, "False", 30)
		}), at(30)},
		// Unbinding began at the release, before the session (the host
		// has not rebooted yet).
		{poolmetrics.Unbinding, with(nil), at(5)},
		{poolmetrics.Bound, with(func(a *v1beta1.Agent) {
			a.Status.Conditions[3] = cond(v1beta1.BoundCondition, "True", 20)
		}), at(20)},
		{poolmetrics.Installing, with(func(a *v1beta1.Agent) {
			start := metav1.NewTime(at(40))
			a.Status.Progress.StageStartTime = &start
		}), at(40)},
		{poolmetrics.Sanitizing, with(func(a *v1beta1.Agent) {
			start := metav1.NewTime(at(50))
			a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{StartTime: &start}
		}), at(50)},
		{poolmetrics.Quarantined, with(func(a *v1beta1.Agent) {
			failed := metav1.NewTime(at(60))
			a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{State: v1beta1.SanitizationFailed, CompletionTime: &failed}
		}), at(60)},
		// No time recorded: the Agent's creation.
		{poolmetrics.Error, with(nil), at(0)},
	} {
		require.Equal(t, tc.want, poolmetrics.Entered(tc.a, tc.state), tc.state)
	}
}

// agentboot_agents_longest_in_state_seconds is the age of the oldest
// Agent of each state, 0 where there is none.
func TestCollectorReportsTheLongestInState(t *testing.T) {
	s, err := scheme.New()
	require.NoError(t, err)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	registered := func(ago time.Duration) func(*v1beta1.Agent) {
		return func(a *v1beta1.Agent) { a.Status.Registration.SessionStarted = now.Add(-ago).Format(time.RFC3339Nano) }
	}
	c := &poolmetrics.Collector{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(
		agent("team", "a", "env", lifecycle.StateDiscoveringUnbound, registered(90*time.Minute)),
		agent("team", "b", "env", lifecycle.StateDiscoveringUnbound, registered(5*time.Minute)),
	).Build(), Now: func() time.Time { return now }, Log: logr.Discard()}
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "agentboot_agents_longest_in_state_seconds" {
			for _, m := range f.GetMetric() {
				got[key(m)] = m.GetGauge().GetValue()
			}
		}
	}
	require.Equal(t, 5400.0, got["team/env/discovering"])
	require.Equal(t, 0.0, got["team/env/free"])
	require.Len(t, got, len(poolmetrics.States))
}
