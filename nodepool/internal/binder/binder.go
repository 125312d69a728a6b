// Package binder is the NodePool binder: it keeps spec.replicas Agents bound
// to each Agent-platform NodePool.
package binder

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
)

// Labels agentboot puts on the Agents it binds, and the ones it respects.
const (
	// NodePoolLabel names the NodePool an Agent is bound to.
	NodePoolLabel = "agentboot.io/nodepool"
	// NodePoolNamespaceLabel is that NodePool's namespace.
	NodePoolNamespaceLabel = "agentboot.io/nodepool-namespace"
	// AgentMachineRefLabel marks Agents cluster-api-provider-agent bound.
	AgentMachineRefLabel = "agentMachineRef"
	// DeploymentNameLabel is Cluster API's label on machines of a
	// MachineDeployment, which HyperShift names after the NodePool.
	DeploymentNameLabel = "cluster.x-k8s.io/deployment-name"
	// ReleaseAnnotation marks a bound Agent the binder gave up on scale
	// down; the worker controller drains its Node and unbinds it. It no
	// longer counts towards its NodePool.
	ReleaseAnnotation = "agentboot.io/release"
)

// agentMachineGVK is cluster-api-provider-agent's machine kind.
var agentMachineGVK = schema.GroupVersionKind{Group: "capi-provider.agent-install.openshift.io", Version: "v1beta1", Kind: "AgentMachineList"}

// nodePoolMetadata is a NodePool read for its existence only.
func nodePoolMetadata() *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: hypershift.GroupVersion.String(), Kind: "NodePool"}}
}

// Reconciler binds Agents to NodePools.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader // AgentMachines are listed uncached: their kind may not exist
	Events    events.EventRecorder
	// RetryAfter is how often an unsatisfied NodePool is looked at again.
	RetryAfter time.Duration
}

// SetupWithManager registers the binder; every Agent change wakes the
// Agent-platform NodePools, since any Agent may become a candidate.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.RetryAfter <= 0 {
		r.RetryAfter = 30 * time.Second
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodepool-binder").
		For(&hypershift.NodePool{}).
		Watches(&v1beta1.Agent{}, handler.EnqueueRequestsFromMapFunc(r.agentNodePools)).
		Complete(r)
}

// Reconcile keeps one NodePool's bound Agents at spec.replicas.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	np := &hypershift.NodePool{}
	if err := r.Client.Get(ctx, req.NamespacedName, np); err != nil {
		if apierrors.IsNotFound(err) {
			// A deleted NodePool wants no Agents. The cache may only be
			// late, as when another replica bound an Agent to a NodePool
			// created a moment ago: only the apiserver can tell.
			if err := r.APIReader.Get(ctx, req.NamespacedName, nodePoolMetadata()); !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			return r.release(ctx, req.NamespacedName, nil, 0)
		}
		return ctrl.Result{}, err
	}
	if np.Spec.Platform.Type != hypershift.AgentPlatform {
		return ctrl.Result{}, nil
	}
	hc, wait := r.hostedCluster(ctx, np)
	if hc == nil {
		return wait, nil
	}
	served, err := r.servedByCAPI(ctx, hc, np)
	if err != nil || served {
		return ctrl.Result{}, err
	}
	want := 0
	if np.Spec.Replicas != nil {
		want = int(*np.Spec.Replicas)
	}
	bound, err := r.bound(ctx, client.ObjectKeyFromObject(np))
	if err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case len(bound) < want:
		return r.bind(ctx, np, hc, want-len(bound))
	case len(bound) > want:
		return r.release(ctx, client.ObjectKeyFromObject(np), np, want)
	}
	return ctrl.Result{}, nil
}

