// Package shortfall explains, on each Agent-platform NodePool, why
// cluster-api-provider-agent has machines without Agents: "2 more Agent(s)
// wanted: 3 Agent(s) in namespace hardware-inventory match the selector
// "pool=a", 1 already bound, 1 not approved, 1 failing validation
// has-min-memory". cluster-api-provider-agent binds; this package only
// reads and records events.
package shortfall

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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// DeploymentNameLabel is Cluster API's label on the machines of a
// MachineDeployment, which HyperShift names after the NodePool.
const DeploymentNameLabel = "cluster.x-k8s.io/deployment-name"

// Reconciler explains NodePool shortfalls.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader // AgentMachines are listed uncached: their kind may not exist
	Events    events.EventRecorder
	// RetryAfter is how often a short NodePool is looked at again (30s).
	RetryAfter time.Duration
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.RetryAfter <= 0 {
		r.RetryAfter = 30 * time.Second
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodepool-shortfall").
		For(&hypershift.NodePool{}).
		Complete(r)
}

// Reconcile explains one NodePool's shortfall, and looks again while there
// is one (only polling notices that an AgentMachine is still waiting).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	np := &hypershift.NodePool{}
	if err := r.Client.Get(ctx, req.NamespacedName, np); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if np.Spec.Platform.Type != hypershift.AgentPlatform || !np.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	hc := &hypershift.HostedCluster{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: np.Namespace, Name: np.Spec.ClusterName}, hc)
	switch {
	case apierrors.IsNotFound(err):
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "HostedClusterNotFound", "Explain",
			"HostedCluster %s/%s named by spec.clusterName does not exist", np.Namespace, np.Spec.ClusterName)
		return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
	case err != nil:
		return ctrl.Result{}, err
	case hc.Spec.Platform.Type != hypershift.AgentPlatform || hc.Spec.Platform.Agent == nil || hc.Spec.Platform.Agent.AgentNamespace == "":
		r.Events.Eventf(np, nil, corev1.EventTypeWarning, "NotAgentPlatform", "Explain",
			"HostedCluster %s/%s is not on the Agent platform with an agentNamespace", hc.Namespace, hc.Name)
		return ctrl.Result{}, nil
	}
	waiting, err := r.unboundMachines(ctx, ControlPlaneNamespace(hc), np.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if waiting == 0 {
		if np.Spec.Replicas != nil && np.Status.Replicas < *np.Spec.Replicas {
			// Fewer nodes than wanted and no machine waiting yet: Cluster
			// API may still be creating them, and AgentMachines are not
			// watched here, so look again.
			return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
		}
		return ctrl.Result{}, nil
	}
	why, err := r.explain(ctx, np, hc.Spec.Platform.Agent.AgentNamespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.Events.Eventf(np, nil, corev1.EventTypeWarning, "InsufficientAgents", "Explain", "%d more Agent(s) wanted: %s", waiting, why)
	return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
}

// ControlPlaneNamespace is where HyperShift runs a HostedCluster's control
// plane.
func ControlPlaneNamespace(hc *hypershift.HostedCluster) string { return hc.Namespace + "-" + hc.Name }

// unboundMachines counts the NodePool's AgentMachines still waiting for an
// Agent.
func (r *Reconciler) unboundMachines(ctx context.Context, ns, nodePool string) (int, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(binding.AgentMachineList)
	err := r.APIReader.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{DeploymentNameLabel: nodePool})
	switch {
	case meta.IsNoMatchError(err):
		return 0, nil // cluster-api-provider-agent is not installed: no machines
	case err != nil:
		return 0, fmt.Errorf("list AgentMachines: %w", err)
	}
	n := 0
	for _, am := range list.Items {
		if _, bound, _ := unstructured.NestedMap(am.Object, "status", "agentRef"); !bound && am.GetDeletionTimestamp() == nil {
			n++
		}
	}
	return n, nil
}

// explain says how the Agents the NodePool's selector matches stand.
func (r *Reconciler) explain(ctx context.Context, np *hypershift.NodePool, ns string) (string, error) {
	sel := labels.Everything()
	if np.Spec.Platform.Agent != nil && np.Spec.Platform.Agent.AgentLabelSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(np.Spec.Platform.Agent.AgentLabelSelector)
		if err != nil {
			return "spec.platform.agent.agentLabelSelector is invalid: " + err.Error(), nil
		}
		sel = s
	}
	var list v1beta1.AgentList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", err
	}
	counts := map[string]int{}
	for i := range list.Items {
		a := &list.Items[i]
		why := lifecycle.Unbindable(a)
		if why == "failing validation" {
			why += " " + strings.Join(failingValidations(a), ", ")
		}
		if why == "" {
			why = "free (cluster-api-provider-agent has not taken it yet)"
		}
		counts[why]++
	}
	w := fmt.Sprintf("%d Agent(s) in namespace %s match the selector %q", len(list.Items), ns, sel.String())
	for _, reason := range slices.Sorted(maps.Keys(counts)) {
		w += fmt.Sprintf(", %d %s", counts[reason], reason)
	}
	return w, nil
}

func failingValidations(a *v1beta1.Agent) []string {
	var ids []string
	for _, category := range slices.Sorted(maps.Keys(a.Status.ValidationsInfo)) {
		for _, v := range a.Status.ValidationsInfo[category] {
			if v.Status == v1beta1.ValidationFailure || v.Status == v1beta1.ValidationError || v.Status == v1beta1.ValidationPending {
				ids = append(ids, v.ID)
			}
		}
	}
	return ids
}
