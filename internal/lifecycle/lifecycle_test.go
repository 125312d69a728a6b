package lifecycle

import (
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// conds is a compact view: condition type → "Status Reason".
type conds map[v1beta1.ConditionType]string

func view(cs []v1beta1.Condition) conds {
	out := conds{}
	for _, c := range cs {
		out[c.Type] = string(c.Status) + " " + c.Reason
	}
	return out
}

// The contract with cluster-api-provider-agent, state by stage: what it
// reads to pick an Agent (Validated, Connected, Bound), to call a machine
// Ready (SpecSynced, Validated, RequirementsMet, Installed) and to release
// its pre-terminate hook (the state).
func TestDerive(t *testing.T) {
	bound := &v1beta1.ClusterReference{Namespace: "clusters-vcluster2", Name: "vcluster2"}
	ready := Observed{Connected: true, Inventoried: true}
	free := conds{"SpecSynced": "True SyncOK", "Connected": "True AgentIsConnected", "RequirementsMet": "True AgentIsReady",
		"Validated": "True ValidationsPassing", "Installed": "False InstallationNotStarted", "Bound": "False Unbound"}
	with := func(base conds, changes conds) conds {
		out := conds{}
		for k, v := range base {
			out[k] = v
		}
		for k, v := range changes {
			out[k] = v
		}
		return out
	}
	installing := with(free, conds{"RequirementsMet": "True AgentAlreadyInstalling", "Installed": "False InstallationInProgress", "Bound": "True Bound"})
	unbinding := conds{"RequirementsMet": "False Unbinding", "Validated": "False Unbinding", "Installed": "False Unbinding"}
	for name, tc := range map[string]struct {
		cd       *v1beta1.ClusterReference
		stage    v1beta1.HostStage
		pct      int64
		approved bool
		bmh      bool
		owed     bool
		obs      Observed
		state    string
		role     v1beta1.AgentRole
		want     conds
		bindable bool
	}{
		"free and ready":          {approved: true, obs: ready, state: StateKnownUnbound, role: "auto-assign", want: free, bindable: true},
		"not approved":            {obs: ready, state: StateKnownUnbound, role: "auto-assign", want: with(free, conds{"RequirementsMet": "False AgentIsNotApproved"})},
		"disconnected":            {approved: true, obs: Observed{Inventoried: true}, state: StateDisconnectedUnbound, role: "auto-assign", want: with(free, conds{"Connected": "False AgentIsDisconnected", "RequirementsMet": "False AgentNotReady"})},
		"no inventory":            {approved: true, obs: Observed{Connected: true, PendingIDs: []string{"has-inventory"}}, state: StateDiscoveringUnbound, role: "auto-assign", want: with(free, conds{"Validated": "False ValidationsUnknown", "RequirementsMet": "False AgentNotReady"})},
		"failing":                 {approved: true, obs: Observed{Connected: true, Inventoried: true, Failing: []string{"has-min-memory"}, FailingMessages: "has-min-memory: 2 GiB"}, state: StateInsufficientUnbound, role: "auto-assign", want: with(free, conds{"Validated": "False ValidationsFailing", "RequirementsMet": "False AgentNotReady"})},
		"bound, waiting":          {cd: bound, approved: true, obs: ready, state: "known", role: "worker", want: with(free, conds{"Bound": "True Bound"})},
		"starting installation":   {cd: bound, stage: v1beta1.StageStartingInstallation, approved: true, obs: ready, state: StateInstalling, role: "worker", want: installing},
		"writing, silent":         {cd: bound, stage: v1beta1.StageWritingImageToDisk, pct: 50, approved: true, obs: Observed{}, state: StateInstallingInProgress, role: "worker", want: installing},
		"rebooted, silent":        {cd: bound, stage: v1beta1.StageRebooting, pct: 100, approved: true, obs: Observed{Inventoried: true, Failing: []string{"connected"}}, state: StateInstallingInProgress, role: "worker", want: installing},
		"joined":                  {cd: bound, stage: v1beta1.StageJoined, pct: 100, approved: true, state: StateInstallingInProgress, role: "worker", want: installing},
		"done":                    {cd: bound, stage: v1beta1.StageDone, pct: 100, approved: true, state: StateAddedToExistingCluster, role: "worker", want: with(installing, conds{"RequirementsMet": "True AgentInstallationStopped", "Installed": "True InstallationCompleted"})},
		"failed":                  {cd: bound, stage: v1beta1.StageFailed, pct: 30, approved: true, state: StateError, role: "worker", want: with(installing, conds{"RequirementsMet": "True AgentInstallationStopped", "Installed": "False InstallationFailed"})},
		"released, BareMetalHost": {stage: v1beta1.StageDone, pct: 100, approved: true, bmh: true, state: StateUnbinding, role: "auto-assign", want: with(with(free, unbinding), conds{"Bound": "False Unbinding"})},
		"released, no BMH":        {stage: v1beta1.StageDone, pct: 100, approved: true, state: StateUnbindingPendingUserAct, role: "auto-assign", want: with(with(free, unbinding), conds{"Bound": "False UnbindingPendingUserAction"})},
		"released while writing":  {stage: v1beta1.StageWritingImageToDisk, pct: 40, approved: true, state: StateUnbindingPendingUserAct, role: "auto-assign", want: with(with(free, unbinding), conds{"Bound": "False UnbindingPendingUserAction"})},
		// The Agent controller fails disks-sanitized while it is owed; even
		// with every condition as a free host's, it is not bindable.
		"back, sanitization owed": {approved: true, owed: true, obs: ready, state: StateKnownUnbound, role: "auto-assign", want: free},
	} {
		t.Run(name, func(t *testing.T) {
			a := &v1beta1.Agent{Spec: v1beta1.AgentSpec{ClusterDeploymentName: tc.cd, Approved: tc.approved, Role: v1beta1.AgentRoleAutoAssign}}
			a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: tc.stage, InstallationPercentage: tc.pct}
			if tc.bmh {
				a.Labels = map[string]string{v1beta1.BMHLabel: "worker-0"}
			}
			if tc.owed {
				a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{Required: "erase", State: v1beta1.SanitizationPending}
			}
			d := Derive(a, tc.obs)
			if d.State != tc.state || d.Role != tc.role {
				t.Errorf("state %q role %q, want %q %q", d.State, d.Role, tc.state, tc.role)
			}
			if diff := cmp.Diff(tc.want, view(d.Conditions)); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			reason := regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
			for _, c := range d.Conditions {
				if !reason.MatchString(c.Reason) {
					t.Errorf("%s reason %q is not one an AgentMachine condition accepts", c.Type, c.Reason)
				}
			}
			a.Status.Conditions = d.Conditions
			if got := Bindable(a); got != tc.bindable {
				t.Errorf("Bindable %v, want %v (%s)", got, tc.bindable, Unbindable(a))
			}
		})
	}
}

