package nodepool_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/scheme"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/test/stack"
)

// wait bounds every wait: generous, for a loaded two-core CI machine that
// runs several control planes at once.
const wait = 2 * time.Minute

type env struct {
	*stack.Stack
	t        *testing.T
	agentsNS string // the InfraEnv's namespace, where the Agents live
	ie       *v1beta1.InfraEnv
	hc       *hypershift.HostedCluster
}

// start runs agentboot with a HostedCluster "vcluster2" on the Agent
// platform whose Agents live in the InfraEnv's namespace, and n ready
// Agents there labelled pool=a.
func start(t *testing.T, n int) *env {
	return startOn(t, stack.Start(t, stack.Options{NodePool: nodepool.Config{RetryAfter: time.Second, Poll: 300 * time.Millisecond}}), n)
}

// startOn is start on a running stack.
func startOn(t *testing.T, s *stack.Stack, n int) *env {
	ctx := context.Background()
	e := &env{Stack: s, t: t, ie: s.CreateInfraEnv(t, "agents", "pool", nil)}
	e.agentsNS = e.ie.Namespace
	clusters := s.Namespace(t, "clusters")
	e.hc = &hypershift.HostedCluster{ObjectMeta: metav1.ObjectMeta{Namespace: clusters, Name: "vcluster2"},
		Spec: hypershift.HostedClusterSpec{Platform: hypershift.PlatformSpec{Type: hypershift.AgentPlatform,
			Agent: &hypershift.AgentPlatformSpec{AgentNamespace: e.agentsNS}}}}
	require.NoError(t, s.Client.Create(ctx, e.hc))
	for i := 1; i <= n; i++ {
		e.readyAgent(i, map[string]string{"pool": "a"})
	}
	return e
}

// readyAgent registers host i, approves and labels it, and waits until
// it is validated and connected.
func (e *env) readyAgent(i int, labels map[string]string) string {
	e.t.Helper()
	ctx := context.Background()
	h := e.Register(e.t, e.ie, i)
	var a v1beta1.Agent
	require.Eventually(e.t, func() bool {
		if e.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a) != nil {
			return false
		}
		patch := client.MergeFrom(a.DeepCopy())
		a.Spec.Approved = true
		for k, v := range labels {
			a.Labels[k] = v
		}
		return e.Client.Patch(ctx, &a, patch) == nil
	}, wait, 100*time.Millisecond)
	ready := func(a *v1beta1.Agent) bool {
		return conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) && conditions.IsTrue(a.Status.Conditions, v1beta1.ConnectedCondition)
	}
	key := client.ObjectKeyFromObject(&a)
	if !assert.Eventually(e.t, func() bool {
		var got v1beta1.Agent
		return e.Client.Get(ctx, key, &got) == nil && ready(&got)
	}, wait, 100*time.Millisecond) {
		require.NoError(e.t, e.Client.Get(ctx, key, &a))
		e.t.Fatalf("Agent %s never validated and connected: %+v", a.Name, a.Status.Conditions)
	}
	return a.Name
}

func (e *env) nodePool(name string, replicas int32, selector map[string]string) *hypershift.NodePool {
	np := &hypershift.NodePool{ObjectMeta: metav1.ObjectMeta{Namespace: e.hc.Namespace, Name: name},
		Spec: hypershift.NodePoolSpec{ClusterName: e.hc.Name, Replicas: &replicas,
			Platform: hypershift.NodePoolPlatform{Type: hypershift.AgentPlatform,
				Agent: &hypershift.AgentNodePoolPlatform{AgentLabelSelector: &metav1.LabelSelector{MatchLabels: selector}}}}}
	require.NoError(e.t, e.Client.Create(context.Background(), np))
	return np
}

// scale does what `kubectl scale nodepool/<name> --replicas n` does.
func (e *env) scale(np *hypershift.NodePool, n int32) {
	out, err := e.Env.Kubectl(context.Background(), "", "-n", np.Namespace, "scale", "nodepool/"+np.Name, "--replicas", fmt.Sprint(n))
	require.NoError(e.t, err, out)
}

// boundTo lists the Agents bound to np.
func (e *env) boundTo(np *hypershift.NodePool) []v1beta1.Agent {
	var list v1beta1.AgentList
	require.NoError(e.t, e.Client.List(context.Background(), &list, client.InNamespace(e.agentsNS),
		client.MatchingLabels{"agentboot.io/nodepool": np.Name, "agentboot.io/nodepool-namespace": np.Namespace}))
	return list.Items
}

func (e *env) waitBound(np *hypershift.NodePool, n int) []v1beta1.Agent {
	e.t.Helper()
	var got []v1beta1.Agent
	require.Eventually(e.t, func() bool { got = e.boundTo(np); return len(got) == n }, wait, 100*time.Millisecond,
		"NodePool %s: want %d bound Agents", np.Name, n)
	// Stays there: no more are bound.
	time.Sleep(time.Second)
	require.Len(e.t, e.boundTo(np), n)
	return got
}

