package conditions

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

func TestSetKeepsTimesUnlessChanged(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	t1 := metav1.NewTime(time.Unix(2000, 0))
	t2 := metav1.NewTime(time.Unix(3000, 0))
	conds := Set(nil, New("Ready", false, "Waiting", "a"), t0)
	conds = Set(conds, New("Ready", false, "Waiting", "a"), t1)
	require.Equal(t, t0, conds[0].LastHeartbeatTime, "unchanged: no write")
	conds = Set(conds, New("Ready", false, "Waiting", "b"), t1)
	require.Equal(t, t0, conds[0].LastTransitionTime)
	require.Equal(t, t1, conds[0].LastHeartbeatTime)
	conds = Set(conds, New("Ready", true, "Done", ""), t2)
	require.Equal(t, t2, conds[0].LastTransitionTime)
	require.Equal(t, corev1.ConditionTrue, conds[0].Status)
	require.True(t, IsTrue(conds, "Ready"))
	require.False(t, IsTrue(conds, v1beta1.ConditionType("Other")))
	require.Len(t, conds, 1)
}
