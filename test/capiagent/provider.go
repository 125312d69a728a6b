// Package capiagent plays, for tests against a real kube-apiserver, what
// HyperShift, Cluster API core and cluster-api-provider-agent do around
// agentboot for one Agent-platform hosted cluster, faithful to
// ../shared/reference/capi-agent/README.md (the contract): the same objects
// and fields, the same order of events, the provider's full-object Updates
// of Agents built from assisted-service's type (agent.go), its Ready rule,
// and its pre-terminate hook on scale-down. The provider runs as its own
// ServiceAccount with HyperShift's RBAC for it, so that whatever agentboot
// admits, the real provider may still write.
package capiagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/test/bindtest"
	"github.com/agentboot/agentboot/test/testenv"
)

// Kinds, labels and names of the contract.
var (
	AgentMachineGVK       = binding.AgentMachineGVK
	AgentClusterGVK       = schema.GroupVersionKind{Group: "capi-provider.agent-install.openshift.io", Version: "v1beta1", Kind: "AgentCluster"}
	MachineGVK            = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
	ClusterGVK            = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	HostedControlPlaneGVK = bindtest.HostedControlPlaneGVK
	ClusterDeploymentGVK  = bindtest.ClusterDeploymentGVK
	ACIGVK                = bindtest.ACIGVK
)

const (
	agentMachineRefLabel     = "agentMachineRef"
	agentMachineRefNamespace = "agentMachineRefNamespace"
	agentMachineFinalizer    = "agentmachine.agent-install.openshift.io/deprovision"
	agentClusterFinalizer    = "agentclustercapi-provider.agent-install.openshift.io/deprovision"
	machineDeleteHook        = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/agentmachine"
	clusterNameLabel         = "cluster.x-k8s.io/cluster-name"
	backupLabel              = "cluster.open-cluster-management.io/backup"
)

// The states in which the provider releases its pre-terminate hook.
var removeHookStates = []string{"discovering-unbound", "known-unbound", "disconnected-unbound", "insufficient-unbound",
	"disabled-unbound", "unbinding-pending-user-action", "error"}

func newObj(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func str(u *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, path...)
	return s
}

// provider is the cluster-api-provider-agent controller of one control-plane
// namespace (--namespace) and its agent namespace (--agent-namespace).
type provider struct {
	c        client.Client // control-plane namespace, as the provider's ServiceAccount
	agents   client.Client // agent namespace, same identity, assisted-service's Agent type
	agentsNS string
	// Updates counts the provider's writes to Agents, for tests.
	onAgentUpdate func(a *Agent)
	// passes records its AgentMachine passes, for tests.
	passes *testenv.Passes
}

// setup adds the provider's AgentCluster and AgentMachine controllers to
// mgr; agentCluster serves the agent namespace's cache, as the provider's
// second manager does.
func (p *provider) setup(mgr ctrl.Manager, agentCluster cluster.Cluster) error {
	if err := ctrl.NewControllerManagedBy(mgr).Named("agentcluster").For(newObj(AgentClusterGVK)).
		Complete(reconcile.Func(p.reconcileAgentCluster)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("agentmachine").For(newObj(AgentMachineGVK)).
		Watches(newObj(MachineGVK), handler.EnqueueRequestsFromMapFunc(p.machineToAgentMachine)).
		WatchesRawSource(source.Kind(agentCluster.GetCache(), client.Object(&Agent{}), handler.EnqueueRequestsFromMapFunc(p.agentToAgentMachine))).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (res reconcile.Result, err error) {
			res, err = p.reconcileAgentMachine(ctx, req)
			p.passes.Observe(req.NamespacedName, res, err)
			return res, err
		}))
}

