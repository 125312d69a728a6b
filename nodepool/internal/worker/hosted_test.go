package worker

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hivev1 "github.com/agentboot/agentboot/api/hive/v1"
	"github.com/agentboot/agentboot/internal/testenv"
)

// One client per hosted cluster: reused while its kubeconfig is unchanged,
// replaced (not added to) when it rotates.
func TestHostedClientPerCluster(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clusters-vcluster2"}}))
	kc, err := os.ReadFile(env.Kubeconfig)
	require.NoError(t, err)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters-vcluster2", Name: "admin-kubeconfig"}, Data: map[string][]byte{"kubeconfig": kc}}
	require.NoError(t, env.Client.Create(ctx, secret))
	cd := &hivev1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters-vcluster2", Name: "vcluster2"},
		Spec: hivev1.ClusterDeploymentSpec{Installed: true, ClusterMetadata: &hivev1.ClusterMetadata{AdminKubeconfigSecretRef: hivev1.LocalObjectReference{Name: secret.Name}}}}

	r := &Reconciler{Client: env.Client, APIReader: env.Client}
	first, err := r.clientFor(ctx, cd)
	require.NoError(t, err)
	again, err := r.clientFor(ctx, cd)
	require.NoError(t, err)
	require.Same(t, first, again, "an unchanged kubeconfig reuses its client")

	for i := range 3 {
		secret.Data["kubeconfig"] = append(append([]byte{}, kc...), []byte("\n# rotated "+string(rune('a'+i))+"\n")...)
		require.NoError(t, env.Client.Update(ctx, secret))
		rotated, err := r.clientFor(ctx, cd)
		require.NoError(t, err)
		require.NotSame(t, first, rotated, "a rotated kubeconfig gets a new client")
		first = rotated
		_, err = rotated.Discovery().ServerVersion()
		require.NoError(t, err, "the new client works")
	}
	require.Len(t, r.clients.m, 1, "rotations replace the cluster's client")

	// Missing or broken kubeconfigs are said, not guessed.
	cd.Spec.ClusterMetadata.AdminKubeconfigSecretRef.Name = "nope"
	_, err = r.clientFor(ctx, cd)
	require.ErrorContains(t, err, "kubeconfig Secret clusters-vcluster2/nope of ClusterDeployment clusters-vcluster2/vcluster2 does not exist")
	cd.Spec.ClusterMetadata = nil
	_, err = r.clientFor(ctx, cd)
	require.ErrorContains(t, err, "has no spec.clusterMetadata.adminKubeconfigSecretRef yet")
}
