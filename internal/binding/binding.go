// Package binding derives an Agent's binding to a hosted cluster from the
// objects only HyperShift and cluster-api-provider-agent write, never from
// the Agent alone: a user who may edit Agents in an agent namespace can
// write spec.clusterDeploymentName, the token reference and the
// agentMachineRef label, but not the AgentMachine, the HostedControlPlane,
// the ClusterDeployment or the Secrets in a control-plane namespace. Before
// agentboot hands out a pointer Ignition or a token, approves a CSR or
// touches a Node, the binding must hold here.
//
// It never writes. What it reads from decides what a resolution may be
// used for: resolved through an informer cache (Resolve with a cache
// reader, cheap enough for every poll of every host) it may show and wait
// and prepare; anything handed out or approved on the binding's strength
// is decided on a resolution read fresh from the apiserver (Confirm),
// because a cache may not have seen a revocation yet.
package binding

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hivev1 "github.com/agentboot/agentboot/api/hive/v1"
	hiveext "github.com/agentboot/agentboot/api/hiveext/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Kinds read unstructured: agentboot reads a field or two of each and
// ships no CRD for them (HyperShift and cluster-api-provider-agent do).
var (
	AgentMachineGVK        = schema.GroupVersionKind{Group: "capi-provider.agent-install.openshift.io", Version: "v1beta1", Kind: "AgentMachine"}
	AgentMachineList       = schema.GroupVersionKind{Group: "capi-provider.agent-install.openshift.io", Version: "v1beta1", Kind: "AgentMachineList"}
	HostedControlPlaneList = schema.GroupVersionKind{Group: "hypershift.openshift.io", Version: "v1beta1", Kind: "HostedControlPlaneList"}
)

// Binding is an Agent's binding as HyperShift and cluster-api-provider-agent
// recorded it.
type Binding struct {
	// Namespace is the hosted cluster's control-plane namespace, where the
	// AgentMachine, ClusterDeployment and token Secret live.
	Namespace string
	// AgentMachine is the name of the AgentMachine that took the Agent, and
	// AgentMachineCreated when Cluster API created it: kubelet CSRs made
	// before then were not made for this installation.
	AgentMachine        string
	AgentMachineCreated time.Time
	// ClusterDeployment and Install are the cluster's records.
	ClusterDeployment *hivev1.ClusterDeployment
	Install           *hiveext.AgentClusterInstall
}

// Refused says why an Agent's binding cannot be trusted or used; it is
// shown on the Agent (progressInfo, an event) and nothing is handed out.
type Refused struct{ Msg string }

func (e *Refused) Error() string { return e.Msg }

// EventReason is the reason of the event that shows it.
func (e *Refused) EventReason() string { return "BindingRefused" }

func refused(format string, args ...any) error { return &Refused{Msg: fmt.Sprintf(format, args...)} }

// IsRefused reports whether err is a Refused.
func IsRefused(err error) bool {
	var r *Refused
	return errors.As(err, &r)
}

