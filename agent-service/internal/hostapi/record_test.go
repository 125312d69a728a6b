package hostapi

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
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

// A registration whose process stopped between creating the Agent and
// recording the host leaves an Agent nobody holds a session of: past the
// grace for a record on its way, the next host registering as it adopts
// it, as its first registration would have. An Agent bound, or not made
// for this InfraEnv, is not an orphan.
func TestOrphanAdopted(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agents"}}))
	ie := &v1beta1.InfraEnv{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "pool", UID: "ie-uid"}}
	rec := events.NewFakeRecorder(10)
	later := time.Now().Add(recordGrace + time.Minute)
	s := New(Options{Client: env.Client, APIReader: env.Client, Events: rec, LeaseNamespace: "agents", Log: logr.Discard(),
		Now: func() time.Time { return later }})
	orphan := func(name string, change func(*v1beta1.Agent)) *v1beta1.Agent {
		a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: name,
			Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}, OwnerReferences: []metav1.OwnerReference{infraEnvOwner(ie)}},
			Spec: v1beta1.AgentSpec{Role: v1beta1.AgentRoleAutoAssign}}
		if change != nil {
			change(a)
		}
		require.NoError(t, env.Client.Create(ctx, a))
		return a
	}
	req := agentwire.RegisterRequest{HostID: "00000000-0000-4000-8000-000000000001"}

	a := orphan(req.HostID, nil)
	got, secret, kind, err := s.resume(ctx, a, ie, req, "digest-1", "198.18.0.10:4000", "")
	require.NoError(t, err)
	require.Equal(t, kindCreated, kind)
	require.NotEmpty(t, secret)
	require.Equal(t, "digest-1", lifecycle.Registration(got).Identity)
	require.Contains(t, <-rec.Events, "Adopted")
	// Adopted once: the host's next registration is as any other.
	var stored v1beta1.Agent
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), &stored))
	_, _, _, err = s.resume(ctx, &stored, ie, req, "digest-2", "198.18.0.11:4000", "")
	require.ErrorIs(t, err, errConflict, "another identity, once adopted")

	// A moment old: its record may be on its way.
	fresh := orphan("00000000-0000-4000-8000-000000000002", nil)
	s.o.Now = time.Now
	_, _, _, err = s.resume(ctx, fresh, ie, req, "digest-1", "198.18.0.10:4000", "")
	require.ErrorIs(t, err, errRecordPending)
	s.o.Now = func() time.Time { return later }

	// Bound, or another InfraEnv's: nobody's to continue, as before.
	bound := orphan("00000000-0000-4000-8000-000000000003", func(a *v1beta1.Agent) {
		a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: "cp", Name: "c"}
	})
	_, _, _, err = s.resume(ctx, bound, ie, req, "digest-1", "198.18.0.10:4000", "")
	require.ErrorIs(t, err, errConflict)
	other := orphan("00000000-0000-4000-8000-000000000004", func(a *v1beta1.Agent) {
		a.OwnerReferences[0].UID = "another-uid"
	})
	_, _, _, err = s.resume(ctx, other, ie, req, "digest-1", "198.18.0.10:4000", "")
	require.ErrorIs(t, err, errConflict)
}
