package capiagent

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/test/bindtest"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/testenv"
)

// Options describe one hosted cluster.
type Options struct {
	// Namespace and Name of the HostedCluster ("clusters", "vcluster2").
	Namespace, Name string
	// AgentNamespace is where its Agents live.
	AgentNamespace string
	// Hosted is the hosted cluster's apiserver.
	Hosted *hosted.Cluster
	// IgnitionEndpoint is host:port of its Ignition server, and IgnitionCA
	// the PEM CA of that server's certificate.
	IgnitionEndpoint string
	IgnitionCA       []byte
	// Token is the NodePools' bearer token (HyperShift's, base64).
	Token string
	// Provider starts cluster-api-provider-agent (true) or leaves it for
	// the test to start (StartProvider), e.g. after Agents exist.
	Provider bool
}

// Cluster is one Agent-platform hosted cluster as HyperShift, Cluster API
// core and cluster-api-provider-agent keep it in the management cluster.
type Cluster struct {
	T    testing.TB
	Env  *testenv.Env
	C    client.Client // admin
	Opts Options
	// CP is the control-plane namespace, InfraID the Cluster's name.
	CP, InfraID string
	HC          *hypershift.HostedCluster
	// AgentMachinePasses records the provider's finished passes over each
	// AgentMachine: a test that shows the provider did not do something
	// waits for its passes (Settle), not for its 5 s poll on the clock.
	AgentMachinePasses *testenv.Passes
	// AgentUpdates records each Agent the provider wrote, as written.
	mu           sync.Mutex
	agentUpdates []Agent
	stopProvider context.CancelFunc
}

// Start creates the hosted cluster's objects as HyperShift does and, with
// opts.Provider, starts cluster-api-provider-agent.
func Start(t testing.TB, env *testenv.Env, opts Options) *Cluster {
	t.Helper()
	ctx := context.Background()
	c := &Cluster{T: t, Env: env, C: env.Client, Opts: opts, CP: opts.Namespace + "-" + opts.Name, InfraID: bindtest.InfraID(opts.Name)}
	for _, ns := range []string{opts.Namespace, c.CP, opts.AgentNamespace} {
		if err := c.C.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
	}
	kc, err := os.ReadFile(opts.Hosted.Env.Kubeconfig)
	require.NoError(t, err)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "pull-secret"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "admin-kubeconfig"}, Data: map[string][]byte{"kubeconfig": kc}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "ignition-server-ca-cert"}, Data: map[string][]byte{corev1.TLSCertKey: opts.IgnitionCA}},
	} {
		require.NoError(t, c.C.Create(ctx, s))
	}
	// HyperShift's HostedCluster (agentboot reads it for NodePool events).
	c.HC = &hypershift.HostedCluster{ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: opts.Name},
		Spec: hypershift.HostedClusterSpec{Platform: hypershift.PlatformSpec{Type: hypershift.AgentPlatform,
			Agent: &hypershift.AgentPlatformSpec{AgentNamespace: opts.AgentNamespace}}}}
	require.NoError(t, c.C.Create(ctx, c.HC))
	c.HC.Status.IgnitionEndpoint = opts.IgnitionEndpoint
	require.NoError(t, c.C.Status().Update(ctx, c.HC))

	// HyperShift's operator names the HostedCluster on its control plane.
	hcp := bindtest.Names{HCNamespace: opts.Namespace, HCName: opts.Name, AgentNamespace: opts.AgentNamespace}.HostedControlPlane()
	require.NoError(t, c.C.Create(ctx, hcp))
	_ = unstructured.SetNestedMap(hcp.Object, map[string]any{"name": "admin-kubeconfig", "key": "kubeconfig"}, "status", "kubeConfig")
	require.NoError(t, c.C.Status().Update(ctx, hcp))

	// HyperShift's Cluster and AgentCluster; CAPI core makes the Cluster
	// the AgentCluster's owner.
	ac := newObj(AgentClusterGVK)
	ac.SetNamespace(c.CP)
	ac.SetName(opts.Name)
	ac.Object["spec"] = map[string]any{
		"ignitionEndpoint": map[string]any{"url": "https://" + opts.IgnitionEndpoint + "/ignition",
			"caCertificateReference": map[string]any{"namespace": c.CP, "name": "ignition-server-ca-cert"}},
		"controlPlaneEndpoint": map[string]any{"host": "api." + opts.Name + ".example.com", "port": int64(6443)},
	}
	require.NoError(t, c.C.Create(ctx, ac))
	cl := newObj(ClusterGVK)
	cl.SetNamespace(c.CP)
	cl.SetName(c.InfraID)
	cl.Object["spec"] = map[string]any{
		"controlPlaneRef":   map[string]any{"apiGroup": "hypershift.openshift.io", "kind": "HostedControlPlane", "name": opts.Name},
		"infrastructureRef": map[string]any{"apiGroup": AgentClusterGVK.Group, "kind": "AgentCluster", "name": opts.Name},
	}
	require.NoError(t, c.C.Create(ctx, cl))
	ac.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: ClusterGVK.GroupVersion().String(), Kind: "Cluster", Name: c.InfraID, UID: cl.GetUID()}})
	require.NoError(t, c.C.Update(ctx, ac))
	if opts.Provider {
		c.StartProvider()
		c.WaitClusterDeployment()
	}
	return c
}

