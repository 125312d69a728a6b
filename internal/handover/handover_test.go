package handover

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/signing"
)

func agent(uid string) *v1beta1.Agent {
	return &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-00000000000" + uid[len(uid)-1:], UID: types.UID("uid-" + uid),
			Labels: map[string]string{"agentMachineRef": "m1"}, Annotations: map[string]string{"agentMachineRefNamespace": "cp"}},
		Spec: v1beta1.AgentSpec{Hostname: "worker", ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "cp", Name: "c"},
			IgnitionEndpointTokenReference: &v1beta1.IgnitionEndpointTokenReference{Namespace: "cp", Name: "t"}},
	}
}

// bound is the binding as the agent API resolves it now.
func bound(digest string) func() (string, error) {
	return func() (string, error) { return digest, nil }
}

var infraEnv = &v1beta1.InfraEnv{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "pool", UID: "ie-1"},
	Spec: v1beta1.InfraEnvSpec{CPUArchitecture: "x86_64", OSImageVersion: "4.19"}}

// A handover opens for the Agent it was made for, as it was then, under
// the key it was sealed with, until it expires; copied to another Agent
// (even with its inputs rewritten to match), made for an earlier state,
// sealed under another key, or relabelled, it gives nothing.
func TestOpenOnlyForItsAgent(t *testing.T) {
	key, err := signing.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	api := key.Only(signing.AgentAPIPurposes...)
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	a, b := agent("1"), agent("2")
	inst := Install{Ignition: `{"ignition":{"version":"3.2.0"}}`, ImageURL: "https://images/disk.raw", ImageSHA256: "00", OnRelease: "erase"}
	cm, err := Sealed(key, "agentboot-system", a, infraEnv, "b1", inst, now)
	require.NoError(t, err)
	require.Equal(t, "install-uid-1", cm.Name)
	got, err := Open(api, cm, a, infraEnv, bound("b1"), now)
	require.NoError(t, err)
	require.Equal(t, inst, got)

	// Expiry: it opens for Lifetime, and is sealed again from half of it.
	_, err = Open(api, cm, a, infraEnv, bound("b1"), now.Add(Lifetime))
	require.ErrorIs(t, err, ErrStale, "expired")
	again, err := Sealed(key, "agentboot-system", a, infraEnv, "b1", inst, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, Same(cm, again, now.Add(time.Minute)), "the same content is not rewritten, though sealed anew")
	require.False(t, Same(cm, again, now.Add(Lifetime/2+time.Second)), "rewritten before it expires")
	expired := cm.DeepCopy()
	expired.Data[keyExpires] = now.Add(time.Hour).UTC().Format(time.RFC3339)
	_, err = Open(api, expired, a, infraEnv, bound("b1"), now)
	require.ErrorIs(t, err, signing.ErrSealBroken, "an expiry pushed out by hand does not open")

	inst2 := inst
	inst2.Ignition = `{"ignition":{"version":"3.2.0","timeouts":{}}}`
	changed, err := Sealed(key, "agentboot-system", a, infraEnv, "b1", inst2, now)
	require.NoError(t, err)
	require.False(t, Same(cm, changed, now), "a new token (or anything) is rewritten")

	// Copied to b: stale by name and inputs; with both rewritten, the seal
	// still names a.
	moved := cm.DeepCopy()
	moved.Name = Name(b)
	_, err = Open(api, moved, b, infraEnv, bound("b1"), now)
	require.ErrorIs(t, err, ErrStale)
	moved.Data[keyInputs] = Inputs(b, infraEnv)
	_, err = Open(api, moved, b, infraEnv, bound("b1"), now)
	require.ErrorIs(t, err, signing.ErrSealBroken)

	unlabelled := cm.DeepCopy()
	delete(unlabelled.Labels, Label)
	_, err = Open(api, unlabelled, a, infraEnv, bound("b1"), now)
	require.ErrorIs(t, err, ErrStale, "not a handover any more")

	other, _ := signing.NewKey([]byte("fedcba9876543210fedcba9876543210"))
	_, err = Open(other, cm, a, infraEnv, bound("b1"), now)
	require.ErrorIs(t, err, signing.ErrSealBroken)
	rekeyed, err := Sealed(other, "agentboot-system", a, infraEnv, "b1", inst, now)
	require.NoError(t, err)
	require.False(t, Same(cm, rekeyed, now), "a new key is a rewrite")

	// The binding changed since it was made: stale; it no longer holds:
	// the binding's own error.
	_, err = Open(api, cm, a, infraEnv, bound("b2"), now)
	require.ErrorIs(t, err, ErrStale)
	revoked := errors.New("AgentMachine gone")
	_, err = Open(api, cm, a, infraEnv, func() (string, error) { return "", revoked }, now)
	require.ErrorIs(t, err, revoked)
	rebound := cm.DeepCopy()
	rebound.Data[keyBinding] = "b2"
	_, err = Open(api, rebound, a, infraEnv, bound("b2"), now)
	require.ErrorIs(t, err, signing.ErrSealBroken, "the binding is sealed in")

	// Waiting: shown as the manager wrote it.
	w := Waiting("agentboot-system", a, infraEnv, "token Secret cp/t does not exist", "BindingRefused")
	_, err = Open(api, w, a, infraEnv, bound("b1"), now)
	var wait *Wait
	require.ErrorAs(t, err, &wait)
	require.Equal(t, "token Secret cp/t does not exist", wait.Msg)
	require.Equal(t, "BindingRefused", wait.EventReason())
	require.False(t, Same(cm, w, now))
}