// hostedCluster returns the NodePool's Agent-platform HostedCluster, or
// nil and when to look again.
func (r *Reconciler) hostedCluster(ctx context.Context, np *hypershift.NodePool) (*hypershift.HostedCluster, ctrl.Result) {
	hc := &hypershift.HostedCluster{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: np.Namespace, Name: np.Spec.ClusterName}, hc)
	switch {
	case apierrors.IsNotFound(err):
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "HostedClusterNotFound", "Bind",
			"HostedCluster %s/%s named by spec.clusterName does not exist", np.Namespace, np.Spec.ClusterName)
		return nil, ctrl.Result{RequeueAfter: r.RetryAfter}
	case err != nil:
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "HostedClusterUnreadable", "Bind", "read HostedCluster: %v", err)
		return nil, ctrl.Result{RequeueAfter: r.RetryAfter}
	case hc.Spec.Platform.Type != hypershift.AgentPlatform || hc.Spec.Platform.Agent == nil || hc.Spec.Platform.Agent.AgentNamespace == "":
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "NotAgentPlatform", "Bind",
			"HostedCluster %s/%s is not on the Agent platform with an agentNamespace; no Agents are bound", hc.Namespace, hc.Name)
		return nil, ctrl.Result{}
	}
	return hc, ctrl.Result{}
}

// servedByCAPI is true when cluster-api-provider-agent has AgentMachines
// for this NodePool: it binds the Agents itself.
func (r *Reconciler) servedByCAPI(ctx context.Context, hc *hypershift.HostedCluster, np *hypershift.NodePool) (bool, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(agentMachineGVK)
	err := r.APIReader.List(ctx, list, client.InNamespace(ControlPlaneNamespace(hc)), client.MatchingLabels{DeploymentNameLabel: np.Name}, client.Limit(1))
	switch {
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		return false, nil // cluster-api-provider-agent is not installed
	case err != nil:
		return false, fmt.Errorf("list AgentMachines: %w", err)
	}
	return len(list.Items) > 0, nil
}

// ControlPlaneNamespace is where HyperShift runs a HostedCluster's control
// plane (and where its ClusterDeployment and user-data Secrets live).
func ControlPlaneNamespace(hc *hypershift.HostedCluster) string { return hc.Namespace + "-" + hc.Name }

// bound lists the Agents bound to the NodePool at key, except those being
// released.
func (r *Reconciler) bound(ctx context.Context, key client.ObjectKey) ([]v1beta1.Agent, error) {
	var list v1beta1.AgentList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{NodePoolLabel: key.Name, NodePoolNamespaceLabel: key.Namespace}); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(a v1beta1.Agent) bool { return a.Annotations[ReleaseAnnotation] != "" }), nil
}

// bind binds up to n free Agents. Each Agent is updated with the
// resourceVersion it was read at, so when two NodePools (or two manager
// replicas) race for one Agent the API server lets one win and the other
// gets a conflict and looks again.
func (r *Reconciler) bind(ctx context.Context, np *hypershift.NodePool, hc *hypershift.HostedCluster, n int) (ctrl.Result, error) {
	candidates, why, err := r.candidates(ctx, np, hc)
	if err != nil {
		return ctrl.Result{}, err
	}
	taken := 0
	for i := range candidates {
		if n == 0 {
			return ctrl.Result{}, nil
		}
		a := &candidates[i]
		a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Name: hc.Name, Namespace: ControlPlaneNamespace(hc)}
		a.Spec.Role = v1beta1.AgentRoleWorker
		if a.Labels == nil {
			a.Labels = map[string]string{}
		}
		a.Labels[NodePoolLabel], a.Labels[NodePoolNamespaceLabel] = np.Name, np.Namespace
		if err := r.Client.Update(ctx, a); err != nil {
			if apierrors.IsConflict(err) {
				// Someone else changed it first (perhaps bound it): look again.
				return ctrl.Result{Requeue: true}, nil
			}
			return ctrl.Result{}, fmt.Errorf("bind Agent %s/%s: %w", a.Namespace, a.Name, err)
		}
		r.Events.Eventf(np, a, corev1.EventTypeNormal, "AgentBound", "Bind", "Agent %s/%s bound to HostedCluster %s as a worker", a.Namespace, a.Name, hc.Name)
		n--
		taken++
	}
	if n > 0 {
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "InsufficientAgents", "Bind", "%d more Agent(s) wanted: %s", n, why(taken))
		return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
	}
	return ctrl.Result{}, nil
}