// reconcileAgentCluster creates the ClusterDeployment and
// AgentClusterInstall, once CAPI core set the AgentCluster's owner (the
// Cluster) and the HostedControlPlane published its kubeconfig.
func (p *provider) reconcileAgentCluster(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ac := newObj(AgentClusterGVK)
	if err := p.c.Get(ctx, req.NamespacedName, ac); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	owners := ac.GetOwnerReferences()
	if len(owners) == 0 || owners[0].Kind != "Cluster" {
		return reconcile.Result{}, nil // waits for CAPI core
	}
	cluster := newObj(ClusterGVK)
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: ac.GetNamespace(), Name: owners[0].Name}, cluster); err != nil {
		return reconcile.Result{}, err
	}
	cpName := str(cluster, "spec", "controlPlaneRef", "name")
	hcp := newObj(HostedControlPlaneGVK)
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: ac.GetNamespace(), Name: cpName}, hcp); err != nil {
		return reconcile.Result{}, err
	}
	baseDomain, pullSecret, kubeconfig := str(hcp, "spec", "dns", "baseDomain"), str(hcp, "spec", "pullSecret", "name"), str(hcp, "status", "kubeConfig", "name")
	if baseDomain == "" || pullSecret == "" || kubeconfig == "" {
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if !slices.Contains(ac.GetFinalizers(), agentClusterFinalizer) {
		ac.SetFinalizers(append(ac.GetFinalizers(), agentClusterFinalizer))
		if err := p.c.Update(ctx, ac); err != nil {
			return reconcile.Result{}, err
		}
	}
	name := ac.GetName()
	cd := newObj(ClusterDeploymentGVK)
	cd.SetNamespace(ac.GetNamespace())
	cd.SetName(name)
	cd.SetLabels(map[string]string{"agentClusterRef": name})
	cd.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: AgentClusterGVK.GroupVersion().String(), Kind: "AgentCluster", Name: name, UID: ac.GetUID()}})
	clusterID := string(owners[0].UID)
	cd.Object["spec"] = map[string]any{
		"installed":         true,
		"clusterName":       cpName,
		"baseDomain":        baseDomain,
		"platform":          map[string]any{"agentBareMetal": map[string]any{"agentSelector": map[string]any{}}},
		"clusterInstallRef": map[string]any{"group": ACIGVK.Group, "version": ACIGVK.Version, "kind": ACIGVK.Kind, "name": name},
		"pullSecretRef":     map[string]any{"name": pullSecret},
		"clusterMetadata": map[string]any{"clusterID": clusterID, "infraID": clusterID,
			"adminKubeconfigSecretRef": map[string]any{"name": kubeconfig}},
	}
	if err := p.c.Create(ctx, cd); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create ClusterDeployment: %w", err)
	}
	aci := newObj(ACIGVK)
	aci.SetNamespace(ac.GetNamespace())
	aci.SetName(name)
	ignitionURL := str(ac, "spec", "ignitionEndpoint", "url")
	if i := strings.Index(strings.TrimPrefix(ignitionURL, "https://"), "/"); i >= 0 {
		ignitionURL = ignitionURL[:len("https://")+i] // the URL without its path
	}
	ie := map[string]any{"url": ignitionURL}
	if ref, ok, _ := unstructured.NestedMap(ac.Object, "spec", "ignitionEndpoint", "caCertificateReference"); ok {
		ie["caCertificateReference"] = ref
	}
	aci.Object["spec"] = map[string]any{
		"clusterDeploymentRef":  map[string]any{"name": name},
		"provisionRequirements": map[string]any{"controlPlaneAgents": int64(3)},
		"networking":            map[string]any{"userManagedNetworking": true},
		"ignitionEndpoint":      ie,
	}
	if err := p.c.Create(ctx, aci); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create AgentClusterInstall: %w", err)
	}
	if str(ac, "status", "clusterDeploymentReference", "name") == "" {
		_ = unstructured.SetNestedMap(ac.Object, map[string]any{"namespace": ac.GetNamespace(), "name": name}, "status", "clusterDeploymentReference")
		_ = unstructured.SetNestedField(ac.Object, true, "status", "ready")
		if err := p.c.Status().Update(ctx, ac); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// ownerMachine is the Machine owning the AgentMachine, or nil.
func (p *provider) ownerMachine(ctx context.Context, am *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	for _, o := range am.GetOwnerReferences() {
		if o.Kind == "Machine" && strings.HasPrefix(o.APIVersion, "cluster.x-k8s.io/") {
			m := newObj(MachineGVK)
			err := p.c.Get(ctx, client.ObjectKey{Namespace: am.GetNamespace(), Name: o.Name}, m)
			return m, err
		}
	}
	return nil, nil
}

func (p *provider) reconcileAgentMachine(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	am := newObj(AgentMachineGVK)
	if err := p.c.Get(ctx, req.NamespacedName, am); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	machine, err := p.ownerMachine(ctx, am)
	if err != nil {
		if am.GetDeletionTimestamp() != nil {
			_ = p.removeFinalizer(ctx, am)
		}
		return reconcile.Result{}, err
	}
	if machine == nil {
		return reconcile.Result{}, p.updateStatus(ctx, am, nil)
	}
	if res, err := p.handleDeletionHook(ctx, am, machine); res != nil || err != nil {
		return *res, err
	}
	if ready, _, _ := unstructured.NestedBool(am.Object, "status", "ready"); ready {
		return reconcile.Result{}, nil
	}
	ac, err := p.agentCluster(ctx, machine)
	if err != nil {
		return reconcile.Result{}, err
	}
	cdName := str(ac, "status", "clusterDeploymentReference", "name")
	if cdName == "" {
		// Not requeued: the next Agent, Machine or AgentMachine event
		// brings it back (the contract's "behaviour a test will meet").
		return reconcile.Result{}, p.updateStatus(ctx, am, fmt.Errorf("no cluster deployment reference on agentCluster %s", ac.GetName()))
	}
	pool, tokenRef, headers, err := p.processBootstrapDataSecret(ctx, machine)
	if err != nil {
		return reconcile.Result{}, err
	}
	if _, found, _ := unstructured.NestedMap(am.Object, "status", "agentRef"); !found {
		agent, err := p.findAgent(ctx, am, agentReference{Namespace: str(ac, "status", "clusterDeploymentReference", "namespace"), Name: cdName}, pool, tokenRef, headers)
		if agent == nil || err != nil {
			return reconcile.Result{}, p.updateStatus(ctx, am, err)
		}
		am.Object["spec"].(map[string]any)["providerID"] = "agent://" + agent.Name
		if err := p.c.Update(ctx, am); err != nil {
			return reconcile.Result{}, p.updateStatus(ctx, am, err)
		}
		_ = unstructured.SetNestedMap(am.Object, map[string]any{"namespace": agent.Namespace, "name": agent.Name}, "status", "agentRef")
		_ = unstructured.SetNestedSlice(am.Object, addresses(agent), "status", "addresses")
		_ = unstructured.SetNestedField(am.Object, false, "status", "ready")
	}
	return reconcile.Result{}, p.updateStatus(ctx, am, nil)
}

func (p *provider) agentCluster(ctx context.Context, machine *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	cluster := newObj(ClusterGVK)
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: machine.GetNamespace(), Name: machine.GetLabels()[clusterNameLabel]}, cluster); err != nil {
		return nil, err
	}
	ac := newObj(AgentClusterGVK)
	err := p.c.Get(ctx, client.ObjectKey{Namespace: machine.GetNamespace(), Name: str(cluster, "spec", "infrastructureRef", "name")}, ac)
	return ac, err
}

