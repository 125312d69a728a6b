// Package reconciler is the Agent controller: from what a host reported
// (status.inventory), its liveness Lease and its InfraEnv it derives the
// Agent's validations, conditions, state, role and inventory labels.
package reconciler

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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/agent/service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/installprogress"
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
}

// SetupWithManager watches Agents, their Leases and their InfraEnvs.
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
			var list v1beta1.AgentList
			if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingLabels{v1beta1.InfraEnvNameLabel: o.GetName()}); err != nil {
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for _, a := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&a)})
			}
			return reqs
		})).
		Complete(r)
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
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: a.Labels[v1beta1.InfraEnvNameLabel]}, &ie)
	switch {
	case err == nil:
		f.req = r.Requirements.For(&ie)
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

func inventoryLabels(inv *v1beta1.HostInventory) map[string]string {
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
	want := inventoryLabels(&a.Status.Inventory)
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

// Host states of a host in the free pool.
const (
	StateDiscoveringUnbound  = "discovering-unbound"
	StateKnownUnbound        = "known-unbound"
	StateInsufficientUnbound = "insufficient-unbound"
	StateDisconnectedUnbound = "disconnected-unbound"
)

func (r *Reconciler) patchStatus(ctx context.Context, a *v1beta1.Agent, f *facts) error {
	now := metav1.NewTime(r.Now())
	st := a.Status.DeepCopy()
	if a.Spec.ClusterDeploymentName == nil && !installprogress.WroteDisk(&st.Progress) {
		// Unbound before its disk was written: the host still runs
		// discovery, so the installation is forgotten and it is free.
		installprogress.Reset(&st.Progress)
		st.InstallationDiskID = ""
	}
	// The installation as it will be written.
	view := &v1beta1.Agent{ObjectMeta: a.ObjectMeta, Spec: a.Spec, Status: v1beta1.AgentStatus{Progress: st.Progress}}
	st.ValidationsInfo = validate(f)
	passing, pendingIDs, failing := summary(st.ValidationsInfo)
	bound := conditions.New(v1beta1.BoundCondition, false, v1beta1.UnboundReason, "The agent is not bound to any cluster")
	if discovery.Released(view) {
		bound = conditions.New(v1beta1.BoundCondition, false, v1beta1.UnbindingPendingUserActionRsn, "The agent was released from its cluster: reboot the host into the discovery image")
		if bmh := a.Labels[v1beta1.BMHLabel]; bmh != "" {
			bound = conditions.New(v1beta1.BoundCondition, false, v1beta1.UnbindingReason, "The agent was released from its cluster; BareMetalHost "+bmh+" reboots the host into the discovery image")
		}
	}
	if cd := a.Spec.ClusterDeploymentName; cd != nil {
		bound = conditions.New(v1beta1.BoundCondition, true, v1beta1.BoundReason, "The agent is bound to cluster "+cd.Namespace+"/"+cd.Name)
		st.Role = a.Spec.Role
	}
	if st.Role == "" || a.Spec.ClusterDeploymentName == nil {
		st.Role = v1beta1.AgentRoleAutoAssign
	}

	var validated v1beta1.Condition
	switch {
	case passing:
		validated = conditions.New(v1beta1.ValidatedCondition, true, v1beta1.ValidationsPassingReason, "The agent's validations are passing")
	case !inventoried(f):
		validated = conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsUnknownReason, "The agent's validations have not yet been calculated")
	case len(failing) == 0:
		validated = conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsUserPendingReason, "The agent's validations are pending: "+strings.Join(pendingIDs, ", "))
	default:
		validated = conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsFailingReason, "The agent's validations are failing: "+failingMessages(st.ValidationsInfo))
	}
	connected := conditions.New(v1beta1.ConnectedCondition, true, v1beta1.AgentConnectedReason, "The agent's connection to the installation service is unimpaired")
	if !f.connected {
		connected = conditions.New(v1beta1.ConnectedCondition, false, v1beta1.AgentDisconnectedReason, "The agent has not contacted the installation service in a while; it is disconnected")
	}
	var requirements v1beta1.Condition
	installing := a.Spec.ClusterDeploymentName != nil && st.Progress.CurrentStage != ""
	switch {
	case installing:
		requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentAlreadyInstallingReason, "The agent cannot begin the installation because it has already started")
	case !a.Spec.Approved:
		requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentIsNotApprovedReason, "The agent is not approved")
	case passing && f.connected:
		requirements = conditions.New(v1beta1.RequirementsMetCondition, true, v1beta1.AgentReadyReason, "The agent is ready to begin the installation")
	default:
		requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentNotReadyReason, "The agent is not ready: "+notReady(f.connected, validated))
	}
	for _, c := range []v1beta1.Condition{
		conditions.New(v1beta1.SpecSyncedCondition, true, v1beta1.SyncOKReason, "The Spec has been successfully applied"),
		connected,
		requirements,
		validated,
		installed(view),
		bound,
	} {
		st.Conditions = conditions.Set(st.Conditions, c, now)
	}
	st.DebugInfo.State, st.DebugInfo.StateInfo = state(f, passing, pendingIDs, failing)
	if a.Spec.ClusterDeploymentName != nil {
		// Bound hosts drop the -unbound suffix, as in assisted-service.
		st.DebugInfo.State = strings.TrimSuffix(st.DebugInfo.State, "-unbound")
		if st.DebugInfo.State == "known" {
			st.DebugInfo.StateInfo = "Host is bound to cluster " + a.Spec.ClusterDeploymentName.Name + " and ready to be installed"
		}
	}
	if s, info := installState(view); s != "" {
		st.DebugInfo.State, st.DebugInfo.StateInfo = s, info
	}

	if equality.Semantic.DeepEqual(st, &a.Status) {
		return nil
	}
	before := a.Status.DeepCopy()
	patch := client.MergeFrom(a.DeepCopy())
	a.Status = *st
	if err := r.Client.Status().Patch(ctx, a, patch); err != nil {
		return fmt.Errorf("patch Agent status: %w", err)
	}
	r.recordTransitions(a, before, st)
	return nil
}

