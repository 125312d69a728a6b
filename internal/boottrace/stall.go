package boottrace

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/macindex"
)

// StallReason is the reason of the event a stalled boot gets.
const StallReason = "BootStalled"

// Stalls tells where people look when a host stops on its boot path: a
// trace not seen for After, whose host never reached its agent's
// heartbeats, gets a warning event on itself, on the BareMetalHost whose
// boot MAC it is and on the Agent with the MAC, saying where it stopped
// and the likely reason. Once per stall (again after a restart of the
// manager at most).
type Stalls struct {
	Client client.Client
	Events events.EventRecorder
	// After is how long a boot may make no progress (default 10 min).
	After time.Duration
	// Home is agentboot's namespace: the traces of MACs nothing claims
	// get no events (no BareMetalHost or Agent has them, and anyone can
	// make them up); the page and agentboot trace show them.
	Home string
	Now  func() time.Time

	mu   sync.Mutex
	told map[types.NamespacedName]time.Time // the LastSeen each trace was evented for
}

// SetupWithManager watches BootTraces.
func (s *Stalls) SetupWithManager(mgr manager.Manager) error {
	if s.After <= 0 {
		s.After = 10 * time.Minute
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if err := macindex.Register(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return ctrl.ControllerManagedBy(mgr).Named("boottrace-stalls").For(&v1alpha1.BootTrace{}).Complete(s)
}

// Reconcile looks at one trace.
func (s *Stalls) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var t v1alpha1.BootTrace
	if err := s.Client.Get(ctx, req.NamespacedName, &t); err != nil {
		if client.IgnoreNotFound(err) == nil {
			s.mu.Lock()
			delete(s.told, req.NamespacedName)
			s.mu.Unlock()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if t.Status.LastSeen == nil || Unclaimed(&t, s.Home) {
		return reconcile.Result{}, nil
	}
	seen := t.Status.LastSeen.Time
	if wait := s.After - s.Now().Sub(seen); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	s.mu.Lock()
	if s.told == nil {
		s.told = map[types.NamespacedName]time.Time{}
	}
	already := s.told[req.NamespacedName].Equal(seen)
	s.mu.Unlock()
	if already {
		return reconcile.Result{}, nil
	}
	mac := t.Status.MACAddress
	var agent *v1beta1.Agent
	var agents v1beta1.AgentList
	if err := s.Client.List(ctx, &agents, client.InNamespace(t.Namespace), client.MatchingFields{macindex.AgentMAC: mac}); err != nil {
		return reconcile.Result{}, err
	}
	for i := range agents.Items {
		if agent == nil || agents.Items[i].CreationTimestamp.After(agent.CreationTimestamp.Time) {
			agent = &agents.Items[i]
		}
	}
	d := Diagnose(&t, agent)
	if d.Done || d.Stopped == Heartbeat {
		return reconcile.Result{}, nil
	}
	// A MAC only a PXE default claims may be made up: told of only once
	// a host with it registered.
	if t.Labels[v1alpha1.ClaimLabel] == v1alpha1.ClaimPXEDefault && agent == nil {
		return reconcile.Result{}, nil
	}
	note := "MAC " + mac + " stopped at " + d.Stopped + " (" + d.Since.UTC().Format(time.RFC3339) + "): " + d.Reason + ". `agentboot trace " + mac + "` shows its whole boot path"
	s.Events.Eventf(&t, nil, corev1.EventTypeWarning, StallReason, "Boot", "%s", note)
	var hosts metal3.BareMetalHostList
	if err := s.Client.List(ctx, &hosts, client.InNamespace(t.Namespace), client.MatchingFields{macindex.BootMAC: mac}); err != nil {
		return reconcile.Result{}, err
	}
	for i := range hosts.Items {
		s.Events.Eventf(&hosts.Items[i], nil, corev1.EventTypeWarning, StallReason, "Boot", "%s", note)
	}
	if agent != nil {
		s.Events.Eventf(agent, nil, corev1.EventTypeWarning, StallReason, "Boot", "%s", note)
	}
	s.mu.Lock()
	s.told[req.NamespacedName] = seen
	s.mu.Unlock()
	return reconcile.Result{}, nil
}
