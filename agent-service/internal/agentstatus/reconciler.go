// Package agentstatus is the Agent controller: from what a host reported
// (status.inventory), its liveness Lease and its InfraEnv it derives the
// Agent's validations, conditions, state, role and inventory labels.
package agentstatus

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/poolmetrics"
)

// Reconciler keeps Agents' status true to what their hosts report.
type Reconciler struct {
	Client client.Client
	// APIReader reads past the cache, to tell an Agent that is gone from
	// one the cache has not seen yet.
	APIReader client.Reader
	Events    events.EventRecorder
	// LeaseNamespace holds the liveness Leases.
	LeaseNamespace string
	Requirements   Requirements
	// DisconnectAfter is how long a silent host stays connected.
	DisconnectAfter time.Duration
	Now             func() time.Time
	// Passes, when set, is told of each finished pass: tests wait on
	// passes, not on the wall clock.
	Passes observe.Hook
}

// SetupWithManager watches Agents (and their neighbours by hostname), their
// Leases and their InfraEnvs.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("agent").
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		For(&v1beta1.Agent{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			l := o.(*coordinationv1.Lease)
			if ns, name, ok := hosts.LeaseOf(l); ok {
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
			}
			return nil
		})).
		Watches(&v1beta1.InfraEnv{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			// The Agents whose hosts registered through it (their record;
			// the label is tenant-writable).
			var list v1beta1.AgentList
			if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{hosts.InfraEnvIndex: string(o.GetUID())}); err != nil {
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for _, a := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&a)})
			}
			return reqs
		})).
		Watches(&v1beta1.Agent{}, r.sameHostnameHandler()).
		Complete(observe.Passes(r, r.Passes))
}

// sameHostnameHandler re-reconciles the other Agents that share a hostname
// an Agent takes or gives up, so a silent host's hostname-unique
// validation follows its neighbours' changes rather than its own.
func (r *Reconciler) sameHostnameHandler() handler.EventHandler {
	enqueue := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], self *v1beta1.Agent, hostnames ...string) {
		seen := map[string]bool{}
		for _, h := range hostnames {
			if h == "" || seen[h] {
				continue
			}
			seen[h] = true
			var same v1beta1.AgentList
			if err := r.Client.List(ctx, &same, client.InNamespace(self.Namespace), client.MatchingFields{hosts.HostnameIndex: h}); err != nil {
				continue // the cache is stopping; nothing left to keep true
			}
			for _, o := range same.Items {
				if o.Name != self.Name {
					q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&o)})
				}
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			a := e.Object.(*v1beta1.Agent)
			enqueue(ctx, q, a, a.Hostname())
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			before, after := e.ObjectOld.(*v1beta1.Agent), e.ObjectNew.(*v1beta1.Agent)
			if before.Hostname() != after.Hostname() {
				enqueue(ctx, q, after, before.Hostname(), after.Hostname())
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if a, ok := e.Object.(*v1beta1.Agent); ok {
				enqueue(ctx, q, a, a.Hostname())
			}
		},
	}
}

// Reconcile observes and writes labels and status once each, when changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var a v1beta1.Agent
	if err := r.Client.Get(ctx, req.NamespacedName, &a); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.forget(ctx, req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	if !a.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	f, err := r.observe(ctx, &a)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.patchLabels(ctx, &a); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.patchStatus(ctx, &a, f); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.untilDisconnect(f)}, nil
}

// untilDisconnect is when Connected must flip if the host stays silent;
// polling is the only way to notice silence.
func (r *Reconciler) untilDisconnect(f *facts) time.Duration {
	if !f.connected {
		return 0
	}
	return f.lastSeen.Add(r.DisconnectAfter).Sub(r.Now()) + time.Second
}

// forget deletes the Lease of an Agent that is gone. A host's Lease is
// created right after its Agent, and its watch event can reach this
// controller before the Agent reaches the cache: only the apiserver can
// tell that the Agent is really gone. When it is not, the Agent's own
// event follows and reconciles it.
func (r *Reconciler) forget(ctx context.Context, key client.ObjectKey) error {
	err := r.APIReader.Get(ctx, key, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "Agent"}})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.LeaseNamespace, Name: hosts.LeaseName(key.Namespace, key.Name)}}
	return client.IgnoreNotFound(r.Client.Delete(ctx, l))
}