func TestScaleUpAndDown(t *testing.T) {
	e := start(t, 3)
	ctx := context.Background()
	other := e.readyAgent(9, map[string]string{"pool": "b"}) // not selected
	np := e.nodePool("vcluster2", 0, map[string]string{"pool": "a"})
	e.scale(np, 2)
	bound := e.waitBound(np, 2)
	for _, a := range bound {
		require.Equal(t, &v1beta1.ClusterReference{Name: "vcluster2", Namespace: e.hc.Namespace + "-vcluster2"}, a.Spec.ClusterDeploymentName)
		require.Equal(t, v1beta1.AgentRoleWorker, a.Spec.Role)
		require.NotEqual(t, other, a.Name)
	}
	// The Agent controller reports them bound, and kubectl shows the cluster
	// and the role as `oc get agents` does.
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		return e.Client.Get(ctx, client.ObjectKeyFromObject(&bound[0]), &a) == nil &&
			conditions.IsTrue(a.Status.Conditions, v1beta1.BoundCondition) && a.Status.Role == v1beta1.AgentRoleWorker && a.Status.DebugInfo.State == "known"
	}, wait, 100*time.Millisecond)
	out, err := e.Env.Kubectl(ctx, "", "-n", e.agentsNS, "get", "agents")
	require.NoError(t, err)
	t.Logf("kubectl get agents:\n%s", out)
	for _, a := range bound {
		require.Regexp(t, a.Name+`\s+vcluster2\s+true\s+worker`, out)
	}
	require.Regexp(t, other+`\s+true\s+auto-assign`, out)

	// 2 → 1: the newest is released and shows unbound again.
	e.scale(np, 1)
	left := e.waitBound(np, 1)
	newest := slices.MaxFunc(bound, func(a, b v1beta1.Agent) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	if !bound[0].CreationTimestamp.Equal(&bound[1].CreationTimestamp) {
		require.NotEqual(t, newest.Name, left[0].Name, "the newest Agent should be released first")
	}
	require.Eventually(t, func() bool {
		var list v1beta1.AgentList
		require.NoError(t, e.Client.List(ctx, &list, client.InNamespace(e.agentsNS)))
		unbound := 0
		for _, a := range list.Items {
			if a.Spec.ClusterDeploymentName == nil && conditions.Find(a.Status.Conditions, v1beta1.BoundCondition) != nil &&
				!conditions.IsTrue(a.Status.Conditions, v1beta1.BoundCondition) && a.Status.DebugInfo.State == "known-unbound" {
				unbound++
			}
		}
		return unbound == 3 // the released one, the third pool=a one and pool=b
	}, wait, 100*time.Millisecond)
	requireEvent(t, e, np.Name, "AgentReleased")
}

func TestNothingMatchesExplains(t *testing.T) {
	e := start(t, 1)
	np := e.nodePool("empty", 2, map[string]string{"pool": "nope"})
	requireEvent(t, e, np.Name, `2 more Agent(s) wanted: 0 Agent(s) in namespace `+e.agentsNS+` match the selector "pool=nope"`)
	np2 := e.nodePool("one-short", 2, map[string]string{"pool": "a"})
	e.waitBound(np2, 1)
	requireEvent(t, e, np2.Name, `1 more Agent(s) wanted: 1 Agent(s) in namespace `+e.agentsNS+` match the selector "pool=a", 1 already bound`)
	// A new ready Agent is taken without touching the NodePool.
	e.readyAgent(2, map[string]string{"pool": "a"})
	e.waitBound(np2, 2)
	// A NodePool of a missing HostedCluster waits, saying so.
	lost := &hypershift.NodePool{ObjectMeta: metav1.ObjectMeta{Namespace: e.hc.Namespace, Name: "lost"},
		Spec: hypershift.NodePoolSpec{ClusterName: "missing", Replicas: new(int32(1)), Platform: hypershift.NodePoolPlatform{Type: hypershift.AgentPlatform}}}
	require.NoError(t, e.Client.Create(context.Background(), lost))
	requireEvent(t, e, "lost", "HostedCluster "+e.hc.Namespace+"/missing named by spec.clusterName does not exist")
}

