// Package worker follows an Agent cluster-api-provider-agent bound from its
// installation to a Ready Node of the hosted cluster. It looks at the hosted
// cluster through the kubeconfig its ClusterDeployment names, by polling (no
// watches are kept on hosted clusters): Configuring once the host's kubelet
// asks for a certificate, Joined once its Node exists, Done once the Node is
// Ready and carries the Agent's spec.nodeLabels. It approves only that
// host's kubelet CSRs. Every wait has a timeout that ends in Failed with the
// reason, so no host hangs silently. Scale-down is Cluster API's: it drains
// and deletes the Node; cluster-api-provider-agent unbinds the Agent.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/lru"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/poolmetrics"
)

// Timeouts bounds each wait of an installation.
type Timeouts struct {
	// Install is how long the host may go without reporting while it
	// writes its disk (20m).
	Install time.Duration
	// Join is how long after rebooting (or asking for a certificate) the
	// host's Node may take to appear (30m).
	Join time.Duration
	// Ready is how long a joined Node may take to become Ready (20m).
	Ready time.Duration
}

// Reconciler follows bound Agents.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader
	// Bindings reads what a binding rests on (package binding) for every
	// poll: the manager's informer cache. A CSR is approved and a host
	// counted joined only on the binding confirmed through APIReader.
	// Nil: APIReader (SetupWithManager).
	Bindings client.Reader
	Events   events.EventRecorder
	Timeouts Timeouts
	// Poll is how often the hosted cluster is looked at while it cannot be
	// (10s); JoinPoll how often for a host that rebooted into its
	// installation, until its Node is Ready (2s, at most Poll): its
	// kubelet waits for each CSR's approval, and the host for Done. A look
	// is one GET of the Node; the cluster's kubelet CSRs are listed at
	// most once a second for all its hosts (csrLists).
	Poll, JoinPoll time.Duration
	// CallTimeout bounds each call to a hosted cluster (30s).
	CallTimeout time.Duration
	// NoCSRApproval leaves every kubelet CSR for a person to approve; each
	// is named in an event.
	NoCSRApproval bool
	// BehindNAT: the agent API does not see hosts' own addresses.
	BehindNAT bool
	// ClockSkew is how much older than its AgentMachine a kubelet CSR may
	// be and still be approved (zero means 10s): the hosted cluster's apiserver and
	// the management cluster's stamp them, each with its own clock.
	ClockSkew time.Duration
	Now       func() time.Time
	// Passes, when set, is told of each finished pass over an Agent:
	// tests wait on passes, not on the wall clock.
	Passes observe.Hook

	clients clients
	csrs    csrLists
	busy    clusterPolls
	// refused remembers the last refusal event per CSR, so each is said
	// once (bounded: CSRs come and go).
	refused *lru.Cache
}

// SetupWithManager follows bound Agents.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Timeouts.Install <= 0 {
		r.Timeouts.Install = 20 * time.Minute
	}
	if r.Timeouts.Join <= 0 {
		r.Timeouts.Join = 30 * time.Minute
	}
	if r.Timeouts.Ready <= 0 {
		r.Timeouts.Ready = 20 * time.Minute
	}
	if r.Poll <= 0 {
		r.Poll = 10 * time.Second
	}
	if r.JoinPoll <= 0 {
		r.JoinPoll = min(defaultJoinPoll, r.Poll)
	}
	if r.CallTimeout <= 0 {
		r.CallTimeout = 30 * time.Second
	}
	if r.ClockSkew <= 0 {
		r.ClockSkew = defaultClockSkew
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Bindings == nil {
		r.Bindings = r.APIReader
	}
	r.refused = lru.New(4096)
	bound := predicate.NewPredicateFuncs(func(o client.Object) bool { return lifecycle.Bound(o.(*v1beta1.Agent)) })
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodepool-worker").
		For(&v1beta1.Agent{}, builder.WithPredicates(bound)).
		// A poll waits on a hosted cluster's apiserver (a Node, the
		// kubelet CSRs): one at a time, 500 joining hosts polled every
		// 2 s would each have to take under 4 ms.
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrentPolls}).
		Complete(observe.Passes(r, r.Passes))
}

// maxPollsPerCluster is how many of the worker's concurrentPolls one
// hosted cluster may hold at once: a cluster whose apiserver hangs (a
// tenant's webhook on CSR approval, say) holds these for their calls'
// timeout, not every poll of every tenant's hosts. Half: one cluster
// installing 200 hosts needs 8 at once to poll each every 2 s (at 2,
// make bench-install's CSR approvals took 32 s at the 99th percentile).
const maxPollsPerCluster = concurrentPolls / 2