// WaitClusterDeployment waits until the provider created the
// ClusterDeployment and recorded it on the AgentCluster. An AgentMachine it
// reconciles before then is not requeued (as upstream), so tests scale
// NodePools after this.
func (c *Cluster) WaitClusterDeployment() {
	c.T.Helper()
	require.Eventually(c.T, func() bool {
		ac := newObj(AgentClusterGVK)
		return c.C.Get(context.Background(), client.ObjectKey{Namespace: c.CP, Name: c.Opts.Name}, ac) == nil &&
			str(ac, "status", "clusterDeploymentReference", "name") != ""
	}, 2*time.Minute, 100*time.Millisecond, "cluster-api-provider-agent never created the ClusterDeployment")
}

// StartProvider starts cluster-api-provider-agent for this cluster, as its
// own ServiceAccount with the RBAC HyperShift gives it; StopProvider stops
// it (a restart is StopProvider then StartProvider).
func (c *Cluster) StartProvider() {
	t := c.T
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := c.providerIdentity()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, addAgentTypes(s))
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s,
		// Its own, bound to t (controller-runtime's global logger takes
		// only its first SetLogger; test/stack points it at stderr).
		Logger:                 testr.NewWithInterface(t, testr.Options{}),
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{c.CP: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
	})
	require.NoError(t, err)
	agents, err := cluster.New(cfg, func(o *cluster.Options) {
		o.Scheme = s
		o.Logger = testr.NewWithInterface(t, testr.Options{})
		o.Cache.DefaultNamespaces = map[string]cache.Config{c.Opts.AgentNamespace: {}}
	})
	require.NoError(t, err)
	require.NoError(t, mgr.Add(agents))
	c.AgentMachinePasses = testenv.NewPasses()
	p := &provider{c: mgr.GetClient(), agents: agents.GetClient(), agentsNS: c.Opts.AgentNamespace, passes: c.AgentMachinePasses, onAgentUpdate: func(a *Agent) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.agentUpdates = append(c.agentUpdates, *a.DeepCopyObject().(*Agent))
	}}
	require.NoError(t, p.setup(mgr, agents))
	require.NoError(t, ctrl.NewControllerManagedBy(mgr).Named("nodeproviderid").For(newObj(AgentMachineGVK)).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			return c.setNodeProviderID(ctx, mgr.GetClient(), req)
		})))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("cluster-api-provider-agent: %v", err)
		}
	}()
	c.stopProvider = func() { cancel(); <-done }
	t.Cleanup(c.StopProvider)
}

// StopProvider stops cluster-api-provider-agent.
func (c *Cluster) StopProvider() {
	if c.stopProvider != nil {
		c.stopProvider()
		c.stopProvider = nil
	}
}

// AgentUpdates are the Agents the provider wrote, in order.
func (c *Cluster) AgentUpdates() []Agent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Agent(nil), c.agentUpdates...)
}

