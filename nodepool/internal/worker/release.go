package worker

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/installprogress"
	"github.com/agentboot/agentboot/nodepool/internal/binder"
)

// DrainStartedAnnotation records when releasing the Agent began.
const DrainStartedAnnotation = "agentboot.io/drain-started"

// release lets an Agent the binder chose to give up go: its Node is
// cordoned and drained (evictions respect PodDisruptionBudgets) and
// deleted, then the Agent is unbound. After the drain timeout the Node is
// deleted anyway, as Cluster API does with nodeDrainTimeout.
func (r *Reconciler) release(ctx context.Context, a *v1beta1.Agent) (ctrl.Result, error) {
	now := r.Now()
	started, err := time.Parse(time.RFC3339, a.Annotations[DrainStartedAnnotation])
	if err != nil {
		patch := client.MergeFrom(a.DeepCopy())
		a.Annotations[DrainStartedAnnotation] = now.UTC().Format(time.RFC3339)
		return ctrl.Result{}, r.Client.Patch(ctx, a, patch)
	}
	overdue := now.Sub(started) >= r.Timeouts.Drain
	if !installprogress.WroteDisk(&a.Status.Progress) {
		return ctrl.Result{}, r.unbind(ctx, a, "it never joined, so there was no Node to drain")
	}
	hc, err := r.hosted(ctx, a)
	if err != nil {
		if overdue {
			r.Events.Eventf(a, nil, corev1.EventTypeWarning, "DrainTimeout", "Release", "could not reach the hosted cluster for %s (%v); released without draining", r.Timeouts.Drain, err)
			return ctrl.Result{}, r.unbind(ctx, a, "the hosted cluster could not be reached to drain its Node")
		}
		return r.wait(ctx, a, err)
	}
	name := a.Hostname()
	node, err := hc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, r.unbind(ctx, a, "its Node "+name+" does not exist")
	}
	if err != nil {
		return r.wait(ctx, a, fmt.Errorf("read Node %s: %w", name, err))
	}
	if !node.Spec.Unschedulable {
		patch := []byte(`{"spec":{"unschedulable":true}}`)
		if _, err := hc.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return r.wait(ctx, a, fmt.Errorf("cordon Node %s: %w", name, err))
		}
		r.Events.Eventf(a, nil, corev1.EventTypeNormal, "Cordoned", "Release", "Node %s cordoned to be drained", name)
	}
	left, err := drain(ctx, hc, name)
	if err != nil {
		return r.wait(ctx, a, err)
	}
	if len(left) > 0 && !overdue {
		info := fmt.Sprintf("draining Node %s: %d pod(s) left (%s)", name, len(left), strings.Join(left, ", "))
		if err := r.advance(ctx, a, a.Status.Progress.CurrentStage, info); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: r.Poll}, nil
	}
	if len(left) > 0 {
		r.Events.Eventf(a, nil, corev1.EventTypeWarning, "DrainTimeout", "Release", "Node %s not drained within %s, deleted anyway; pods left: %s", name, r.Timeouts.Drain, strings.Join(left, ", "))
	}
	if err := hc.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return r.wait(ctx, a, fmt.Errorf("delete Node %s: %w", name, err))
	}
	return ctrl.Result{}, r.unbind(ctx, a, "its Node "+name+" was drained and deleted")
}

// drain evicts every pod of the Node that a drain moves (not DaemonSet
// pods, not static pods, not those already terminating) and returns those
// still there, with why. An eviction refused with 429 is a
// PodDisruptionBudget that does not allow it now.
func drain(ctx context.Context, hc kubernetes.Interface, node string) ([]string, error) {
	pods, err := hc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods of Node %s: %w", node, err)
	}
	var left []string
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() || daemonSetPod(&p) || p.Annotations[corev1.MirrorPodAnnotationKey] != "" {
			continue
		}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		err := hc.PolicyV1().Evictions(p.Namespace).Evict(ctx, ev)
		switch {
		case err == nil || apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			left = append(left, p.Namespace+"/"+p.Name+": a PodDisruptionBudget does not allow its eviction now")
		default:
			return nil, fmt.Errorf("evict pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return left, nil
}

func daemonSetPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// unbind returns the Agent to the free pool. A host that wrote its disk
// must boot discovery again: its BareMetalHost does that, or the Agent
// shows that a person must.
func (r *Reconciler) unbind(ctx context.Context, a *v1beta1.Agent, why string) error {
	cluster := a.Spec.ClusterDeploymentName.Name
	a.Spec.ClusterDeploymentName = nil
	a.Spec.Role = v1beta1.AgentRoleAutoAssign
	delete(a.Labels, binder.NodePoolLabel)
	delete(a.Labels, binder.NodePoolNamespaceLabel)
	delete(a.Annotations, binder.ReleaseAnnotation)
	delete(a.Annotations, DrainStartedAnnotation)
	if err := r.Client.Update(ctx, a); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.Events.Eventf(a, nil, corev1.EventTypeNormal, "Released", "Release", "released from hosted cluster %s: %s", cluster, why)
	return nil
}