func (r *Reconciler) observe(ctx context.Context, a *v1beta1.Agent) (*facts, error) {
	f := &facts{agent: a, req: r.Requirements}
	var ie v1beta1.InfraEnv
	// The InfraEnv the host registered through (its record), not the
	// tenant-writable label: its requirements are the ones that apply.
	rec := lifecycle.Registration(a)
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: rec.InfraEnv}, &ie)
	switch {
	case rec.InfraEnv == "":
	case err == nil && string(ie.UID) == rec.InfraEnvUID:
		f.req = r.Requirements.For(&ie)
	case err == nil:
		// Deleted and recreated under the same name since the host
		// registered: not its InfraEnv; the defaults apply until it
		// registers again.
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	var l coordinationv1.Lease
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: r.LeaseNamespace, Name: hosts.LeaseName(a.Namespace, a.Name)}, &l)
	switch {
	case err == nil && l.Spec.RenewTime != nil:
		f.lastSeen = l.Spec.RenewTime.Time
		f.connected = r.Now().Sub(f.lastSeen) < r.DisconnectAfter
		if s, ok := l.Annotations[hosts.ClockOffsetAnnotation]; ok {
			if off, err := strconv.ParseInt(s, 10, 64); err == nil {
				f.clockOffset, f.clockKnown = time.Duration(off)*time.Second, true
			}
		}
	case apierrors.IsNotFound(err):
		// Registering is contact too: until the host's first Lease reaches
		// the cache it counts from the Agent's creation, so a new host does
		// not show disconnected for a moment.
		f.lastSeen = a.CreationTimestamp.Time
		f.connected = r.Now().Sub(f.lastSeen) < r.DisconnectAfter
	case err != nil:
		return nil, err
	}
	if h := a.Hostname(); h != "" {
		var same v1beta1.AgentList
		if err := r.Client.List(ctx, &same, client.InNamespace(a.Namespace), client.MatchingFields{hosts.HostnameIndex: h}); err != nil {
			return nil, err
		}
		for _, o := range same.Items {
			if o.Name != a.Name {
				f.sameHostname = append(f.sameHostname, o.Name)
			}
		}
	}
	return f, nil
}

// Inventory labels, for selecting Agents by hardware.
const (
	labelArch      = v1beta1.InventoryLabelPrefix + "cpu-architecture"
	labelVirt      = v1beta1.InventoryLabelPrefix + "cpu-virtenabled"
	labelVendor    = v1beta1.InventoryLabelPrefix + "host-manufacturer"
	labelProduct   = v1beta1.InventoryLabelPrefix + "host-productname"
	labelVirtual   = v1beta1.InventoryLabelPrefix + "host-isvirtual"
	labelNonRotary = v1beta1.InventoryLabelPrefix + "storage-hasnonrotationaldisk"
)

