package lifecycle

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// The installation's stages go only forward; Failed follows any stage;
// nothing follows Done or Failed; the percentage never goes back.
func TestAdvance(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		from     v1beta1.HostStage
		fromPct  int64
		to       v1beta1.HostStage
		pct      int64
		wantErr  bool
		wantPct  int64
		keepsDay bool // the stage's start stays
	}{
		"not started":             {to: v1beta1.StageInstalling, wantErr: true},
		"forward":                 {from: v1beta1.StageStartingInstallation, to: v1beta1.StageWritingImageToDisk, pct: 30, wantPct: 30},
		"same stage, more":        {from: v1beta1.StageWritingImageToDisk, fromPct: 30, to: v1beta1.StageWritingImageToDisk, pct: 60, wantPct: 60, keepsDay: true},
		"percentage never back":   {from: v1beta1.StageWritingImageToDisk, fromPct: 60, to: v1beta1.StageRebooting, pct: 10, wantPct: 60},
		"backwards":               {from: v1beta1.StageRebooting, fromPct: 100, to: v1beta1.StageInstalling, wantErr: true},
		"failed from any stage":   {from: v1beta1.StageJoined, fromPct: 100, to: v1beta1.StageFailed, wantPct: 100},
		"nothing after done":      {from: v1beta1.StageDone, fromPct: 100, to: v1beta1.StageFailed, wantErr: true},
		"nothing after failed":    {from: v1beta1.StageFailed, fromPct: 40, to: v1beta1.StageInstalling, wantErr: true},
		"not a stage":             {from: v1beta1.StageInstalling, to: "Dancing", wantErr: true},
		"percentage out of range": {from: v1beta1.StageInstalling, to: v1beta1.StageInstalling, pct: 101, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			day := metav1.NewTime(now.Add(-time.Hour))
			a := &v1beta1.Agent{}
			a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: tc.from, InstallationPercentage: tc.fromPct, StageStartTime: &day}
			err := Advance(a, tc.to, tc.pct, "detail", now)
			if tc.wantErr {
				require.Error(t, err)
				require.Equal(t, tc.from, a.Status.Progress.CurrentStage, "unchanged")
				return
			}
			require.NoError(t, err)
			p := a.Status.Progress
			require.Equal(t, tc.to, p.CurrentStage)
			require.Equal(t, tc.wantPct, p.InstallationPercentage)
			require.Equal(t, "detail", p.ProgressInfo)
			require.Equal(t, tc.keepsDay, p.StageStartTime.Equal(&day), "stage start")
		})
	}
}

// Starting an installation records what the host owes when it leaves and
// the Node it joins as; a failed one keeps its percentage.
func TestStartAndFailInstallation(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	a := &v1beta1.Agent{Spec: v1beta1.AgentSpec{Hostname: "worker-7"}}
	StartInstallation(a, Installation{Disk: v1beta1.HostDisk{Path: "/dev/sda", ID: "/dev/disk/by-id/wwn-0x5"}, ImageURL: "https://images/rhcos", OnRelease: "erase"}, now)
	require.Equal(t, v1beta1.StageStartingInstallation, a.Status.Progress.CurrentStage)
	require.Equal(t, WorkerStages, a.Status.Progress.ProgressStages)
	require.Equal(t, "/dev/disk/by-id/wwn-0x5", a.Status.InstallationDiskID)
	require.Equal(t, "erase", a.Status.DiskSanitization.OnRelease)
	require.Equal(t, "worker-7", NodeName(a))
	a.Spec.Hostname = "renamed"
	require.Equal(t, "worker-7", NodeName(a), "the Node's name does not follow spec.hostname")

	require.NoError(t, Advance(a, v1beta1.StageWritingImageToDisk, 40, "", now))
	require.True(t, WaitInstallation(&v1beta1.Agent{}, "waiting for the handover"))
	require.NoError(t, FailInstallation(a, "disk gone", now))
	require.Equal(t, v1beta1.StageFailed, a.Status.Progress.CurrentStage)
	require.EqualValues(t, 40, a.Status.Progress.InstallationPercentage)
	require.False(t, WaitInstallation(a, "disk gone"), "the same reason is no news")
}

