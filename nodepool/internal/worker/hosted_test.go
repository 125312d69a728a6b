package worker

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
	"github.com/agentboot/agentboot/nodepool/internal/binder"
)

// One client per HostedCluster: reused while its kubeconfig is unchanged,
// replaced (not added to) when it rotates.
func TestHostedClientPerCluster(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clusters"}}))
	kc, err := os.ReadFile(env.Kubeconfig)
	require.NoError(t, err)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters", Name: "vcluster2-admin-kubeconfig"}, Data: map[string][]byte{"kubeconfig": kc}}
	require.NoError(t, env.Client.Create(ctx, secret))
	hc := &hypershift.HostedCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters", Name: "vcluster2"},
		Spec: hypershift.HostedClusterSpec{Platform: hypershift.PlatformSpec{Type: hypershift.AgentPlatform}}}
	require.NoError(t, env.Client.Create(ctx, hc))
	hc.Status.KubeConfig = &hypershift.KubeconfigSecretRef{Name: secret.Name}
	require.NoError(t, env.Client.Status().Update(ctx, hc))

	r := &Reconciler{Client: env.Client, APIReader: env.Client}
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{binder.NodePoolNamespaceLabel: "clusters"}},
		Spec: v1beta1.AgentSpec{ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "clusters-vcluster2", Name: "vcluster2"}}}
	first, err := r.hosted(ctx, a)
	require.NoError(t, err)
	again, err := r.hosted(ctx, a)
	require.NoError(t, err)
	require.Same(t, first, again, "an unchanged kubeconfig reuses its client")

	for i := range 3 {
		secret.Data["kubeconfig"] = append(append([]byte{}, kc...), []byte("\n# rotated "+string(rune('a'+i))+"\n")...)
		require.NoError(t, env.Client.Update(ctx, secret))
		rotated, err := r.hosted(ctx, a)
		require.NoError(t, err)
		require.NotSame(t, first, rotated, "a rotated kubeconfig gets a new client")
		first = rotated
		_, err = rotated.Discovery().ServerVersion()
		require.NoError(t, err, "the new client works")
	}
	require.Len(t, r.clients.m, 1, "rotations replace the cluster's client")
}