// candidates are the free Agents the NodePool may take, oldest first, and
// a sentence on why there are no more once taken of them are bound.
func (r *Reconciler) candidates(ctx context.Context, np *hypershift.NodePool, hc *hypershift.HostedCluster) ([]v1beta1.Agent, func(taken int) string, error) {
	sel := labels.Everything()
	var selText string
	if np.Spec.Platform.Agent != nil && np.Spec.Platform.Agent.AgentLabelSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(np.Spec.Platform.Agent.AgentLabelSelector)
		if err != nil {
			return nil, func(int) string { return "spec.platform.agent.agentLabelSelector is invalid: " + err.Error() }, nil
		}
		sel, selText = s, s.String()
	}
	var list v1beta1.AgentList
	ns := hc.Spec.Platform.Agent.AgentNamespace
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, nil, err
	}
	var free []v1beta1.Agent
	skipped := map[string]int{}
	for _, a := range list.Items {
		if reason := unavailable(&a); reason != "" {
			skipped[reason]++
			continue
		}
		free = append(free, a)
	}
	slices.SortFunc(free, func(a, b v1beta1.Agent) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	why := func(taken int) string {
		skipped["already bound"] += taken
		w := fmt.Sprintf("%d Agent(s) in namespace %s match the selector %q", len(list.Items), ns, selText)
		for _, reason := range slices.Sorted(maps.Keys(skipped)) {
			w += fmt.Sprintf(", %d %s", skipped[reason], reason)
		}
		return w
	}
	return free, why, nil
}

// unavailable says why an Agent cannot be bound now, or "".
func unavailable(a *v1beta1.Agent) string {
	switch {
	case a.Spec.ClusterDeploymentName != nil || a.Labels[NodePoolLabel] != "":
		return "already bound"
	case a.Labels[AgentMachineRefLabel] != "":
		return "held by cluster-api-provider-agent"
	case !a.Spec.Approved:
		return "not approved"
	case !conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition):
		return "not validated"
	case !conditions.IsTrue(a.Status.Conditions, v1beta1.ConnectedCondition):
		return "not connected"
	}
	return ""
}

// release gives up Agents down to want: first those that are not a Ready
// Node (not Done), then the newest. An Agent that has not started
// installing is unbound at once; one that has is marked for the worker
// controller, which drains its Node first.
func (r *Reconciler) release(ctx context.Context, key client.ObjectKey, np *hypershift.NodePool, want int) (ctrl.Result, error) {
	bound, err := r.bound(ctx, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	done := func(a v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageDone }
	slices.SortFunc(bound, func(a, b v1beta1.Agent) int {
		if done(a) != done(b) {
			if done(a) {
				return 1
			}
			return -1
		}
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	for i := range max(len(bound)-want, 0) {
		a := &bound[i]
		verb, what := "unbind", "returned to the free pool"
		if a.Status.Progress.CurrentStage == "" {
			a.Spec.ClusterDeploymentName = nil
			a.Spec.Role = v1beta1.AgentRoleAutoAssign
			delete(a.Labels, NodePoolLabel)
			delete(a.Labels, NodePoolNamespaceLabel)
		} else {
			verb, what = "mark for release", "is being released: its Node is drained, then it is unbound"
			if a.Annotations == nil {
				a.Annotations = map[string]string{}
			}
			a.Annotations[ReleaseAnnotation] = "true"
		}
		if err := r.Client.Update(ctx, a); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{Requeue: true}, nil
			}
			return ctrl.Result{}, fmt.Errorf("%s Agent %s/%s: %w", verb, a.Namespace, a.Name, err)
		}
		if np != nil {
			r.Events.Eventf(np, a, corev1.EventTypeNormal, "AgentReleased", "Unbind", "Agent %s/%s %s", a.Namespace, a.Name, what)
		}
	}
	return ctrl.Result{}, nil
}

// agentNodePools wakes every Agent-platform NodePool when an Agent changes.
func (r *Reconciler) agentNodePools(ctx context.Context, o client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	if np := o.GetLabels()[NodePoolLabel]; np != "" {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: o.GetLabels()[NodePoolNamespaceLabel], Name: np}})
	}
	var pools hypershift.NodePoolList
	if err := r.Client.List(ctx, &pools); err != nil {
		return reqs
	}
	for _, np := range pools.Items {
		if np.Spec.Platform.Type == hypershift.AgentPlatform {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&np)})
		}
	}
	return reqs
}