var labelInvalid = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// labelValue makes s a valid label value (63 characters of [A-Za-z0-9_.-],
// starting and ending alphanumeric).
func labelValue(s string) string {
	s = labelInvalid.ReplaceAllString(strings.TrimSpace(s), "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}

func inventoryLabels(a *v1beta1.Agent) map[string]string {
	inv := a.Status.Inventory
	if inv.ReportTime == nil {
		return nil
	}
	nonRotary := false
	for _, d := range inv.Disks {
		nonRotary = nonRotary || d.DriveType == "SSD"
	}
	virt := inv.Virtualization != nil && inv.Virtualization.Verdict == v1beta1.VirtSupported
	return map[string]string{
		labelArch:      labelValue(inv.CPU.Architecture),
		labelVirt:      strconv.FormatBool(virt),
		labelVendor:    labelValue(inv.SystemVendor.Manufacturer),
		labelProduct:   labelValue(inv.SystemVendor.ProductName),
		labelVirtual:   strconv.FormatBool(inv.SystemVendor.Virtual),
		labelNonRotary: strconv.FormatBool(nonRotary),
	}
}

func (r *Reconciler) patchLabels(ctx context.Context, a *v1beta1.Agent) error {
	want := inventoryLabels(a)
	changed := false
	for k, v := range want {
		if a.Labels[k] != v {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	patch := client.MergeFrom(a.DeepCopy())
	if a.Labels == nil {
		a.Labels = map[string]string{}
	}
	for k, v := range want {
		a.Labels[k] = v
	}
	return r.Client.Patch(ctx, a, patch)
}

func (r *Reconciler) patchStatus(ctx context.Context, a *v1beta1.Agent, f *facts) error {
	o := lifecycle.Observed{Connected: f.connected, Silence: r.silence(f), Inventoried: inventoried(f)}
	vs := validate(f)
	_, o.PendingIDs, o.Failing = summary(vs)
	o.FailingMessages = failingMessages(vs)
	next := a.DeepCopy()
	forgot := lifecycle.Settle(next, o, vs, r.Now())
	if equality.Semantic.DeepEqual(next.Status, a.Status) {
		return nil
	}
	patch := client.MergeFrom(a)
	if forgot {
		// Forgetting writes the sanitization owed: from a stale cache it
		// could undo one already under way, so it must be of the latest.
		patch = client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{})
	}
	if err := r.Client.Status().Patch(ctx, next, patch); err != nil {
		return fmt.Errorf("patch Agent status: %w", err)
	}
	r.recordTransitions(next, a, next)
	*a = *next
	return nil
}

func failingMessages(vs v1beta1.ValidationsStatus) string {
	var out []string
	for _, c := range validations {
		for _, v := range vs[c.category] {
			if v.Status == v1beta1.ValidationFailure || v.Status == v1beta1.ValidationError {
				out = append(out, v.ID+": "+v.Message)
			}
		}
	}
	return strings.Join(out, "; ")
}

// silence says how long a disconnected host has been silent.
func (r *Reconciler) silence(f *facts) string {
	if f.lastSeen.IsZero() {
		return "a while"
	}
	return "more than " + r.DisconnectAfter.String() + " (last at " + f.lastSeen.UTC().Format(time.RFC3339) + ")"
}

// sessionStart is when the host's registration session began, or zero.
func sessionStart(a *v1beta1.Agent) time.Time {
	t, err := time.Parse(time.RFC3339Nano, lifecycle.Registration(a).SessionStarted)
	if err != nil {
		return time.Time{}
	}
	return t
}

// releasedAt is when a host that was once handed an installation was
// released from its cluster (its Bound condition turned False), or zero
// for a host never handed one.
func releasedAt(a *v1beta1.Agent) time.Time {
	if a.Status.DiskSanitization == nil { // made when an installation is handed out
		return time.Time{}
	}
	b := conditions.Find(a.Status.Conditions, v1beta1.BoundCondition)
	if b == nil || b.Status != corev1.ConditionFalse || b.LastTransitionTime.IsZero() {
		return time.Time{}
	}
	return b.LastTransitionTime.Time
}

// recordTransitions emits events when approval, connectivity or validations
// change.
func (r *Reconciler) recordTransitions(a, before, after *v1beta1.Agent) {
	was := func(t v1beta1.ConditionType) *v1beta1.Condition { return conditions.Find(before.Status.Conditions, t) }
	now := func(t v1beta1.ConditionType) *v1beta1.Condition { return conditions.Find(after.Status.Conditions, t) }
	if b, n := was(v1beta1.RequirementsMetCondition), now(v1beta1.RequirementsMetCondition); n != nil {
		if (b == nil || b.Reason == v1beta1.AgentIsNotApprovedReason) && n.Reason != v1beta1.AgentIsNotApprovedReason {
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, "Approved", "Approve", "the agent was approved")
			poolmetrics.ObservePhase(poolmetrics.PhaseRegisteredToApproved, sessionStart(after), r.Now())
		}
		if n.Status == corev1.ConditionTrue && (b == nil || b.Status != corev1.ConditionTrue) {
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, v1beta1.AgentReadyReason, "Validate", "the agent is ready to be bound")
			if n.Reason == v1beta1.AgentReadyReason {
				poolmetrics.ObservePhase(poolmetrics.PhaseRegisteredToReady, sessionStart(after), r.Now())
				poolmetrics.ObservePhase(poolmetrics.PhaseReleasedToReady, releasedAt(after), r.Now())
			}
		}
	}
	if b, n := was(v1beta1.ValidatedCondition), now(v1beta1.ValidatedCondition); n != nil && (b == nil || b.Reason != n.Reason || b.Message != n.Message) {
		switch n.Reason {
		case v1beta1.ValidationsFailingReason:
			r.Events.Eventf(a, nil, corev1.EventTypeWarning, n.Reason, "Validate", "%s", n.Message)
		case v1beta1.ValidationsPassingReason:
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, n.Reason, "Validate", "%s", n.Message)
		}
	}
	if b, n := was(v1beta1.ConnectedCondition), now(v1beta1.ConnectedCondition); n != nil && b != nil && b.Status != n.Status {
		eventType := corev1.EventTypeNormal
		if n.Status != corev1.ConditionTrue {
			eventType = corev1.EventTypeWarning
		}
		r.Events.Eventf(a, nil, eventType, n.Reason, "Heartbeat", "%s", n.Message)
	}
}