// providerIdentity is the provider's ServiceAccount with HyperShift's
// RBAC: its policy rules in the control-plane namespace and the Role
// capi-provider-role-<cp ns> on Agents in the agent namespace.
func (c *Cluster) providerIdentity() *rest.Config {
	t := c.T
	ctx := context.Background()
	sa := "capi-provider"
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	for _, obj := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: sa}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "capi-provider"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"capi-provider.agent-install.openshift.io"}, Resources: []string{"*"}, Verbs: all},
			{APIGroups: []string{"extensions.hive.openshift.io"}, Resources: []string{"agentclusterinstalls"}, Verbs: all},
			{APIGroups: []string{"hive.openshift.io"}, Resources: []string{"clusterdeployments"}, Verbs: all},
			{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"clusters", "machines"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{"hypershift.openshift.io"}, Resources: []string{"hostedcontrolplanes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: all},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "capi-provider"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "capi-provider"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: c.CP, Name: sa}}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: c.Opts.AgentNamespace, Name: "capi-provider-role-" + c.CP}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"agent-install.openshift.io"}, Resources: []string{"agents"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: c.Opts.AgentNamespace, Name: "capi-provider-role-" + c.CP},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "capi-provider-role-" + c.CP},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: c.CP, Name: sa}}},
	} {
		if err := c.C.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
	}
	cfg := rest.CopyConfig(c.Env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + c.CP + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + c.CP, "system:authenticated"}}
	return cfg
}

// setNodeProviderID is the provider's node_provider_id controller: once
// an AgentMachine is ready, the hosted cluster's Node named by its
// InternalDNS address gets providerID agent://<agent>.
func (c *Cluster) setNodeProviderID(ctx context.Context, cl client.Client, req reconcile.Request) (reconcile.Result, error) {
	am := newObj(AgentMachineGVK)
	if err := cl.Get(ctx, req.NamespacedName, am); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ready, _, _ := unstructured.NestedBool(am.Object, "status", "ready"); !ready || am.GetDeletionTimestamp() != nil {
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	var s corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: am.GetNamespace(), Name: "admin-kubeconfig"}, &s); err != nil {
		return reconcile.Result{}, err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(s.Data["kubeconfig"])
	if err != nil {
		return reconcile.Result{}, err
	}
	hc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return reconcile.Result{}, err
	}
	node := ""
	addrs, _, _ := unstructured.NestedSlice(am.Object, "status", "addresses")
	for _, a := range addrs {
		if m := a.(map[string]any); m["type"] == "InternalDNS" {
			node, _ = m["address"].(string)
		}
	}
	n, err := hc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return reconcile.Result{RequeueAfter: 30 * time.Second}, client.IgnoreNotFound(err)
	}
	if n.Spec.ProviderID == "" {
		patch := fmt.Sprintf(`{"spec":{"providerID":%q}}`, "agent://"+str(am, "status", "agentRef", "name"))
		if _, err := hc.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// NodePool is one HyperShift NodePool with its MachineDeployment's
// machines, played by hand.
type NodePool struct {
	c        *Cluster
	NP       *hypershift.NodePool
	UserData string // the user-data Secret's name
	Selector map[string]string
}

// NodePool creates NodePool name (replicas 0) and its user-data Secret,
// as HyperShift does.
func (c *Cluster) NodePool(name string, selector map[string]string) *NodePool {
	t := c.T
	ctx := context.Background()
	zero := int32(0)
	np := &hypershift.NodePool{ObjectMeta: metav1.ObjectMeta{Namespace: c.Opts.Namespace, Name: name},
		Spec: hypershift.NodePoolSpec{ClusterName: c.Opts.Name, Replicas: &zero,
			Platform: hypershift.NodePoolPlatform{Type: hypershift.AgentPlatform,
				Agent: &hypershift.AgentNodePoolPlatform{AgentLabelSelector: &metav1.LabelSelector{MatchLabels: selector}}}}}
	require.NoError(t, c.C.Create(ctx, np))
	hash := "4f2a9c1e"
	pointer := fmt.Sprintf(`{"ignition":{"version":"3.2.0","security":{"tls":{"certificateAuthorities":[{"source":"data:text/plain;base64,%s"}]}},`+
		`"config":{"merge":[{"source":"https://%s/ignition","httpHeaders":[{"name":"Authorization","value":"Bearer %s"},`+
		`{"name":"NodePool","value":"%s/%s"},{"name":"TargetConfigVersionHash","value":"%s"}]}]}}}`,
		base64.StdEncoding.EncodeToString(c.Opts.IgnitionCA), c.Opts.IgnitionEndpoint, c.Opts.Token, c.Opts.Namespace, name, hash)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.CP, Name: "user-data-" + name + "-" + hash,
		Annotations: map[string]string{hypershift.NodePoolAnnotation: c.Opts.Namespace + "/" + name}},
		Data: map[string][]byte{"value": []byte(pointer), "disableTemplating": []byte("true")}}
	require.NoError(t, c.C.Create(ctx, secret))
	return &NodePool{c: c, NP: np, UserData: secret.Name, Selector: selector}
}