// processBootstrapDataSecret reads the Machine's user-data and writes the
// token Secret agent-<user-data name>.
func (p *provider) processBootstrapDataSecret(ctx context.Context, machine *unstructured.Unstructured) (string, *ignitionEndpointTokenReference, map[string]string, error) {
	headers := map[string]string{}
	dataSecret := str(machine, "spec", "bootstrap", "dataSecretName")
	if dataSecret == "" {
		return "", nil, headers, nil
	}
	var s corev1.Secret
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: machine.GetNamespace(), Name: dataSecret}, &s); err != nil {
		return "", nil, headers, err
	}
	var cfg struct {
		Ignition struct {
			Config struct {
				Merge []struct {
					Source      *string `json:"source"`
					HTTPHeaders []struct {
						Name  string  `json:"name"`
						Value *string `json:"value"`
					} `json:"httpHeaders"`
				} `json:"merge"`
			} `json:"config"`
		} `json:"ignition"`
	}
	if err := jsonUnmarshal(s.Data["value"], &cfg); err != nil {
		return "", nil, headers, err
	}
	if len(cfg.Ignition.Config.Merge) != 1 {
		return "", nil, headers, errors.New("did not find one ignition source as expected")
	}
	src := cfg.Ignition.Config.Merge[0]
	pool := (*src.Source)[strings.LastIndex(*src.Source, "/")+1:]
	token := ""
	for _, h := range src.HTTPHeaders {
		if h.Name == "Authorization" {
			if !strings.HasPrefix(*h.Value, "Bearer ") {
				return pool, nil, headers, errors.New("did not find expected prefix for bearer token")
			}
			token = strings.TrimPrefix(*h.Value, "Bearer ")
		} else {
			headers[h.Name] = *h.Value
		}
	}
	name := "agent-" + dataSecret
	ts := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: machine.GetNamespace(), Name: name,
		Labels: map[string]string{"agent-install.openshift.io/watch": "true", backupLabel: "true"}},
		Data: map[string][]byte{"ignition-token": []byte(token)}}
	err := p.c.Create(ctx, ts)
	if apierrors.IsAlreadyExists(err) {
		err = p.c.Update(ctx, ts)
	}
	if err != nil {
		return pool, nil, headers, err
	}
	return pool, &ignitionEndpointTokenReference{Namespace: machine.GetNamespace(), Name: name}, headers, nil
}

