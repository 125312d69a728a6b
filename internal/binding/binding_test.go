package binding_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/scheme"
	"github.com/agentboot/agentboot/test/bindtest"
	"github.com/agentboot/agentboot/test/testenv"
)

const agentName = "00000000-0000-4000-8000-000000000001"

// A binding resolved from an informer cache is cheap and may be behind;
// what is approved or handed out rests on Confirm, which reads the
// apiserver: each revocation, made while a cache still holds the binding,
// is refused by Confirm at once. The informer cache then sees it too.
func TestCachedBindingRevokedAtOnce(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := env.Client
	cl := bindtest.NewCluster(t, ctx, c)
	a, am := cl.Bind(ctx, agentName, "vcluster2-abcde")
	require.NoError(t, c.Create(ctx, a))

	sch, err := scheme.New()
	require.NoError(t, err)
	informers, err := cache.New(env.Config, cache.Options{Scheme: sch})
	require.NoError(t, err)
	go func() { _ = informers.Start(ctx) }()
	require.True(t, informers.WaitForCacheSync(ctx))

	cached, err := binding.Resolve(ctx, informers, a)
	require.NoError(t, err, "the binding holds, read from the cache")
	require.Equal(t, am.GetName(), cached.AgentMachine)
	confirmed, err := binding.Confirm(ctx, c, a, cached)
	require.NoError(t, err)
	require.Equal(t, cached.Digest(), confirmed.Digest())

	hc := cl.HC
	for _, rev := range []struct {
		name           string
		revoke, revert func()
		refused        string // "": not a refusal, the binding changed
	}{{
		name:    "the AgentMachine is deleted",
		revoke:  func() { require.NoError(t, c.Delete(ctx, am)) },
		revert:  func() { am = cl.AgentMachine(ctx, am.GetName(), agentName) },
		refused: "no AgentMachine in namespace clusters-vcluster2 references this Agent",
	}, {
		name: "the HostedCluster takes its Agents from another namespace",
		revoke: func() {
			hc.Spec.Platform.Agent.AgentNamespace = "team-b"
			require.NoError(t, c.Update(ctx, hc))
		},
		revert: func() {
			hc.Spec.Platform.Agent.AgentNamespace = bindtest.AgentNamespace
			require.NoError(t, c.Update(ctx, hc))
		},
		refused: `HostedCluster clusters/vcluster2 does not take its Agents from namespace "agents"`,
	}, {
		name: "cluster-api-provider-agent unbinds the Agent",
		revoke: func() {
			cur := &v1beta1.Agent{}
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(a), cur))
			delete(cur.Labels, lifecycle.AgentMachineRefLabel)
			cur.Spec.ClusterDeploymentName = nil
			require.NoError(t, c.Update(ctx, cur))
		},
		revert: func() {
			cur := &v1beta1.Agent{}
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(a), cur))
			bindtest.Default.Bound(cur, am.GetName())
			require.NoError(t, c.Update(ctx, cur))
		},
		refused: "the Agent is not bound",
	}, {
		name: "the AgentClusterInstall is replaced",
		revoke: func() {
			require.NoError(t, c.Delete(ctx, bindtest.Default.AgentClusterInstall()))
			require.NoError(t, c.Create(ctx, bindtest.Default.AgentClusterInstall()))
		},
		revert: func() {},
	}} {
		t.Run(rev.name, func(t *testing.T) {
			cur, err := binding.Resolve(ctx, informers, a)
			require.NoError(t, err)
			// What the cache holds at this moment, kept: a cache whose
			// watches have not delivered the revocation yet.
			stale := bindtest.Freeze(t, ctx, c, sch)
			rev.revoke()
			_, err = binding.Resolve(ctx, stale, a)
			require.NoError(t, err, "the stale cache still holds the binding")
			_, err = binding.Confirm(ctx, c, a, cur)
			require.Error(t, err, "Confirm after the revocation")
			if rev.refused != "" {
				require.True(t, binding.IsRefused(err), "%v", err)
				require.ErrorContains(t, err, rev.refused)
			} else {
				require.False(t, binding.IsRefused(err), "a changed binding is waited on, not refused: %v", err)
				require.ErrorContains(t, err, "changed a moment ago")
			}
			// The informer cache catches up by watch.
			require.Eventually(t, func() bool {
				agent := &v1beta1.Agent{}
				if err := informers.Get(ctx, client.ObjectKeyFromObject(a), agent); err != nil {
					return false
				}
				now, err := binding.Resolve(ctx, informers, agent)
				return err != nil || now.Digest() != cur.Digest()
			}, 10*time.Second, 20*time.Millisecond)
			rev.revert()
			require.Eventually(t, func() bool {
				b, err := binding.Resolve(ctx, informers, a)
				if err != nil {
					return false
				}
				_, err = binding.Confirm(ctx, c, a, b)
				return err == nil
			}, 10*time.Second, 20*time.Millisecond, "the binding holds again once restored")
		})
	}
}

// The AgentMachine is read by the name the label gives; a label holding
// the AgentMachine's UID (older provider releases) finds it by a list, and
// a label naming another AgentMachine is refused with both names.
func TestAgentMachineByNameOrUID(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	cl := bindtest.NewCluster(t, ctx, env.Client)
	a, am := cl.Bind(ctx, agentName, "vcluster2-abcde")
	cl.AgentMachine(ctx, "vcluster2-other", "")
	for _, tc := range []struct{ label, refused string }{
		{label: am.GetName()},
		{label: string(am.GetUID())},
		{label: "vcluster2-other", refused: `AgentMachine clusters-vcluster2/vcluster2-abcde references this Agent, but its agentMachineRef label names "vcluster2-other"`},
		{label: "nothing", refused: `its agentMachineRef label names "nothing"`},
	} {
		a.Labels = map[string]string{lifecycle.AgentMachineRefLabel: tc.label}
		b, err := binding.Resolve(ctx, env.Client, a)
		if tc.refused != "" {
			require.ErrorContains(t, err, tc.refused, "label %s", tc.label)
			require.True(t, binding.IsRefused(err))
			continue
		}
		require.NoError(t, err, "label %s", tc.label)
		require.Equal(t, am.GetName(), b.AgentMachine)
	}
}
