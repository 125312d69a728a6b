package diskboot

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentrecord"
)

// A record exists only for an Agent that boots from its disk, names the
// InfraEnv from its registration record (not its tenant-writable label),
// and is found by its MACs in its own namespace only.
func TestRecords(t *testing.T) {
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "00000000-0000-4000-8000-000000000001", UID: "u1",
		Labels: map[string]string{v1beta1.InfraEnvNameLabel: "forged"}},
		Spec: v1beta1.AgentSpec{ClusterDeploymentName: &v1beta1.ClusterReference{Namespace: "cp", Name: "c"}}}
	a.Status.Registration = &v1beta1.AgentRegistration{InfraEnv: "pool", InfraEnvUID: "ie-1"}
	a.Status.Inventory.Interfaces = []v1beta1.HostInterface{{Name: "eth1", MacAddress: "52:54:00:00:00:02"}, {Name: "eth0", MacAddress: "52:54:00:00:00:01"}}
	a.Status.Progress.CurrentStage = v1beta1.StageInstalling
	require.Nil(t, For("agentboot-system", a), "still installing: discovery")

	a.Status.Progress.CurrentStage = v1beta1.StageRebooting
	cm := For("agentboot-system", a)
	require.NotNil(t, cm)
	require.Equal(t, "disk-boot-u1", cm.Name)
	require.Equal(t, "agentboot-system", cm.Namespace)
	require.Equal(t, map[string]string{"agent": "team-a/" + a.Name, "infraEnv": "pool", "macs": "52:54:00:00:00:01,52:54:00:00:00:02"}, cm.Data)
	require.ElementsMatch(t, []string{"team-a/52:54:00:00:00:01", "team-a/pool/52:54:00:00:00:01", "team-a/52:54:00:00:00:02", "team-a/pool/52:54:00:00:00:02"}, macKeys(cm))
	require.Equal(t, []string{"team-a/" + a.Name}, agentrecord.IndexBy(Label)(cm))

	// Released, or no MAC reported, or being deleted: no record.
	released := a.DeepCopy()
	released.Spec.ClusterDeploymentName = nil
	require.Nil(t, For("agentboot-system", released))
	noMAC := a.DeepCopy()
	noMAC.Status.Inventory.Interfaces = nil
	require.Nil(t, For("agentboot-system", noMAC))
	deleting := a.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	require.Nil(t, For("agentboot-system", deleting))

	// Someone else's ConfigMap is no record.
	other := cm.DeepCopy()
	delete(other.Labels, Label)
	require.Empty(t, macKeys(other))
	require.Empty(t, agentrecord.IndexBy(Label)(other))
}
