package handover

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/signing"
)

// A handover opens for the Agent it was made for, as it was then, under
// the key it was sealed with; copied to another Agent (even with its
// inputs rewritten to match), made for an earlier state, or sealed under
// another key, it gives nothing.
func TestOpenOnlyForItsAgent(t *testing.T) {
	key, err := signing.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	api := key.Only(signing.AgentAPIPurposes...)
	agent := func(uid string) *v1beta1.Agent {
		return &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "00000000-0000-4000-8000-00000000000" + uid[len(uid)-1:], UID: types.UID("uid-" + uid)},
			Spec: v1beta1.AgentSpec{Hostname: "worker", ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "cp", Name: "c"}}}
	}
	a, b := agent("1"), agent("2")
	inst := Install{Ignition: `{"ignition":{"version":"3.2.0"}}`, ImageURL: "https://images/disk.raw", ImageSHA256: "00", OnRelease: "erase"}
	cm, err := Sealed(key, "agentboot-system", a, inst)
	require.NoError(t, err)
	require.Equal(t, "install-uid-1", cm.Name)
	got, err := Open(api, cm, a)
	require.NoError(t, err)
	require.Equal(t, inst, got)

	again, err := Sealed(key, "agentboot-system", a, inst)
	require.NoError(t, err)
	require.True(t, Same(cm, again), "the same content is not rewritten, though sealed anew")
	inst2 := inst
	inst2.Ignition = `{"ignition":{"version":"3.2.0","timeouts":{}}}`
	changed, err := Sealed(key, "agentboot-system", a, inst2)
	require.NoError(t, err)
	require.False(t, Same(cm, changed), "a new token (or anything) is rewritten")

	// Copied to b: stale by name and inputs; with both rewritten, the seal
	// still names a.
	moved := cm.DeepCopy()
	moved.Name = Name(b)
	_, err = Open(api, moved, b)
	require.ErrorIs(t, err, ErrStale)
	moved.Data[keyInputs] = Inputs(b)
	_, err = Open(api, moved, b)
	require.ErrorIs(t, err, signing.ErrSealBroken)

	// a changed since (another pool): stale.
	later := a.DeepCopy()
	later.Spec.MachineConfigPool = "infra"
	_, err = Open(api, cm, later)
	require.ErrorIs(t, err, ErrStale)

	other, _ := signing.NewKey([]byte("fedcba9876543210fedcba9876543210"))
	_, err = Open(other, cm, a)
	require.ErrorIs(t, err, signing.ErrSealBroken)
	rekeyed, err := Sealed(other, "agentboot-system", a, inst)
	require.NoError(t, err)
	require.False(t, Same(cm, rekeyed), "a new key is a rewrite")

	// Waiting: shown as the manager wrote it.
	w := Waiting("agentboot-system", a, "token Secret cp/t does not exist", "BindingRefused")
	_, err = Open(api, w, a)
	var wait *Wait
	require.ErrorAs(t, err, &wait)
	require.Equal(t, "token Secret cp/t does not exist", wait.Msg)
	require.Equal(t, "BindingRefused", wait.EventReason())
	require.False(t, Same(cm, w))
}