// clusterPolls counts the polls in flight per hosted cluster (by client).
type clusterPolls struct {
	mu sync.Mutex
	n  map[kubernetes.Interface]int
}

// take claims one of hc's polls; ok is false when it holds all of its.
func (c *clusterPolls) take(hc kubernetes.Interface) (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[kubernetes.Interface]int{}
	}
	if c.n[hc] >= maxPollsPerCluster {
		return nil, false
	}
	c.n[hc]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.n[hc]--; c.n[hc] <= 0 {
			delete(c.n, hc)
		}
	}, true
}

// defaultJoinPoll is how often a host that rebooted into its installation
// is looked for in its hosted cluster.
const defaultJoinPoll = 2 * time.Second

// concurrentPolls is how many bound Agents the worker looks at at once;
// each mostly waits on a hosted cluster's apiserver.
const concurrentPolls = 16

// Reconcile moves one bound Agent along.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	a := &v1beta1.Agent{}
	if err := r.Client.Get(ctx, req.NamespacedName, a); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !lifecycle.Bound(a) || !a.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	p := a.Status.Progress
	now := r.Now()
	switch {
	case p.CurrentStage == "" || lifecycle.Finished(p.CurrentStage):
		return ctrl.Result{}, nil
	case lifecycle.StageIndex(p.CurrentStage) < lifecycle.StageIndex(v1beta1.StageRebooting):
		// The host is writing its disk and reports as it goes.
		last := updated(p)
		if now.Sub(last) >= r.Timeouts.Install {
			return r.fail(ctx, a, fmt.Sprintf("the host stopped reporting during %q: nothing for %s", p.CurrentStage, r.Timeouts.Install))
		}
		return ctrl.Result{RequeueAfter: last.Add(r.Timeouts.Install).Sub(now) + time.Second}, nil
	}
	return r.join(ctx, a)
}

// join looks for the host in the hosted cluster.
func (r *Reconciler) join(ctx context.Context, a *v1beta1.Agent) (ctrl.Result, error) {
	p := a.Status.Progress
	now := r.Now()
	started := now
	if p.StageStartTime != nil {
		started = p.StageStartTime.Time
	}
	name := lifecycle.NodeName(a)
	limit, what := r.Timeouts.Join, "no Node named "+name+" appeared"
	if p.CurrentStage == v1beta1.StageJoined {
		limit, what = r.Timeouts.Ready, "Node "+name+" did not become Ready"
	}
	if now.Sub(started) >= limit {
		return r.fail(ctx, a, fmt.Sprintf("%s within %s of %q", what, limit, p.CurrentStage))
	}
	hc, b, err := r.hosted(ctx, a)
	if err != nil {
		return r.wait(ctx, a, err)
	}
	release, ok := r.busy.take(hc)
	if !ok {
		// Its cluster already holds its share of the worker's polls (its
		// apiserver slow, or hung): looked at again shortly, this worker
		// free for other clusters meanwhile.
		return ctrl.Result{RequeueAfter: r.JoinPoll}, nil
	}
	defer release()
	// What the cache said holds is enough to look; to approve, or to call
	// the host joined, the binding must still hold at the apiserver.
	confirmed := false
	confirm := func() error {
		if confirmed {
			return nil
		}
		if _, err := binding.Confirm(ctx, r.APIReader, a, b); err != nil {
			return err
		}
		confirmed = true
		return nil
	}
	node, err := hc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = nil
	case err != nil:
		return r.wait(ctx, a, fmt.Errorf("read Node %s in the hosted cluster: %w", name, err))
	}
	var rebooted time.Time
	if p.CurrentStage == v1beta1.StageRebooting && p.StageStartTime != nil {
		rebooted = p.StageStartTime.Time
	}
	pending, approved, err := r.approveCSRs(ctx, hc, a, name, node != nil, b.AgentMachineCreated, rebooted, confirm)
	if err != nil {
		return r.wait(ctx, a, err)
	}
	next, info := p.CurrentStage, p.ProgressInfo
	switch {
	case node != nil && nodeReady(node):
		if err := confirm(); err != nil {
			return r.wait(ctx, a, err)
		}
		if err := r.label(ctx, hc, a, node); err != nil {
			return r.wait(ctx, a, err)
		}
		next, info = v1beta1.StageDone, "Node "+name+" is Ready"
	case node != nil:
		next, info = v1beta1.StageJoined, "Node "+name+" exists and is not Ready yet"
	case p.CurrentStage == v1beta1.StageRebooting && (approved > 0 || r.NoCSRApproval && pending > 0):
		// Only a certificate given (or, without automatic approval, asked
		// for) moves on: while the stage is Rebooting, its start is when
		// the host rebooted, which a client CSR must come after; a CSR
		// refused must not end that.
		next, info = v1beta1.StageConfiguring, "the host's kubelet asked for its certificate"
	case p.CurrentStage == v1beta1.StageRebooting && pending > 0:
		info = "the host's kubelet CSRs wait: see the Agent's CSRNotApproved events"
	case p.CurrentStage == v1beta1.StageRebooting:
		info = "waiting for the installed host to boot and its kubelet to ask for a certificate"
	}
	if next != p.CurrentStage || info != p.ProgressInfo {
		if err := r.advance(ctx, a, next, info); err != nil {
			return ctrl.Result{}, err
		}
		if next == v1beta1.StageDone {
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, "Joined", "Join", "Node %s is Ready in hosted cluster %s", name, a.Spec.ClusterDeploymentName.Name)
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{RequeueAfter: r.JoinPoll}, nil
}