// The sanitization's state machine, every transition from every state
// (see the diagram in sanitization.go). "boot" is the host's current
// registration session; an attempt of an earlier boot is over.
func TestSanitizationStateMachine(t *testing.T) {
	const boot, earlier = "2026-11-28T01:00:00Z", "2026-11-27T09:00:00Z"
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	start := metav1.NewTime(now.Add(-time.Minute))
	in := func(state string) *v1beta1.Agent {
		a := &v1beta1.Agent{}
		a.Status.Registration = &v1beta1.AgentRegistration{SessionStarted: boot}
		owed := func(st, session string) *v1beta1.AgentDiskSanitization {
			return &v1beta1.AgentDiskSanitization{Required: "erase", State: st, Session: session, StartTime: &start}
		}
		switch state {
		case "pending":
			a.Status.DiskSanitization = owed(v1beta1.SanitizationPending, "")
		case "running":
			a.Status.DiskSanitization = owed(v1beta1.SanitizationRunning, boot)
		case "running, earlier boot":
			a.Status.DiskSanitization = owed(v1beta1.SanitizationRunning, earlier)
		case "failed":
			a.Status.DiskSanitization = owed(v1beta1.SanitizationFailed, boot)
		case "failed, earlier boot":
			a.Status.DiskSanitization = owed(v1beta1.SanitizationFailed, earlier)
		case "done":
			a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{State: v1beta1.SanitizationDone, Level: "erase"}
		}
		return a
	}
	state := func(a *v1beta1.Agent) string {
		ds := a.Status.DiskSanitization
		switch {
		case ds == nil || ds.State == "":
			return "free"
		case ds.State == v1beta1.SanitizationDone && ds.Required == "":
			return "done"
		case ds.State == v1beta1.SanitizationPending:
			return "pending"
		case ds.State == v1beta1.SanitizationRunning && ds.Session == boot:
			return "running"
		case ds.State == v1beta1.SanitizationRunning:
			return "running, earlier boot"
		case ds.State == v1beta1.SanitizationFailed && ds.Session == boot:
			return "failed"
		case ds.State == v1beta1.SanitizationFailed:
			return "failed, earlier boot"
		}
		return "invalid: " + ds.State + " owing " + ds.Required
	}
	disk := []v1beta1.DiskSanitizationRecord{{Disk: "/dev/disk/by-id/wwn-0x5", Method: "blkdiscard"}}
	events := map[string]func(a *v1beta1.Agent) error{
		"owe":  func(a *v1beta1.Agent) error { OweSanitization(&a.Status, "metadata", "released"); return nil },
		"hold": func(a *v1beta1.Agent) error { HoldSanitization(a, "waiting: keep list"); return nil },
		"claim": func(a *v1beta1.Agent) error {
			return ClaimSanitization(a, []string{"/dev/disk/by-id/wwn-0x5"}, nil, now)
		},
		"progress": func(a *v1beta1.Agent) error {
			_, err := SanitizationProgress(a, "50%: erasing")
			return err
		},
		"finish": func(a *v1beta1.Agent) error {
			return FinishSanitization(a, Evidence{Records: disk, Summary: "erased"}, now)
		},
		"finish failed": func(a *v1beta1.Agent) error {
			return FinishSanitization(a, Evidence{Records: disk, Problems: []string{"not checked"}}, now)
		},
		"keep": func(a *v1beta1.Agent) error {
			_, err := KeepDisks(a, []string{"serial-1"})
			return err
		},
	}
	// state → event → the state after it, or "error".
	table := map[string]map[string]string{
		"free":                  {"owe": "pending", "hold": "free", "claim": "error", "progress": "error", "finish": "error", "finish failed": "error", "keep": "free"},
		"pending":               {"owe": "pending", "hold": "pending", "claim": "running", "progress": "error", "finish": "error", "finish failed": "error", "keep": "pending"},
		"running":               {"owe": "pending", "hold": "pending", "claim": "running", "progress": "running", "finish": "done", "finish failed": "failed", "keep": "error"},
		"running, earlier boot": {"owe": "pending", "hold": "pending", "claim": "running", "progress": "error", "finish": "error", "finish failed": "error", "keep": "running, earlier boot"},
		"failed":                {"owe": "pending", "hold": "failed", "claim": "error", "progress": "error", "finish": "error", "finish failed": "error", "keep": "failed"},
		"failed, earlier boot":  {"owe": "pending", "hold": "failed, earlier boot", "claim": "running", "progress": "error", "finish": "error", "finish failed": "error", "keep": "failed, earlier boot"},
		"done":                  {"owe": "pending", "hold": "done", "claim": "error", "progress": "error", "finish": "error", "finish failed": "error", "keep": "done"},
	}
	for from, row := range table {
		require.Len(t, row, len(events), "every event from %s", from)
		for event, want := range row {
			t.Run(from+"/"+event, func(t *testing.T) {
				a := in(from)
				require.Equal(t, from, state(a))
				before := a.DeepCopy()
				err := events[event](a)
				if want == "error" {
					require.Error(t, err)
					require.Equal(t, before, a, "a refused event changes nothing")
					return
				}
				require.NoError(t, err)
				require.Equal(t, want, state(a))
			})
		}
	}
}