// Two NodePools and a second binder (as a second manager replica would run
// it) race for three Agents: every Agent ends up bound once, and no
// NodePool gets more than it asked for.
func TestRacingNodePoolsAndReplicas(t *testing.T) {
	e := start(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sch, err := scheme.New()
	require.NoError(t, err)
	mgr, err := ctrl.NewManager(e.Env.Config, ctrl.Options{Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	require.NoError(t, err)
	require.NoError(t, nodepool.SetupWithManager(mgr, nodepool.Config{RetryAfter: time.Second}))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	a := e.nodePool("a", 2, map[string]string{"pool": "a"})
	b := e.nodePool("b", 2, map[string]string{"pool": "a"})
	require.Eventually(t, func() bool { return len(e.boundTo(a))+len(e.boundTo(b)) == 3 }, wait, 100*time.Millisecond)
	time.Sleep(2 * time.Second)
	na, nb := e.boundTo(a), e.boundTo(b)
	require.Equal(t, 3, len(na)+len(nb))
	require.LessOrEqual(t, len(na), 2)
	require.LessOrEqual(t, len(nb), 2)
	seen := map[string]bool{}
	for _, x := range append(na, nb...) {
		require.False(t, seen[x.Name], "Agent %s bound twice", x.Name)
		seen[x.Name] = true
	}
}

// Agents that cluster-api-provider-agent bound (label agentMachineRef) are
// never taken.
func TestCAPIAgentsLeftAlone(t *testing.T) {
	e := start(t, 0)
	held := e.readyAgent(1, map[string]string{"pool": "a", "agentMachineRef": "m-1"})
	free := e.readyAgent(2, map[string]string{"pool": "a"})
	np := e.nodePool("vcluster2", 2, map[string]string{"pool": "a"})
	bound := e.waitBound(np, 1)
	require.Equal(t, free, bound[0].Name)
	require.NotEqual(t, held, bound[0].Name)
	requireEvent(t, e, np.Name, "1 held by cluster-api-provider-agent")
}

func requireEvent(t *testing.T, e *env, name, sub string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		if err := e.Client.List(context.Background(), &evs, client.InNamespace(e.hc.Namespace)); err != nil {
			return false
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == name && (strings.Contains(ev.Note, sub) || ev.Reason == sub)
		})
	}, wait, 100*time.Millisecond, "no event on %s mentioning %q; events: %s", name, sub, eventNotes(e, name))
}

func eventNotes(e *env, name string) string {
	var evs eventsv1.EventList
	_ = e.Client.List(context.Background(), &evs, client.InNamespace(e.hc.Namespace))
	var out []string
	for _, ev := range evs.Items {
		if ev.Regarding.Name == name {
			out = append(out, ev.Reason+": "+ev.Note)
		}
	}
	return strings.Join(out, "\n")
}

// runBinder runs a manager with only the NodePool controllers until ctx
// ends, its client wrapped by wrap; the returned channel closes when it
// has stopped.
func runBinder(t *testing.T, e *env, ctx context.Context, wrap func(client.WithWatch) client.WithWatch) <-chan struct{} {
	t.Helper()
	sch, err := scheme.New()
	require.NoError(t, err)
	skip := true
	mgr, err := ctrl.NewManager(e.Env.Config, ctrl.Options{Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip},
		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
			c, err := client.NewWithWatch(cfg, o)
			if err != nil {
				return nil, err
			}
			return wrap(c), nil
		}})
	require.NoError(t, err)
	require.NoError(t, nodepool.SetupWithManager(mgr, nodepool.Config{RetryAfter: time.Second}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = mgr.Start(ctx)
	}()
	return done
}

// The manager is killed right after its first binding write of the three
// a NodePool wants: the next manager counts what is bound and binds only
// the rest; no Agent is bound twice or lost.
func TestManagerKilledMidBinding(t *testing.T) {
	e := startOn(t, stack.Start(t, stack.Options{NodePool: nodepool.Config{Off: true}}), 4)
	np := e.nodePool("vcluster2", 3, map[string]string{"pool": "a"})

	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var killed atomic.Bool
	stopped := runBinder(t, e, ctx, func(c client.WithWatch) client.WithWatch {
		return interceptor.NewClient(c, interceptor.Funcs{
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if killed.Load() {
					return errors.New("the manager was killed")
				}
				if err := c.Update(ctx, obj, opts...); err != nil {
					return err
				}
				if obj.GetLabels()["agentboot.io/nodepool"] != "" {
					killed.Store(true)
					kill()
				}
				return nil
			},
		})
	})
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatal("the first manager never bound an Agent")
	}
	first := e.boundTo(np)
	require.Len(t, first, 1, "killed after one binding")

	ctx2, stop := context.WithCancel(context.Background())
	t.Cleanup(func() { stop() })
	stopped2 := runBinder(t, e, ctx2, func(c client.WithWatch) client.WithWatch { return c })
	t.Cleanup(func() { stop(); <-stopped2 })
	bound := e.waitBound(np, 3)
	names := map[string]bool{}
	for _, a := range bound {
		require.False(t, names[a.Name])
		names[a.Name] = true
		require.Equal(t, "vcluster2", a.Spec.ClusterDeploymentName.Name)
		require.Equal(t, v1beta1.AgentRoleWorker, a.Spec.Role)
	}
	require.True(t, names[first[0].Name], "the Agent bound before the kill stays bound")

	// The stack runs with NodePools off: its agent API hands bound hosts
	// no installation, and says nothing about one.
	h := e.Register(t, e.ie, 1)
	in, err := h.Heartbeat()
	require.NoError(t, err)
	require.Empty(t, in.Steps)
	a := e.agent(h)
	require.NotNil(t, a.Spec.ClusterDeploymentName)
	require.Empty(t, a.Status.Progress.ProgressInfo, "NodePools off, yet the install step was considered")
}