// Resolve checks the Agent's binding against what only HyperShift and
// cluster-api-provider-agent write:
//   - an AgentMachine in the namespace the agentMachineRefNamespace
//     annotation names references this Agent in status.agentRef and is named
//     (by name or UID) by the agentMachineRef label;
//   - the HostedControlPlane in that namespace serves the Agent's namespace
//     (spec.platform.agent.agentNamespace), and is a HostedCluster's: it
//     names the HostedCluster (HostedClusterAnnotation), whose control
//     plane namespace this is and which serves the same Agent namespace;
//   - spec.clusterDeploymentName names a ClusterDeployment in that same
//     namespace, installed, whose clusterInstallRef names an
//     AgentClusterInstall there.
//
// Anything else is a Refused error saying what does not hold.
func Resolve(ctx context.Context, r client.Reader, a *v1beta1.Agent) (*Binding, error) {
	cd := a.Spec.ClusterDeploymentName
	if cd == nil {
		return nil, refused("the Agent is not bound")
	}
	ns := a.Annotations[lifecycle.AgentMachineRefNamespaceAnnotation]
	ref := a.Labels[lifecycle.AgentMachineRefLabel]
	if ns == "" || ref == "" {
		return nil, refused("agentboot installs Agents that cluster-api-provider-agent bound; this one has no %s label and %s annotation",
			lifecycle.AgentMachineRefLabel, lifecycle.AgentMachineRefNamespaceAnnotation)
	}
	if cd.Namespace != ns {
		return nil, refused("spec.clusterDeploymentName is in namespace %q, but the Agent's AgentMachine is in %q", cd.Namespace, ns)
	}
	b := &Binding{Namespace: ns}
	am, err := agentMachine(ctx, r, a, ns, ref)
	if err != nil {
		return nil, err
	}
	b.AgentMachine, b.AgentMachineCreated = am.GetName(), am.GetCreationTimestamp().Time
	if err := servesAgentNamespace(ctx, r, ns, a.Namespace); err != nil {
		return nil, err
	}
	b.ClusterDeployment = &hivev1.ClusterDeployment{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: cd.Name}, b.ClusterDeployment); err != nil {
		return nil, readError(err, "ClusterDeployment %s/%s named by spec.clusterDeploymentName", ns, cd.Name)
	}
	spec := &b.ClusterDeployment.Spec
	ir := spec.ClusterInstallRef
	switch {
	case !spec.Installed:
		return nil, refused("ClusterDeployment %s/%s is not an installed cluster (spec.installed is false); agentboot adds workers to running hosted clusters only", ns, cd.Name)
	case ir == nil || ir.Kind != "AgentClusterInstall" || ir.Name == "":
		return nil, refused("ClusterDeployment %s/%s has no spec.clusterInstallRef to an AgentClusterInstall", ns, cd.Name)
	}
	b.Install = &hiveext.AgentClusterInstall{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: ir.Name}, b.Install); err != nil {
		return nil, readError(err, "AgentClusterInstall %s/%s named by ClusterDeployment %s", ns, ir.Name, cd.Name)
	}
	return b, nil
}

// Confirm is what a decision taken on a cached resolution rests on: the
// Agent and its binding read again through fresh (the apiserver, not a
// cache), holding, and the same binding (by Digest) as cached, resolved
// from the same Agent. A binding revoked a moment ago, which the cache has
// not seen yet, is refused here at once; one that changed is an error to
// wait on, not a refusal: the cache catches up by the next look.
func Confirm(ctx context.Context, fresh client.Reader, a *v1beta1.Agent, cached *Binding) (*Binding, error) {
	cur := &v1beta1.Agent{}
	if err := fresh.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
		return nil, readError(err, "Agent %s/%s", a.Namespace, a.Name)
	}
	if cur.UID != a.UID {
		return nil, refused("Agent %s/%s was replaced by another object of its name", a.Namespace, a.Name)
	}
	b, err := Resolve(ctx, fresh, cur)
	if err != nil {
		return nil, err
	}
	if b.Digest() != cached.Digest() {
		return nil, fmt.Errorf("the binding of Agent %s/%s changed a moment ago (now AgentMachine %s/%s); looked at again once the cache has it", a.Namespace, a.Name, b.Namespace, b.AgentMachine)
	}
	return b, nil
}

// agentMachine finds the AgentMachine in ns that took the Agent: the one
// the label names (cluster-api-provider-agent writes its name there), read
// by name; else, as a label holding the UID also names one, the one of the
// namespace that references the Agent. A namespace holds an AgentMachine
// for each of its hosts, so only an Agent whose label names no
// AgentMachine referencing it has the namespace's list read.
func agentMachine(ctx context.Context, r client.Reader, a *v1beta1.Agent, ns, ref string) (*unstructured.Unstructured, error) {
	named := &unstructured.Unstructured{}
	named.SetGroupVersionKind(AgentMachineGVK)
	err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref}, named)
	switch {
	case err == nil && references(named, a):
		return checkAgentMachine(named, a, ref)
	case err != nil && !apierrors.IsNotFound(err):
		return nil, readError(err, "AgentMachine %s/%s named by the %s label", ns, ref, lifecycle.AgentMachineRefLabel)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(AgentMachineList)
	// Read only, never changed: a cache need not copy the namespace's
	// AgentMachines for it.
	if err := r.List(ctx, list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, readError(err, "AgentMachines in namespace %s", ns)
	}
	for i := range list.Items {
		if am := &list.Items[i]; references(am, a) {
			return checkAgentMachine(am, a, ref)
		}
	}
	return nil, refused("no AgentMachine in namespace %s references this Agent in status.agentRef (yet)", ns)
}

// references reports whether AgentMachine am's status.agentRef is Agent a.
func references(am *unstructured.Unstructured, a *v1beta1.Agent) bool {
	name, _, _ := unstructured.NestedString(am.Object, "status", "agentRef", "name")
	agentNS, _, _ := unstructured.NestedString(am.Object, "status", "agentRef", "namespace")
	return name == a.Name && agentNS == a.Namespace
}

