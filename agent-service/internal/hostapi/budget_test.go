package hostapi

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One InfraEnv spends only its own budget; all of them together, only the
// process's; a refused write takes nothing, and says how long to wait.
func TestBudget(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	b := newBudget(32<<10, 64<<10) // bursts: 1.875 MiB per InfraEnv, 3.75 MiB in all
	perIE, all := 32<<10*budgetBurst, 64<<10*budgetBurst
	require.Zero(t, b.spend("a", perIE, now), "a minute's worth at once")
	wait := b.spend("a", 64<<10, now)
	require.Equal(t, 2*time.Second, wait, "64 KiB more is two seconds of 32 KiB/s away")
	require.Zero(t, b.spend("b", perIE, now), "another InfraEnv has its own")
	require.Positive(t, b.spend("c", 1024, now), "the process's budget is spent (%d of %d)", 2*perIE, all)
	require.Zero(t, b.spend("a", 64<<10, now.Add(2*time.Second)), "the refused write took nothing: 2 s refill it")
	require.Equal(t, budgetBurst*time.Second, b.spend("d", all+1, now.Add(time.Hour)), "more than a burst never fits")

	require.Positive(t, b.exhausted("a", now.Add(2*time.Second)), "spent again, and said so without spending")
	require.Zero(t, b.exhausted("e", now.Add(time.Hour)), "refilled")

	none := newBudget(0, 0)
	require.Zero(t, none.exhausted("a", now))
	require.Zero(t, none.spend("a", 1<<30, now), "0: no limit")
	var off *budget
	require.Zero(t, off.spend("a", 1, now))
}

// Idle InfraEnvs' buckets are dropped only once they would be full again:
// dropping one earlier would hand its InfraEnv budget it has not earned.
func TestBudgetForgetsOnlyFullBuckets(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	b := newBudget(16<<10, 0) // 16 KiB/s, the least burst: 1 MiB, refilled in 64 s
	for i := range 1100 {
		require.Zero(t, b.spend(fmt.Sprintf("ie-%d", i), 1<<20, now))
	}
	b.spend("late", 1, now.Add(30*time.Second))
	require.Greater(t, len(b.infraEnvs), 1024, "half refilled: kept")
	require.Positive(t, b.spend("ie-7", 1<<20, now.Add(31*time.Second)), "and still short of a whole burst")
	b.spend("later", 1, now.Add(65*time.Second))
	require.Less(t, len(b.infraEnvs), 10, "refilled: dropped")
}
