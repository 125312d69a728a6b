// Package bindtest makes, for tests, the objects an Agent's binding rests
// on (package binding) as HyperShift and cluster-api-provider-agent write
// them, and a reader frozen at a moment: a cache that has not heard of
// anything since.
package bindtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Kinds made unstructured: agentboot's api/ types hold only the fields it
// reads, not all the CRDs require.
var (
	ClusterDeploymentGVK  = schema.GroupVersionKind{Group: "hive.openshift.io", Version: "v1", Kind: "ClusterDeployment"}
	ACIGVK                = schema.GroupVersionKind{Group: "extensions.hive.openshift.io", Version: "v1beta1", Kind: "AgentClusterInstall"}
	HostedControlPlaneGVK = schema.GroupVersionKind{Group: "hypershift.openshift.io", Version: "v1beta1", Kind: "HostedControlPlane"}
)

// The hosted cluster's names.
const (
	HCNamespace, HCName = "clusters", "vcluster2"
	// CP is its control-plane namespace.
	CP             = "clusters-vcluster2"
	AgentNamespace = "agents"
	// KubeconfigSecret, in CP, is named by the ClusterDeployment.
	KubeconfigSecret = "admin-kubeconfig"
)

// Names are a hosted cluster's: its HostedCluster's namespace and name,
// and the namespace it takes Agents from.
type Names struct{ HCNamespace, HCName, AgentNamespace string }

// Default are the names NewCluster uses.
var Default = Names{HCNamespace, HCName, AgentNamespace}

// CP is the control-plane namespace, as HyperShift names it.
func (n Names) CP() string { return binding.ControlPlaneNamespace(n.HCNamespace, n.HCName) }

// Objects are the objects of the cluster an Agent's binding rests on, to
// create in order: the HostedCluster, its HostedControlPlane,
// ClusterDeployment (naming KubeconfigSecret) and AgentClusterInstall.
func (n Names) Objects() []client.Object {
	hc := &hypershift.HostedCluster{ObjectMeta: metav1.ObjectMeta{Namespace: n.HCNamespace, Name: n.HCName},
		Spec: hypershift.HostedClusterSpec{Platform: hypershift.PlatformSpec{Type: hypershift.AgentPlatform,
			Agent: &hypershift.AgentPlatformSpec{AgentNamespace: n.AgentNamespace}}}}
	return []client.Object{hc, n.HostedControlPlane(), n.clusterDeployment(), n.AgentClusterInstall()}
}

// Cluster is a hosted cluster's objects in the management cluster.
type Cluster struct {
	T  testing.TB
	C  client.Client
	HC *hypershift.HostedCluster
}

// NewCluster creates the namespaces and Default's Objects.
func NewCluster(t testing.TB, ctx context.Context, c client.Client) *Cluster {
	t.Helper()
	for _, ns := range []string{HCNamespace, CP, AgentNamespace} {
		require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	objs := Default.Objects()
	for _, o := range objs {
		require.NoError(t, c.Create(ctx, o))
	}
	return &Cluster{T: t, C: c, HC: objs[0].(*hypershift.HostedCluster)}
}

// Bind creates AgentMachine machine referencing Agent name and returns
// the Agent bound to it as cluster-api-provider-agent binds it (not yet
// created).
func (cl *Cluster) Bind(ctx context.Context, name, machine string) (*v1beta1.Agent, *unstructured.Unstructured) {
	am := cl.AgentMachine(ctx, machine, name)
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: AgentNamespace, Name: name},
		Spec: v1beta1.AgentSpec{Approved: true, Role: "worker"}}
	Default.Bound(a, machine)
	return a, am
}

// AgentMachine creates AgentMachine name whose status.agentRef is Agent
// agent ("": none).
func (cl *Cluster) AgentMachine(ctx context.Context, name, agent string) *unstructured.Unstructured {
	cl.T.Helper()
	am := Default.AgentMachine(name)
	require.NoError(cl.T, cl.C.Create(ctx, am))
	if agent != "" {
		Default.Reference(am, agent)
		require.NoError(cl.T, cl.C.Status().Update(ctx, am))
	}
	return am
}

// AgentMachine is AgentMachine name of the cluster, to create.
func (n Names) AgentMachine(name string) *unstructured.Unstructured {
	am := &unstructured.Unstructured{}
	am.SetGroupVersionKind(binding.AgentMachineGVK)
	am.SetNamespace(n.CP())
	am.SetName(name)
	am.Object["spec"] = map[string]any{}
	return am
}

// Reference sets AgentMachine am's status.agentRef to Agent agent, as the
// provider records the Agent it took (a status update).
func (n Names) Reference(am *unstructured.Unstructured, agent string) {
	am.Object["status"] = map[string]any{"agentRef": map[string]any{"namespace": n.AgentNamespace, "name": agent}}
}

// Bound binds Agent a to AgentMachine machine as the provider does.
func (n Names) Bound(a *v1beta1.Agent, machine string) {
	if a.Labels == nil {
		a.Labels = map[string]string{}
	}
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Labels[lifecycle.AgentMachineRefLabel] = machine
	a.Annotations[lifecycle.AgentMachineRefNamespaceAnnotation] = n.CP()
	a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: n.CP(), Name: n.HCName}
}

// InfraID is the infrastructure ID of hosted cluster name, as HyperShift
// makes one up.
func InfraID(name string) string { return name + "-x7k2p" }