// Machines lists the NodePool's Machines, oldest first.
func (p *NodePool) Machines() []unstructured.Unstructured {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(MachineGVK.GroupVersion().WithKind("MachineList"))
	require.NoError(p.c.T, p.c.C.List(context.Background(), list, client.InNamespace(p.c.CP),
		client.MatchingLabels{"cluster.x-k8s.io/deployment-name": p.NP.Name}))
	items := list.Items
	sort.Slice(items, func(i, j int) bool {
		ti, tj := items[i].GetCreationTimestamp(), items[j].GetCreationTimestamp()
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return items[i].GetName() < items[j].GetName()
	})
	return items
}

// AgentMachine reads the AgentMachine of a Machine.
func (p *NodePool) AgentMachine(machine string) *unstructured.Unstructured {
	am := newObj(AgentMachineGVK)
	err := p.c.C.Get(context.Background(), client.ObjectKey{Namespace: p.c.CP, Name: machine}, am)
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(p.c.T, err)
	return am
}

// Scale sets spec.replicas and plays the MachineSet: new machines are
// created (the AgentMachine from the template, the Machine, then CAPI's
// owner reference); on scale-down the newest machines are deleted
// through Cluster API's Machine deletion (Delete).
func (p *NodePool) Scale(n int) {
	t := p.c.T
	t.Helper()
	ctx := context.Background()
	np := &hypershift.NodePool{}
	require.NoError(t, p.c.C.Get(ctx, client.ObjectKeyFromObject(p.NP), np))
	replicas := int32(n)
	np.Spec.Replicas = &replicas
	require.NoError(t, p.c.C.Update(ctx, np))
	var live []unstructured.Unstructured
	for _, m := range p.Machines() {
		if m.GetDeletionTimestamp() == nil {
			live = append(live, m)
		}
	}
	for i := len(live); i < n; i++ {
		p.create()
	}
	for i := len(live) - 1; i >= n; i-- {
		p.Delete(live[i].GetName())
	}
}

func (p *NodePool) create() {
	t := p.c.T
	ctx := context.Background()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := p.NP.Name + "-" + hex.EncodeToString(b)
	labels := map[string]string{clusterNameLabel: p.c.InfraID, "cluster.x-k8s.io/deployment-name": p.NP.Name,
		"cluster.x-k8s.io/set-name": p.NP.Name + "-5d8f7"}
	am := newObj(AgentMachineGVK)
	am.SetNamespace(p.c.CP)
	am.SetName(name)
	am.SetLabels(labels)
	sel := map[string]any{}
	for k, v := range p.Selector {
		sel[k] = v
	}
	am.Object["spec"] = map[string]any{"agentLabelSelector": map[string]any{"matchLabels": sel}}
	require.NoError(t, p.c.C.Create(ctx, am))
	m := newObj(MachineGVK)
	m.SetNamespace(p.c.CP)
	m.SetName(name)
	m.SetLabels(labels)
	m.SetFinalizers([]string{"machine.cluster.x-k8s.io"})
	m.Object["spec"] = map[string]any{
		"clusterName":       p.c.InfraID,
		"bootstrap":         map[string]any{"dataSecretName": p.UserData},
		"infrastructureRef": map[string]any{"apiGroup": AgentMachineGVK.Group, "kind": "AgentMachine", "name": name},
	}
	require.NoError(t, p.c.C.Create(ctx, m))
	am.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: MachineGVK.GroupVersion().String(), Kind: "Machine", Name: name, UID: m.GetUID(), Controller: ptrTrue()}})
	require.NoError(t, retryUpdate(ctx, p.c.C, am, func(o *unstructured.Unstructured) { o.SetOwnerReferences(am.GetOwnerReferences()) }))
}