// What each transition leaves for the host and for the record.
func TestSanitizationRecords(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	a := &v1beta1.Agent{}
	a.Status.Registration = &v1beta1.AgentRegistration{SessionStarted: "s1"}
	require.True(t, OweSanitization(&a.Status, "metadata", "released"))
	require.True(t, OweSanitization(&a.Status, "erase", "requested"))
	require.False(t, OweSanitization(&a.Status, "none", "nothing"))
	require.True(t, OweSanitization(&a.Status, "metadata", "released again"))
	require.Equal(t, "erase", a.Status.DiskSanitization.Required, "never weakened")

	require.Error(t, ClaimSanitization(a, nil, nil, now), "no disks")
	require.NoError(t, ClaimSanitization(a, []string{"d1", "d2"}, []string{"d2"}, now))
	ds := a.Status.DiskSanitization
	require.Equal(t, "s1", ds.Session)
	require.Equal(t, []v1beta1.DiskSanitizationRecord{{Disk: "d1"}, {Disk: "d2", Kept: true}}, ds.Disks)
	changed, err := SanitizationProgress(a, "10%: d1")
	require.NoError(t, err)
	require.True(t, changed)
	changed, _ = SanitizationProgress(a, "10%: d1")
	require.False(t, changed, "the same report again")

	require.NoError(t, FinishSanitization(a, Evidence{Records: ds.Disks, Problems: []string{"d1 was not checked"}}, now))
	require.Contains(t, ds.Message, "d1 was not checked. The host tries again")
	require.Equal(t, "erase", ds.Required, "still owed")
	require.Error(t, ClaimSanitization(a, []string{"d1"}, nil, now), "not again in the boot it failed in")

	a.Status.Registration.SessionStarted = "s2"
	require.NoError(t, ClaimSanitization(a, []string{"d1"}, nil, now))
	require.True(t, errors.Is(FinishSanitization(&v1beta1.Agent{}, Evidence{}, now), ErrNotSanitizing))
	require.NoError(t, FinishSanitization(a, Evidence{Records: ds.Disks, Summary: "d1 blkdiscard, checked"}, now))
	require.Equal(t, "", ds.Required)
	require.Equal(t, "erase", ds.Level, "the level that was owed is the level done")
	require.False(t, SanitizationOwed(a))
}