// findAgent re-adopts an Agent already labelled for this AgentMachine, or
// takes the first valid one its selector matches, with a full-object Update.
func (p *provider) findAgent(ctx context.Context, am *unstructured.Unstructured, cd agentReference, pool string,
	tokenRef *ignitionEndpointTokenReference, headers map[string]string) (*Agent, error) {
	var mine AgentList
	if err := p.agents.List(ctx, &mine, client.MatchingLabels{agentMachineRefLabel: am.GetName()}); err != nil {
		return nil, err
	}
	if len(mine.Items) > 0 {
		return &mine.Items[0], nil
	}
	sel := labels.NewSelector()
	if raw, ok, _ := unstructured.NestedMap(am.Object, "spec", "agentLabelSelector"); ok {
		var ls metav1.LabelSelector
		if err := fromMap(raw, &ls); err != nil {
			return nil, err
		}
		s, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			return nil, err
		}
		sel = s
	}
	notTaken, _ := labels.NewRequirement(agentMachineRefLabel, selection.DoesNotExist, nil)
	var list AgentList
	if err := p.agents.List(ctx, &list, client.MatchingLabelsSelector{Selector: sel.Add(*notTaken)}); err != nil {
		return nil, err
	}
	for i := range list.Items {
		a := &list.Items[i]
		if !a.valid() {
			continue
		}
		if a.Labels == nil {
			a.Labels = map[string]string{}
		}
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Labels[agentMachineRefLabel] = am.GetName()
		a.Annotations[agentMachineRefNamespace] = am.GetNamespace()
		a.Spec.ClusterDeploymentName = &cd
		a.Spec.MachineConfigPool = pool
		a.Spec.IgnitionEndpointTokenReference = tokenRef
		a.Spec.IgnitionEndpointHTTPHeaders = headers
		if err := p.agents.Update(ctx, a); err != nil {
			continue // taken meanwhile: try the others
		}
		if p.onAgentUpdate != nil {
			p.onAgentUpdate(a)
		}
		return a, nil
	}
	return nil, nil
}