// Delete plays Cluster API's deletion of a Machine in the background:
// drain the Node (cordon, delete its pods), wait for the pre-terminate
// hooks (condition Deleting, reason WaitingForPreTerminateHook), delete
// the AgentMachine and wait for it to go, delete the Node, drop the
// Machine's finalizer. Deleted reports when it is gone.
func (p *NodePool) Delete(name string) {
	t := p.c.T
	ctx := context.Background()
	m := newObj(MachineGVK)
	require.NoError(t, p.c.C.Get(ctx, client.ObjectKey{Namespace: p.c.CP, Name: name}, m))
	require.NoError(t, p.c.C.Delete(ctx, m))
	// The deletion ends with the test, before the control plane it writes
	// to is handed to the next test (a late write deleted a Node by a name
	// the next test reuses).
	dctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.c.deleteMachine(dctx, name)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func (c *Cluster) deleteMachine(ctx context.Context, name string) {
	key := client.ObjectKey{Namespace: c.CP, Name: name}
	am := newObj(AgentMachineGVK)
	node := ""
	if err := c.C.Get(ctx, key, am); err == nil {
		addrs, _, _ := unstructured.NestedSlice(am.Object, "status", "addresses")
		for _, a := range addrs {
			if m := a.(map[string]any); m["type"] == "InternalDNS" {
				node, _ = m["address"].(string)
			}
		}
	}
	hc := c.Opts.Hosted.Admin
	if node != "" {
		if _, err := hc.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err == nil {
			pods, _ := hc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
			for _, pod := range pods.Items {
				_ = hc.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
			}
		}
	}
	m := newObj(MachineGVK)
	if err := retryStatus(ctx, c.C, key, m, func(o *unstructured.Unstructured) {
		_ = unstructured.SetNestedSlice(o.Object, []any{map[string]any{"type": "Deleting", "status": "True", "reason": "WaitingForPreTerminateHook",
			"message": "Waiting for pre-terminate hooks to succeed (hooks: agentmachine)", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}}, "status", "conditions")
	}); err != nil {
		return
	}
	for ctx.Err() == nil {
		if err := c.C.Get(ctx, key, m); err != nil {
			return
		}
		hooked := false
		for k := range m.GetAnnotations() {
			hooked = hooked || strings.HasPrefix(k, "pre-terminate.delete.hook.machine.cluster.x-k8s.io")
		}
		if !hooked {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.C.Delete(ctx, newObjNamed(AgentMachineGVK, key)); err != nil && !apierrors.IsNotFound(err) {
		return
	}
	for ctx.Err() == nil {
		if err := c.C.Get(ctx, key, newObj(AgentMachineGVK)); apierrors.IsNotFound(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if node != "" {
		_ = hc.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	}
	_ = retryUpdate(ctx, c.C, m, func(o *unstructured.Unstructured) { o.SetFinalizers(nil) })
}

func newObjNamed(gvk schema.GroupVersionKind, key client.ObjectKey) *unstructured.Unstructured {
	u := newObj(gvk)
	u.SetNamespace(key.Namespace)
	u.SetName(key.Name)
	return u
}

// retryUpdate re-reads obj and applies change until the Update is not a
// conflict.
func retryUpdate(ctx context.Context, c client.Client, obj *unstructured.Unstructured, change func(*unstructured.Unstructured)) error {
	for {
		cur := newObj(obj.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
			return err
		}
		change(cur)
		err := c.Update(ctx, cur)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func retryStatus(ctx context.Context, c client.Client, key client.ObjectKey, obj *unstructured.Unstructured, change func(*unstructured.Unstructured)) error {
	for {
		if err := c.Get(ctx, key, obj); err != nil {
			return err
		}
		change(obj)
		err := c.Status().Update(ctx, obj)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func ptrTrue() *bool { b := true; return &b }