// HostedControlPlane is the cluster's HostedControlPlane, as HyperShift's
// operator makes it (naming its HostedCluster), to create.
func (n Names) HostedControlPlane() *unstructured.Unstructured {
	hcp := &unstructured.Unstructured{}
	hcp.SetGroupVersionKind(HostedControlPlaneGVK)
	hcp.SetNamespace(n.CP())
	hcp.SetName(n.HCName)
	hcp.SetAnnotations(map[string]string{binding.HostedClusterAnnotation: n.HCNamespace + "/" + n.HCName})
	hcp.Object["spec"] = map[string]any{
		"dns":          map[string]any{"baseDomain": "example.com"},
		"etcd":         map[string]any{"managementType": "Managed", "managed": map[string]any{"storage": map[string]any{"type": "PersistentVolume"}}},
		"infraID":      InfraID(n.HCName),
		"issuerURL":    "https://kubernetes.default.svc",
		"platform":     map[string]any{"type": "Agent", "agent": map[string]any{"agentNamespace": n.AgentNamespace}},
		"pullSecret":   map[string]any{"name": "pull-secret"},
		"releaseImage": "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64",
		"services": []any{
			map[string]any{"service": "APIServer", "servicePublishingStrategy": map[string]any{"type": "LoadBalancer"}},
			map[string]any{"service": "OAuthServer", "servicePublishingStrategy": map[string]any{"type": "Route"}},
			map[string]any{"service": "Konnectivity", "servicePublishingStrategy": map[string]any{"type": "Route"}},
			map[string]any{"service": "Ignition", "servicePublishingStrategy": map[string]any{"type": "Route"}},
		},
		"sshKey": map[string]any{},
	}
	return hcp
}

func (n Names) clusterDeployment() *unstructured.Unstructured {
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(ClusterDeploymentGVK)
	cd.SetNamespace(n.CP())
	cd.SetName(n.HCName)
	cd.Object["spec"] = map[string]any{
		"installed":         true,
		"clusterName":       n.HCName,
		"baseDomain":        "example.com",
		"platform":          map[string]any{"agentBareMetal": map[string]any{"agentSelector": map[string]any{}}},
		"clusterInstallRef": map[string]any{"group": ACIGVK.Group, "version": ACIGVK.Version, "kind": ACIGVK.Kind, "name": n.HCName},
		"pullSecretRef":     map[string]any{"name": "pull-secret"},
		"clusterMetadata": map[string]any{"clusterID": "x7k2p", "infraID": "x7k2p",
			"adminKubeconfigSecretRef": map[string]any{"name": KubeconfigSecret}},
	}
	return cd
}

// AgentClusterInstall is the cluster's AgentClusterInstall, to create.
func (n Names) AgentClusterInstall() *unstructured.Unstructured {
	aci := &unstructured.Unstructured{}
	aci.SetGroupVersionKind(ACIGVK)
	aci.SetNamespace(n.CP())
	aci.SetName(n.HCName)
	aci.Object["spec"] = map[string]any{
		"clusterDeploymentRef":  map[string]any{"name": n.HCName},
		"provisionRequirements": map[string]any{"controlPlaneAgents": int64(3)},
		"networking":            map[string]any{"userManagedNetworking": true},
		"ignitionEndpoint":      map[string]any{"url": "https://ignition.example.com"},
	}
	return aci
}

// Frozen reads what the apiserver held of the binding's kinds and Agents
// when it was made: a cache whose watches have delivered nothing since.
type Frozen struct {
	sch  *runtime.Scheme
	mu   sync.Mutex
	objs map[string][]byte // group kind/namespace/name → JSON
}

// Freeze reads them now.
func Freeze(t testing.TB, ctx context.Context, c client.Client, sch *runtime.Scheme) *Frozen {
	t.Helper()
	f := &Frozen{sch: sch, objs: map[string][]byte{}}
	for _, gvk := range []schema.GroupVersionKind{ClusterDeploymentGVK, ACIGVK, HostedControlPlaneGVK, binding.AgentMachineGVK,
		hypershift.GroupVersion.WithKind("HostedCluster"), v1beta1.GroupVersion.WithKind("Agent")} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		require.NoError(t, c.List(ctx, list))
		for _, item := range list.Items {
			raw, err := json.Marshal(item.Object)
			require.NoError(t, err)
			f.objs[key(gvk, item.GetNamespace(), item.GetName())] = raw
		}
	}
	return f
}

func key(gvk schema.GroupVersionKind, ns, name string) string {
	return gvk.GroupKind().String() + "/" + ns + "/" + name
}

// Get reads an object as it was.
func (f *Frozen) Get(_ context.Context, k client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, f.sch)
	if err != nil {
		return err
	}
	f.mu.Lock()
	raw, ok := f.objs[key(gvk, k.Namespace, k.Name)]
	f.mu.Unlock()
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, k.Name)
	}
	if u, isU := obj.(*unstructured.Unstructured); isU {
		return json.Unmarshal(raw, &u.Object)
	}
	return json.Unmarshal(raw, obj)
}

// List lists objects as they were (unstructured lists only).
func (f *Frozen) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	u, ok := list.(*unstructured.UnstructuredList)
	if !ok {
		return fmt.Errorf("bindtest.Frozen lists unstructured only, not %T", list)
	}
	o := (&client.ListOptions{}).ApplyOptions(opts)
	gvk := u.GroupVersionKind()
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, raw := range f.objs {
		item := unstructured.Unstructured{}
		if err := json.Unmarshal(raw, &item.Object); err != nil {
			return err
		}
		if k == key(gvk, item.GetNamespace(), item.GetName()) && (o.Namespace == "" || o.Namespace == item.GetNamespace()) {
			u.Items = append(u.Items, item)
		}
	}
	return nil
}