// Host states of an installation.
const (
	StateInstalling              = "installing"
	StateInstallingInProgress    = "installing-in-progress"
	StateAddedToExistingCluster  = "added-to-existing-cluster"
	StateError                   = "error"
	StateUnbinding               = "unbinding"
	StateUnbindingPendingUserAct = "unbinding-pending-user-action"
)

// installState is the state an installation puts the host in, or "" when
// there is none.
func installState(a *v1beta1.Agent) (string, string) {
	p := &a.Status.Progress
	switch {
	case p.CurrentStage == "":
		return "", ""
	case a.Spec.ClusterDeploymentName == nil && a.Labels[v1beta1.BMHLabel] != "":
		return StateUnbinding, "Host was released from its cluster; its BareMetalHost reboots it into the discovery image"
	case a.Spec.ClusterDeploymentName == nil:
		return StateUnbindingPendingUserAct, "Host was released from its cluster: reboot the host into the discovery image"
	case p.CurrentStage == v1beta1.StageFailed:
		return StateError, "Host failed to install: " + p.ProgressInfo
	case p.CurrentStage == v1beta1.StageDone:
		return StateAddedToExistingCluster, "Host has joined cluster " + a.Spec.ClusterDeploymentName.Name
	case p.CurrentStage == v1beta1.StageStartingInstallation:
		return StateInstalling, "Installation is starting"
	}
	return StateInstallingInProgress, "Host is installing: " + string(p.CurrentStage)
}

// installed is the Installed condition, from the installation's progress.
func installed(a *v1beta1.Agent) v1beta1.Condition {
	p := &a.Status.Progress
	detail := func(msg string) string {
		if p.ProgressInfo != "" {
			return msg + ": " + p.ProgressInfo
		}
		return msg
	}
	switch {
	case p.CurrentStage == "":
		return conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationNotStartedReason, detail("The installation has not yet started"))
	case p.CurrentStage == v1beta1.StageFailed:
		return conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationFailedReason, detail("The installation has failed"))
	case p.CurrentStage == v1beta1.StageDone:
		return conditions.New(v1beta1.InstalledCondition, true, v1beta1.InstallationCompletedReason, detail("The installation has completed"))
	}
	return conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationInProgressReason,
		detail(fmt.Sprintf("The installation is in progress: %s, %d%%", p.CurrentStage, p.InstallationPercentage)))
}

func notReady(connected bool, validated v1beta1.Condition) string {
	if !connected {
		return "it is disconnected"
	}
	return strings.ToLower(validated.Message[:1]) + validated.Message[1:]
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

func state(f *facts, passing bool, pendingIDs, failing []string) (string, string) {
	switch {
	case !f.connected:
		return StateDisconnectedUnbound, "The host has not checked in for " + r3(f)
	case !inventoried(f):
		return StateDiscoveringUnbound, "Waiting for the host's inventory"
	case len(failing) > 0:
		return StateInsufficientUnbound, "Host cannot be installed due to following failing validation(s): " + strings.Join(failing, ", ")
	case !passing:
		return StateDiscoveringUnbound, "Waiting for validations: " + strings.Join(pendingIDs, ", ")
	}
	return StateKnownUnbound, "Host is ready to be bound to a cluster"
}

func r3(f *facts) string {
	if f.lastSeen.IsZero() {
		return "a while"
	}
	return "more than 3 minutes (last at " + f.lastSeen.UTC().Format(time.RFC3339) + ")"
}

// recordTransitions emits events when approval, connectivity or validations
// change.
func (r *Reconciler) recordTransitions(a *v1beta1.Agent, before, after *v1beta1.AgentStatus) {
	was := func(t v1beta1.ConditionType) *v1beta1.Condition { return conditions.Find(before.Conditions, t) }
	now := func(t v1beta1.ConditionType) *v1beta1.Condition { return conditions.Find(after.Conditions, t) }
	if b, n := was(v1beta1.RequirementsMetCondition), now(v1beta1.RequirementsMetCondition); n != nil {
		if (b == nil || b.Reason == v1beta1.AgentIsNotApprovedReason) && n.Reason != v1beta1.AgentIsNotApprovedReason {
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, "Approved", "Approve", "the agent was approved")
		}
		if n.Status == corev1.ConditionTrue && (b == nil || b.Status != corev1.ConditionTrue) {
			r.Events.Eventf(a, nil, corev1.EventTypeNormal, v1beta1.AgentReadyReason, "Validate", "the agent is ready to be bound")
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