// handleDeletionHook keeps the Machine's pre-terminate hook and the
// AgentMachine's finalizer, and on deletion unbinds the Agent and holds the
// hook until the Agent is back in an unbound state.
func (p *provider) handleDeletionHook(ctx context.Context, am, machine *unstructured.Unstructured) (*reconcile.Result, error) {
	ann := machine.GetAnnotations()
	if _, ok := ann[machineDeleteHook]; !ok && machine.GetDeletionTimestamp() == nil {
		if ann == nil {
			ann = map[string]string{}
		}
		ann[machineDeleteHook] = ""
		machine.SetAnnotations(ann)
		if err := p.c.Update(ctx, machine); err != nil {
			return &reconcile.Result{}, err
		}
	}
	if am.GetDeletionTimestamp() == nil && !slices.Contains(am.GetFinalizers(), agentMachineFinalizer) {
		am.SetFinalizers(append(am.GetFinalizers(), agentMachineFinalizer))
		if err := p.c.Update(ctx, am); err != nil {
			return &reconcile.Result{}, err
		}
	}
	if !waitingForPreTerminateHook(machine) {
		return nil, nil
	}
	ref, found, _ := unstructured.NestedStringMap(am.Object, "status", "agentRef")
	if !found {
		return &reconcile.Result{}, p.removeHookAndFinalizer(ctx, machine, am)
	}
	a := &Agent{}
	if err := p.agents.Get(ctx, client.ObjectKey{Namespace: ref["namespace"], Name: ref["name"]}, a); err != nil {
		if apierrors.IsNotFound(err) {
			return &reconcile.Result{}, p.removeHookAndFinalizer(ctx, machine, am)
		}
		return &reconcile.Result{}, err
	}
	if _, labelled := a.Labels[agentMachineRefLabel]; labelled || a.Spec.ClusterDeploymentName != nil {
		delete(a.Labels, agentMachineRefLabel)
		delete(a.Annotations, agentMachineRefNamespace)
		a.Spec.MachineConfigPool = ""
		a.Spec.IgnitionEndpointTokenReference = nil
		a.Spec.IgnitionEndpointHTTPHeaders = nil
		a.Spec.ClusterDeploymentName = nil
		if err := p.agents.Update(ctx, a); err != nil {
			return &reconcile.Result{}, err
		}
		if p.onAgentUpdate != nil {
			p.onAgentUpdate(a)
		}
	}
	if slices.Contains(removeHookStates, a.Status.DebugInfo.State) {
		return &reconcile.Result{}, p.removeHookAndFinalizer(ctx, machine, am)
	}
	return &reconcile.Result{RequeueAfter: 5 * time.Second}, nil
}

// waitingForPreTerminateHook: CAPI's Machine controller drained the node
// and waits for pre-terminate hooks (v1beta2 condition Deleting, reason
// WaitingForPreTerminateHook; or PreTerminateDeleteHookSucceeded False).
func waitingForPreTerminateHook(machine *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(machine.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		switch {
		case m["type"] == "Deleting" && m["reason"] == "WaitingForPreTerminateHook":
			return true
		case m["type"] == "PreTerminateDeleteHookSucceeded" && m["status"] == "False":
			return true
		}
	}
	return false
}

func (p *provider) removeFinalizer(ctx context.Context, am *unstructured.Unstructured) error {
	if !slices.Contains(am.GetFinalizers(), agentMachineFinalizer) {
		return nil
	}
	am.SetFinalizers(slices.DeleteFunc(am.GetFinalizers(), func(f string) bool { return f == agentMachineFinalizer }))
	return p.c.Update(ctx, am)
}

func (p *provider) removeHookAndFinalizer(ctx context.Context, machine, am *unstructured.Unstructured) error {
	ann := machine.GetAnnotations()
	if _, ok := ann[machineDeleteHook]; ok {
		delete(ann, machineDeleteHook)
		machine.SetAnnotations(ann)
		if err := p.c.Update(ctx, machine); err != nil {
			return err
		}
	}
	return p.removeFinalizer(ctx, am)
}

