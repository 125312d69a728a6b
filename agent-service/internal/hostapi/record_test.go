package hostapi

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/test/testenv"
)

// A registration record goes onto the Agent it was decided for and no
// other: through another writer's change to the same Agent, not onto an
// Agent of the same name created anew meanwhile (another host's
// registration), nor onto one that changed hands as it was read again.
func TestWriteRecordOnlyToItsAgent(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agents"}}))
	newAgent := func() *v1beta1.Agent {
		a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000001"},
			Spec: v1beta1.AgentSpec{Role: v1beta1.AgentRoleAutoAssign}}
		require.NoError(t, env.Client.Create(ctx, a))
		return a
	}
	sess := lifecycle.Session{InfraEnv: "ie", InfraEnvUID: "uid-1", Identity: "digest-1", ID: "s1", AgentVersion: "v0.1.0"}

	// Changed by another writer after it was read (the Agent controller's
	// finalizer): written all the same, onto the Agent as it is now.
	a := newAgent()
	changed := a.DeepCopy()
	controllerutil.AddFinalizer(changed, "agentboot.io/lease")
	require.NoError(t, env.Client.Update(ctx, changed))
	got, err := writeRecord(ctx, env.Client, env.Client, a, sess, nil)
	require.NoError(t, err)
	require.Equal(t, "digest-1", lifecycle.Registration(got).Identity)
	var stored v1beta1.Agent
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), &stored))
	require.Equal(t, "v0.1.0", lifecycle.Registration(&stored).AgentVersion)
	require.Contains(t, stored.Finalizers, "agentboot.io/lease", "the other writer's change stays")

	// Deleted and created anew: the new Agent is not given the record.
	controllerutil.RemoveFinalizer(&stored, "agentboot.io/lease")
	require.NoError(t, env.Client.Update(ctx, &stored))
	require.NoError(t, env.Client.Delete(ctx, &stored))
	again := newAgent()
	_, err = writeRecord(ctx, env.Client, env.Client, a, sess, nil)
	require.ErrorIs(t, err, errDeleting)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(again), &stored))
	require.Nil(t, stored.Status.Registration, "the record of another Agent")

	// Changed meanwhile so that the session may no longer begin: recheck
	// says no, nothing is written.
	changed = again.DeepCopy()
	changed.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: "cp", Name: "c"}
	require.NoError(t, env.Client.Update(ctx, changed))
	_, err = writeRecord(ctx, env.Client, env.Client, again, sess, func(fresh *v1beta1.Agent) error {
		if lifecycle.Bound(fresh) {
			return errInDoubt
		}
		return nil
	})
	require.ErrorIs(t, err, errInDoubt)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(again), &stored))
	require.Nil(t, stored.Status.Registration)
}