// checkAgentMachine checks an AgentMachine that references the Agent
// against its label.
func checkAgentMachine(am *unstructured.Unstructured, a *v1beta1.Agent, ref string) (*unstructured.Unstructured, error) {
	if ref != am.GetName() && ref != string(am.GetUID()) {
		return nil, refused("AgentMachine %s/%s references this Agent, but its %s label names %q", am.GetNamespace(), am.GetName(), lifecycle.AgentMachineRefLabel, ref)
	}
	if am.GetDeletionTimestamp() != nil {
		return nil, refused("AgentMachine %s/%s is being deleted", am.GetNamespace(), am.GetName())
	}
	return am, nil
}

// servesAgentNamespace checks that the hosted control plane in ns takes its
// Agents from agentNS.
func servesAgentNamespace(ctx context.Context, r client.Reader, ns, agentNS string) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(HostedControlPlaneList)
	if err := r.List(ctx, list, client.InNamespace(ns)); err != nil {
		return readError(err, "HostedControlPlanes in namespace %s", ns)
	}
	if len(list.Items) != 1 {
		return refused("namespace %s holds %d HostedControlPlanes, not one", ns, len(list.Items))
	}
	hcp := &list.Items[0]
	served, _, _ := unstructured.NestedString(hcp.Object, "spec", "platform", "agent", "agentNamespace")
	if served != agentNS {
		return refused("HostedControlPlane %s/%s takes its Agents from namespace %q, not %q", ns, hcp.GetName(), served, agentNS)
	}
	// Whoever may create a HostedControlPlane in some namespace does not
	// make a hosted cluster: HyperShift's operator makes the control plane
	// of a HostedCluster, in the namespace its name gives.
	owner := hcp.GetAnnotations()[HostedClusterAnnotation]
	hcNS, hcName, _ := strings.Cut(owner, "/")
	if hcNS == "" || hcName == "" {
		return refused("HostedControlPlane %s/%s names no HostedCluster (annotation %s is %q): it is not HyperShift's", ns, hcp.GetName(), HostedClusterAnnotation, owner)
	}
	if cp := ControlPlaneNamespace(hcNS, hcName); cp != ns {
		return refused("HostedControlPlane %s/%s names HostedCluster %s, whose control plane namespace is %s, not %s", ns, hcp.GetName(), owner, cp, ns)
	}
	var hc hypershift.HostedCluster
	if err := r.Get(ctx, client.ObjectKey{Namespace: hcNS, Name: hcName}, &hc); err != nil {
		return readError(err, "HostedCluster %s named by HostedControlPlane %s/%s", owner, ns, hcp.GetName())
	}
	if a := hc.Spec.Platform.Agent; a == nil || a.AgentNamespace != agentNS {
		return refused("HostedCluster %s does not take its Agents from namespace %q", owner, agentNS)
	}
	return nil
}

// HostedClusterAnnotation on a HostedControlPlane names its HostedCluster
// (namespace/name); HyperShift's operator sets it.
const HostedClusterAnnotation = "hypershift.openshift.io/cluster"

// ControlPlaneNamespace is the namespace HyperShift puts the control plane
// of HostedCluster ns/name in: "<ns>-<name>", dots in the name made
// hyphens.
func ControlPlaneNamespace(ns, name string) string {
	return ns + "-" + strings.ReplaceAll(name, ".", "-")
}

// readError turns a missing object or kind into a Refused naming it.
func readError(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	switch {
	case apierrors.IsNotFound(err):
		return refused("%s does not exist", what)
	case meta.IsNoMatchError(err):
		return refused("%s: the kind is not installed in this cluster", what)
	}
	return fmt.Errorf("read %s: %w", what, err)
}

// Digest identifies the binding as resolved: the objects it rests on (by
// UID) and the AgentClusterInstall's Ignition endpoint. Two resolutions
// with the same digest would build the same pointer config from the same
// Secrets.
func (b *Binding) Digest() string {
	in := struct {
		Namespace, AgentMachine string
		Created                 time.Time
		ClusterDeployment       types.UID
		Install                 types.UID
		Endpoint                *hiveext.IgnitionEndpoint
	}{b.Namespace, b.AgentMachine, b.AgentMachineCreated, b.ClusterDeployment.UID, b.Install.UID, b.Install.Spec.IgnitionEndpoint}
	raw, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings, a time and a struct of strings
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