// label applies the Agent's spec.nodeLabels to its Node, as
// assisted-service does once the Node is Ready.
func (r *Reconciler) label(ctx context.Context, hc kubernetes.Interface, a *v1beta1.Agent, node *corev1.Node) error {
	missing := map[string]string{}
	for k, v := range a.Spec.NodeLabels {
		if have, ok := node.Labels[k]; !ok || have != v {
			missing[k] = v
		}
	}
	if len(missing) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": missing}})
	if err != nil {
		return err
	}
	if _, err := hc.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label Node %s with spec.nodeLabels: %w", node.Name, err)
	}
	r.Events.Eventf(a, nil, corev1.EventTypeNormal, "NodeLabeled", "Join", "Node %s labelled with spec.nodeLabels", node.Name)
	return nil
}

// wait shows why the hosted cluster cannot be looked at, and looks again.
// A binding that does not hold is also an event.
func (r *Reconciler) wait(ctx context.Context, a *v1beta1.Agent, err error) (ctrl.Result, error) {
	var w waiting
	switch {
	case binding.IsRefused(err):
		if a.Status.Progress.ProgressInfo != "waiting: "+err.Error() {
			r.Events.Eventf(a, nil, corev1.EventTypeWarning, "BindingRefused", "Join", "%v", err)
		}
	case !errors.As(err, &w):
		err = fmt.Errorf("hosted cluster: %w", err)
	}
	if err := r.advance(ctx, a, a.Status.Progress.CurrentStage, "waiting: "+err.Error()); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.Poll}, nil
}

// advance writes a stage with optimistic locking: the host's own reports
// may land at the same time.
func (r *Reconciler) advance(ctx context.Context, a *v1beta1.Agent, stage v1beta1.HostStage, info string) error {
	p := a.Status.Progress
	if stage == p.CurrentStage && info == p.ProgressInfo {
		return nil
	}
	pct := p.InstallationPercentage
	if stage == v1beta1.StageDone {
		pct = 100
	}
	// The same stage again keeps its start and takes the new detail.
	next := a.DeepCopy()
	if err := lifecycle.Advance(next, stage, pct, info, r.Now()); err != nil {
		return err
	}
	err := r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return nil // changed meanwhile; the change brings it back here
	}
	if err == nil && stage == v1beta1.StageDone && p.CurrentStage != v1beta1.StageDone {
		if b := conditions.Find(a.Status.Conditions, v1beta1.BoundCondition); b != nil && b.Status == corev1.ConditionTrue {
			poolmetrics.ObservePhase(poolmetrics.PhaseBoundToDone, b.LastTransitionTime.Time, r.Now())
		}
	}
	return err
}

func (r *Reconciler) fail(ctx context.Context, a *v1beta1.Agent, why string) (ctrl.Result, error) {
	if err := r.advance(ctx, a, v1beta1.StageFailed, why); err != nil {
		return ctrl.Result{}, err
	}
	r.Events.Eventf(a, nil, corev1.EventTypeWarning, v1beta1.InstallationFailedReason, "Install", "the installation failed: %s", why)
	return ctrl.Result{}, nil
}

// updated is when the host last reported.
func updated(p v1beta1.HostProgressInfo) time.Time {
	switch {
	case p.StageUpdateTime != nil:
		return p.StageUpdateTime.Time
	case p.StageStartTime != nil:
		return p.StageStartTime.Time
	}
	return time.Time{}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