// Every field of the Agent and its InfraEnv the installation is made from
// is in its inputs: a handover made before any of them changed is stale.
func TestInputsCoverWhatTheInstallationIsMadeOf(t *testing.T) {
	base := Inputs(agent("1"), infraEnv)
	for name, change := range map[string]func(a *v1beta1.Agent, ie *v1beta1.InfraEnv){
		"namespace":                func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Namespace = "other" },
		"name":                     func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Name = "other" },
		"uid":                      func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.UID = "other" },
		"cluster deployment":       func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Spec.ClusterDeploymentName.Name = "other" },
		"agentMachineRef":          func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Labels["agentMachineRef"] = "m2" },
		"agentMachineRefNamespace": func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Annotations["agentMachineRefNamespace"] = "cp2" },
		"token reference":          func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Spec.IgnitionEndpointTokenReference.Name = "t2" },
		"headers": func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) {
			a.Spec.IgnitionEndpointHTTPHeaders = map[string]string{"X": "y"}
		},
		"overrides":                 func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Spec.IgnitionConfigOverrides = `{}` },
		"machine config pool":       func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Spec.MachineConfigPool = "infra" },
		"hostname":                  func(a *v1beta1.Agent, _ *v1beta1.InfraEnv) { a.Spec.Hostname = "other" },
		"InfraEnv (recreated)":      func(_ *v1beta1.Agent, ie *v1beta1.InfraEnv) { ie.UID = "ie-2" },
		"InfraEnv architecture":     func(_ *v1beta1.Agent, ie *v1beta1.InfraEnv) { ie.Spec.CPUArchitecture = "aarch64" },
		"InfraEnv OS image version": func(_ *v1beta1.Agent, ie *v1beta1.InfraEnv) { ie.Spec.OSImageVersion = "4.20" },
	} {
		a, ie := agent("1"), infraEnv.DeepCopy()
		change(a, ie)
		require.NotEqual(t, base, Inputs(a, ie), name)
	}
	// What the installation is not made of changes nothing.
	a := agent("1")
	a.Spec.Approved = true
	a.Status.Progress.ProgressInfo = "waiting"
	require.Equal(t, base, Inputs(a, infraEnv))
}
