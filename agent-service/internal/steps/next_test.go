package steps

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/hostapi"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/testenv"
)

// A bound host installs what the manager handed over for it, and only
// that: without a handover it is someone else's (not a word written on
// it); its own reasons come first; the manager's waiting reason is shown
// as it is; a handover made for the Agent as it was, or sealed under
// another key, gives nothing.
func TestNextInstallsWhatTheManagerHandedOver(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := context.Background()
	for _, ns := range []string{"agents", "agentboot-system"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-000000000001"},
		Spec: v1beta1.AgentSpec{Approved: true, Role: v1beta1.AgentRoleWorker, Hostname: "worker-1",
			ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "clusters-vcluster2", Name: "vcluster2"}}}
	require.NoError(t, env.Client.Create(ctx, a))
	key, err := signing.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	rec := events.NewFakeRecorder(10)
	bound, bindErr := "binding-1", error(nil)
	ie := &v1beta1.InfraEnv{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "env", UID: "ie-1"}}
	s := &Steps{Client: env.Client, APIReader: env.Client, Keys: signing.Restricted{Source: fixedKey{key}, Purposes: signing.AgentAPIPurposes},
		Namespace: "agentboot-system", Events: rec, Log: logr.Discard(), Now: time.Now,
		// The binding as the nodepool tests resolve it for real.
		Binding: func(context.Context, *v1beta1.Agent) (string, error) { return bound, bindErr }}
	next := func(t *testing.T) ([]agentwire.Step, *v1beta1.Agent) {
		t.Helper()
		cur := &v1beta1.Agent{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), cur))
		steps, err := s.Next(ctx, &hostapi.AgentRef{Agent: cur, InfraEnv: ie})
		require.NoError(t, err)
		after := &v1beta1.Agent{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(a), after))
		return steps, after
	}
	put := func(t *testing.T, cm *corev1.ConfigMap) {
		t.Helper()
		var have corev1.ConfigMap
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cm), &have); err == nil {
			have.Data = cm.Data
			require.NoError(t, env.Client.Update(ctx, &have))
			return
		}
		require.NoError(t, env.Client.Create(ctx, cm))
	}

	// No handover: not agentboot's to install.
	steps, got := next(t)
	require.Empty(t, steps)
	require.Empty(t, got.Status.Progress.ProgressInfo, "an Agent with no handover was written")

	// The host's own reasons first.
	put(t, handover.Waiting("agentboot-system", got, ie, "AgentMachine clusters-vcluster2/m1 does not reference this Agent", "BindingRefused"))
	steps, got = next(t)
	require.Empty(t, steps)
	require.Equal(t, "waiting for the host's validations to pass", got.Status.Progress.ProgressInfo)

	now := metav1.Now()
	got.Status.Conditions = []v1beta1.Condition{{Type: v1beta1.ValidatedCondition, Status: corev1.ConditionTrue, Reason: "ValidationsPassing", LastTransitionTime: now}}
	got.Status.Inventory = v1beta1.HostInventory{ReportTime: &now, Disks: []v1beta1.HostDisk{
		{ID: "/dev/disk/by-path/pci-0000:00:04.0", Path: "/dev/vda", Name: "vda", DriveType: "SSD", SizeBytes: 120e9, InstallationEligibility: v1beta1.HostInstallationEligibility{Eligible: true, NotEligibleReasons: []string{}}},
	}}
	require.NoError(t, env.Client.Status().Update(ctx, got))
	steps, got = next(t)
	require.Empty(t, steps)
	require.Equal(t, "AgentMachine clusters-vcluster2/m1 does not reference this Agent", got.Status.Progress.ProgressInfo)
	requireEvent(t, rec, "BindingRefused")

	inst := handover.Install{Ignition: `{"ignition":{"version":"3.2.0"}}`, ImageURL: "https://images.example/disk.raw", ImageSHA256: strings.Repeat("ab", 32), OnRelease: "metadata"}
	// Made for the Agent as it was (another machine config pool): stale.
	was := got.DeepCopy()
	was.Spec.MachineConfigPool = "infra"
	cm, err := handover.Sealed(key, "agentboot-system", was, ie, bound, inst, time.Now())
	require.NoError(t, err)
	put(t, cm)
	steps, got = next(t)
	require.Empty(t, steps)
	require.Equal(t, handover.ErrStale.Error(), got.Status.Progress.ProgressInfo)

	// Sealed under another key (or altered): nothing, with the reason.
	other, _ := signing.NewKey([]byte("fedcba9876543210fedcba9876543210"))
	cm, err = handover.Sealed(other, "agentboot-system", got, ie, bound, inst, time.Now())
	require.NoError(t, err)
	put(t, cm)
	steps, got = next(t)
	require.Empty(t, steps)
	require.Contains(t, got.Status.Progress.ProgressInfo, "does not open")
	requireEvent(t, rec, "HandoverBroken")

	// Sealed for this Agent, but the binding changed since: nothing; it no
	// longer holds: refused at once, with why.
	cm, err = handover.Sealed(key, "agentboot-system", got, ie, "binding-0", inst, time.Now())
	require.NoError(t, err)
	put(t, cm)
	steps, got = next(t)
	require.Empty(t, steps)
	require.Equal(t, handover.ErrStale.Error(), got.Status.Progress.ProgressInfo)
	bindErr = &binding.Refused{Msg: "AgentMachine clusters-vcluster2/m1 is gone"}
	steps, got = next(t)
	require.Empty(t, steps)
	require.Equal(t, "AgentMachine clusters-vcluster2/m1 is gone", got.Status.Progress.ProgressInfo)
	requireEvent(t, rec, "BindingRefused")
	bindErr = nil

	// Sealed for this Agent as it is bound: the step, with what was sealed.
	cm, err = handover.Sealed(key, "agentboot-system", got, ie, bound, inst, time.Now())
	require.NoError(t, err)
	put(t, cm)
	steps, got = next(t)
	require.Len(t, steps, 1)
	require.Equal(t, agentwire.InstallStep{DiskPath: "/dev/vda", ImageURL: inst.ImageURL, ImageSHA256: inst.ImageSHA256, Ignition: inst.Ignition}, *steps[0].Install)
	require.Equal(t, "worker-1", got.Status.Registration.NodeName)
	require.Equal(t, "metadata", got.Status.DiskSanitization.OnRelease, "the erase owed later is the manager's policy")
	require.Equal(t, "/dev/disk/by-path/pci-0000:00:04.0", got.Status.InstallationDiskID)
}

// requireEvent finds an event with reason among those recorded so far.
func requireEvent(t *testing.T, rec *events.FakeRecorder, reason string) {
	t.Helper()
	for {
		select {
		case e := <-rec.Events:
			if strings.Contains(e, " "+reason+" ") {
				return
			}
		default:
			t.Fatalf("no %s event", reason)
		}
	}
}

type fixedKey struct{ k signing.Key }

func (f fixedKey) Key() (signing.Key, error) { return f.k, nil }