// Which unbound installations are forgotten at once, and which hosts must
// reboot into discovery first.
func TestReleasedOrForgotten(t *testing.T) {
	for name, tc := range map[string]struct {
		stage              v1beta1.HostStage
		pct                int64
		released, forgiven bool
	}{
		"never started":                {},
		"failed before writing":        {stage: v1beta1.StageFailed, pct: 30, forgiven: true},
		"failed after writing":         {stage: v1beta1.StageFailed, pct: 100, released: true},
		"handed its step":              {stage: v1beta1.StageStartingInstallation, released: true},
		"writing":                      {stage: v1beta1.StageWritingImageToDisk, pct: 50, released: true},
		"joined the cluster, then out": {stage: v1beta1.StageDone, pct: 100, released: true},
	} {
		t.Run(name, func(t *testing.T) {
			a := &v1beta1.Agent{}
			a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: tc.stage, InstallationPercentage: tc.pct}
			if Released(a) != tc.released || Forgotten(a) != tc.forgiven {
				t.Errorf("Released %v Forgotten %v, want %v %v", Released(a), Forgotten(a), tc.released, tc.forgiven)
			}
			if Released(a) && BootsFromDisk(a) {
				t.Error("a released host must boot discovery")
			}
		})
	}
}

// Forgetting an installation makes the host owe the release's level, and
// never less than an administrator's request it already owed.
func TestForgetInstallationOwes(t *testing.T) {
	for _, tc := range []struct{ owed, onRelease, want string }{
		{"", "metadata", "metadata"},
		{"", "erase", "erase"},
		{"erase", "metadata", "erase"},
		{"metadata", "erase", "erase"},
	} {
		st := v1beta1.AgentStatus{DiskSanitization: &v1beta1.AgentDiskSanitization{Required: tc.owed, OnRelease: tc.onRelease, State: v1beta1.SanitizationDone}}
		require.True(t, ForgetInstallation(&st, "it left a cluster"))
		require.Equal(t, tc.want, st.DiskSanitization.Required, "owed %q, release %q", tc.owed, tc.onRelease)
		require.Equal(t, v1beta1.SanitizationPending, st.DiskSanitization.State)
	}
	st := v1beta1.AgentStatus{DiskSanitization: &v1beta1.AgentDiskSanitization{Required: "erase", OnRelease: "none"}}
	require.False(t, ForgetInstallation(&st, "it left a cluster"), "a release that owes nothing")
	require.Equal(t, "erase", st.DiskSanitization.Required, "leaves what was owed")
}

// A host is occupied — no reboot into a new discovery image — while bound,
// installing or booted from its installed disk; not when free, failed or
// released before it wrote anything.
func TestOccupied(t *testing.T) {
	cd := &v1beta1.ClusterReference{Namespace: "cp", Name: "c"}
	for name, c := range map[string]struct {
		bound bool
		stage v1beta1.HostStage
		pct   int64
		want  bool
	}{
		"free":                      {},
		"bound, waiting to install": {bound: true, want: true},
		"installing":                {bound: true, stage: v1beta1.StageWritingImageToDisk, want: true},
		"rebooting into its disk":   {bound: true, stage: v1beta1.StageRebooting, pct: 100, want: true},
		"done":                      {bound: true, stage: v1beta1.StageDone, pct: 100, want: true},
		"failed":                    {bound: true, stage: v1beta1.StageFailed, pct: 40},
		"released while installing": {stage: v1beta1.StageInstalling, want: true},
	} {
		a := &v1beta1.Agent{}
		if c.bound {
			a.Spec.ClusterDeploymentName = cd
		}
		a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: c.stage, InstallationPercentage: c.pct}
		require.Equal(t, c.want, Occupied(a), name)
	}
	require.False(t, Occupied(nil), "no Agent")
}
