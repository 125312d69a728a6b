package agentstatus

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/test/testenv"
)

// A host's Lease is created right after its Agent, and under load its
// watch event reaches the controller before the Agent reaches the cache.
// The Lease survives that; it goes only with the Agent.
func TestLeaseOutlivesALaggingCache(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	for _, ns := range []string{"agents", "agentboot-system"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000001"}}
	require.NoError(t, env.Client.Create(ctx, a))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "agentboot-system", Name: hosts.LeaseName(a.Namespace, a.Name)}}
	require.NoError(t, env.Client.Create(ctx, lease))

	// The cache has not seen the Agent yet.
	lagging, err := env.LateCache(&v1beta1.Agent{})
	require.NoError(t, err)
	r := &Reconciler{Client: lagging, APIReader: env.Client, Events: &events.FakeRecorder{}, LeaseNamespace: "agentboot-system",
		DisconnectAfter: 3 * time.Minute, Now: time.Now}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)}
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(lease), lease), "the Lease of an Agent the cache has not seen yet was deleted")

	// Gone for real: the Lease goes too.
	require.NoError(t, env.Client.Delete(ctx, a))
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.True(t, apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(lease), lease)), "the Lease of a deleted Agent is kept")
}

// An InfraEnv deleted and created anew under the name the Agent's record
// names is not the one its host registered through: the Agent is
// reconciled with the defaults (it used to panic here).
func TestRecreatedInfraEnv(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	for _, ns := range []string{"agents", "agentboot-system"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	ie := &v1beta1.InfraEnv{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "env"},
		Spec: v1beta1.InfraEnvSpec{PullSecretRef: &corev1.LocalObjectReference{Name: "pull-secret"}}}
	require.NoError(t, env.Client.Create(ctx, ie))
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000002"}}
	require.NoError(t, env.Client.Create(ctx, a))
	a.Status.Registration = &v1beta1.AgentRegistration{InfraEnv: "env", InfraEnvUID: "the-uid-of-the-deleted-one"}
	require.NoError(t, env.Client.Status().Update(ctx, a))
	r := &Reconciler{Client: env.Client, APIReader: env.Client, Events: &events.FakeRecorder{}, LeaseNamespace: "agentboot-system",
		DisconnectAfter: 3 * time.Minute, Now: time.Now, Requirements: DefaultRequirements}
	_, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)})
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), a))
	require.NotEmpty(t, a.Status.Conditions, "reconciled")
}
