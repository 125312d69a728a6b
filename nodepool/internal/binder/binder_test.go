package binder

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
)

// A replica whose cache has not seen a new NodePool yet, woken by an
// Agent another replica bound to it, leaves that Agent bound; once the
// NodePool is really gone, its Agents go back to the pool.
func TestLateCacheDoesNotReleaseAgents(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	for _, ns := range []string{"agents", "clusters"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	np := &hypershift.NodePool{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters", Name: "workers"},
		Spec: hypershift.NodePoolSpec{ClusterName: "vcluster2", Platform: hypershift.NodePoolPlatform{Type: hypershift.AgentPlatform}}}
	require.NoError(t, env.Client.Create(ctx, np))
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000001",
		Labels: map[string]string{NodePoolLabel: np.Name, NodePoolNamespaceLabel: np.Namespace}},
		Spec: v1beta1.AgentSpec{Approved: true, Role: v1beta1.AgentRoleWorker,
			ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "clusters", Name: "vcluster2"}}}
	require.NoError(t, env.Client.Create(ctx, a))

	late, err := env.LateCache(&hypershift.NodePool{})
	require.NoError(t, err)
	r := &Reconciler{Client: late, APIReader: env.Client, Events: &events.FakeRecorder{}}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(np)}
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), a))
	require.NotNil(t, a.Spec.ClusterDeploymentName, "an Agent of a NodePool the cache has not seen yet was unbound")

	require.NoError(t, env.Client.Delete(ctx, np))
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), a))
	require.Nil(t, a.Spec.ClusterDeploymentName, "an Agent of a deleted NodePool stays bound")
	require.Empty(t, a.Labels[NodePoolLabel])
}