// updateStatus copies the Agent's conditions into the AgentMachine and
// derives Ready, as the provider does. AgentMachine conditions are
// metav1.Conditions: a True one gets a reason of its own, a False one the
// Agent's reason and message (a missing Agent condition: ConditionNotFound).
// A reason that is not CamelCase makes the apiserver refuse the status
// update; the provider only logs that, so the AgentMachine keeps its old
// conditions and never turns Ready.
func (p *provider) updateStatus(ctx context.Context, am *unstructured.Unstructured, findErr error) error {
	now := time.Now().UTC().Format(time.RFC3339)
	set := func(t, status, reason, _, msg string) {
		conds, _, _ := unstructured.NestedSlice(am.Object, "status", "conditions")
		if status == "True" {
			reason = t
		}
		c := map[string]any{"type": t, "status": status, "lastTransitionTime": now, "reason": reason, "message": msg}
		for i, old := range conds {
			if old.(map[string]any)["type"] == t {
				conds[i] = c
				_ = unstructured.SetNestedSlice(am.Object, conds, "status", "conditions")
				return
			}
		}
		_ = unstructured.SetNestedSlice(am.Object, append(conds, c), "status", "conditions")
	}
	ref, found, _ := unstructured.NestedStringMap(am.Object, "status", "agentRef")
	allTrue := found
	if !found {
		if findErr == nil {
			set("AgentReserved", "False", "NoSuitableAgents", "Warning", "")
		} else {
			set("AgentReserved", "False", "AgentNotYetFound", "Info", findErr.Error())
		}
		for _, t := range []string{"AgentSpecSynced", "AgentValidated", "AgentRequirementsMet", "Installed"} {
			set(t, "False", "AgentNotYetFound", "Info", "Agent not yet reserved")
		}
	} else {
		set("AgentReserved", "True", "", "", "")
		a := &Agent{}
		if err := p.agents.Get(ctx, client.ObjectKey{Namespace: ref["namespace"], Name: ref["name"]}, a); err != nil {
			return err
		}
		for amType, agentType := range map[string]string{"AgentSpecSynced": "SpecSynced", "AgentValidated": "Validated", "AgentRequirementsMet": "RequirementsMet", "Installed": "Installed"} {
			c := a.condition(agentType)
			switch {
			case c == nil:
				set(amType, "False", "ConditionNotFound", "Error", "")
				allTrue = false
			case c.Status == "True":
				set(amType, "True", "", "", "")
			default:
				set(amType, "False", c.Reason, "Error", c.Message)
				allTrue = false
			}
		}
	}
	if allTrue {
		set("Ready", "True", "", "", "")
	} else {
		set("Ready", "False", "NotReady", "Info", "")
	}
	_ = unstructured.SetNestedField(am.Object, allTrue, "status", "ready")
	if err := p.c.Status().Update(ctx, am); err != nil && !apierrors.IsInvalid(err) {
		return err
	}
	return nil
}

func addresses(a *Agent) []any {
	var out []any
	for _, iface := range a.Status.Inventory.Interfaces {
		if !iface.HasCarrier {
			continue
		}
		for _, addr := range iface.IPV4Addresses {
			out = append(out, map[string]any{"type": "ExternalIP", "address": addr[:strings.LastIndex(addr, "/")]})
		}
	}
	host := a.Spec.Hostname
	if host == "" {
		host = a.Status.Inventory.Hostname
	}
	return append(out, map[string]any{"type": "InternalDNS", "address": host})
}

func (p *provider) machineToAgentMachine(ctx context.Context, m client.Object) []reconcile.Request {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(AgentMachineGVK.GroupVersion().WithKind("AgentMachineList"))
	if err := p.c.List(ctx, list, client.InNamespace(m.GetNamespace())); err != nil {
		return nil
	}
	for _, am := range list.Items {
		for _, o := range am.GetOwnerReferences() {
			if o.Kind == "Machine" && o.Name == m.GetName() {
				return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(&am)}}
			}
		}
	}
	return nil
}

func (p *provider) agentToAgentMachine(ctx context.Context, o client.Object) []reconcile.Request {
	a := o.(*Agent)
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(AgentMachineGVK.GroupVersion().WithKind("AgentMachineList"))
	ns, mapped := a.Annotations[agentMachineRefNamespace]
	var opts []client.ListOption
	if mapped {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := p.c.List(ctx, list, opts...); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, am := range list.Items {
		ref, found, _ := unstructured.NestedStringMap(am.Object, "status", "agentRef")
		switch {
		case mapped && found && ref["namespace"] == a.Namespace && ref["name"] == a.Name:
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(&am)}}
		case !mapped && !found && a.valid():
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&am)})
		}
	}
	return reqs
}
