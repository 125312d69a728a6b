package steps

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent/service/internal/hostapi"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
)

// A bound host that cannot install yet for a reason that costs nothing to
// check (its validations) is told so without its config being fetched,
// which reads Secrets from the apiserver; Agents bound by someone else
// are left alone.
func TestNextChecksCheapReasonsFirst(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agents"}}))
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000001"},
		Spec: v1beta1.AgentSpec{Approved: true, Role: v1beta1.AgentRoleWorker, ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "clusters-vcluster2", Name: "vcluster2"}}}
	require.NoError(t, env.Client.Create(ctx, a))

	fetched := 0
	ours := true
	s := &Steps{Client: env.Client, APIReader: env.Client, Events: &events.FakeRecorder{}, Log: logr.Discard(), Now: time.Now,
		Ignition: func(*v1beta1.Agent) (func(context.Context) (string, error), bool) {
			return func(context.Context) (string, error) { fetched++; return "", errors.New("no user-data") }, ours
		}}
	ref := &hostapi.AgentRef{Agent: a, InfraEnv: &v1beta1.InfraEnv{}}
	steps, err := s.Next(ctx, ref)
	require.NoError(t, err)
	require.Empty(t, steps)
	require.Zero(t, fetched, "the config was fetched although the host is not validated")
	got := &v1beta1.Agent{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), got))
	require.Equal(t, "waiting for the host's validations to pass", got.Status.Progress.ProgressInfo)

	// Not ours: not a word written on it.
	ours = false
	other := got.DeepCopy()
	other.Status.Progress.ProgressInfo = ""
	steps, err = s.Next(ctx, &hostapi.AgentRef{Agent: other, InfraEnv: ref.InfraEnv})
	require.NoError(t, err)
	require.Empty(t, steps)
	require.Zero(t, fetched)
	after := &v1beta1.Agent{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), after))
	require.Equal(t, got.ResourceVersion, after.ResourceVersion, "an Agent bound by someone else was written")
}
