package lifecycle

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
)

// Observed is what the Agent controller saw of a host this pass, besides
// the Agent itself.
type Observed struct {
	// Connected: the host contacted the service recently.
	Connected bool
	// Silence says how long it has not, for messages ("more than 3m0s").
	Silence string
	// Inventoried: the host reported its inventory.
	Inventoried bool
	// PendingIDs and Failing are the validations not yet passing;
	// FailingMessages says why the failing ones fail.
	PendingIDs, Failing []string
	FailingMessages     string
}

func (o Observed) passing() bool { return len(o.PendingIDs) == 0 && len(o.Failing) == 0 }

// Status is what follows for the Agent's status.
type Status struct {
	State, StateInfo string
	Role             v1beta1.AgentRole
	// Conditions in the order they are written: SpecSynced, Connected,
	// RequirementsMet, Validated, Installed, Bound.
	Conditions []v1beta1.Condition
	// FrozenValidations: the installation started, so the validations are
	// not recomputed (a rebooting host is not "disconnected").
	FrozenValidations bool
}

// Derive computes the host state, role and conditions of an Agent from its
// spec, labels and status.progress (after Forgotten installations were
// reset) and what was observed. Reasons are assisted-service's, all
// non-empty CamelCase: cluster-api-provider-agent copies them into
// metav1.Conditions of AgentMachines, which refuse anything else.
func Derive(a *v1beta1.Agent, o Observed) Status {
	p := &a.Status.Progress
	s := Status{Role: v1beta1.AgentRoleAutoAssign}
	if Bound(a) {
		// A day-2 host joins as a worker unless told otherwise, as in
		// assisted-service (cluster-api-provider-agent never sets a role).
		s.Role = a.Spec.Role
		if s.Role == "" || s.Role == v1beta1.AgentRoleAutoAssign {
			s.Role = v1beta1.AgentRoleWorker
		}
	}
	synced := conditions.New(v1beta1.SpecSyncedCondition, true, v1beta1.SyncOKReason, "The Spec has been successfully applied")
	connected := conditions.New(v1beta1.ConnectedCondition, true, v1beta1.AgentConnectedReason, "The agent's connection to the installation service is unimpaired")
	validated := conditions.New(v1beta1.ValidatedCondition, true, v1beta1.ValidationsPassingReason, "The agent's validations are passing")
	bound := conditions.New(v1beta1.BoundCondition, false, v1beta1.UnboundReason, "The agent is not bound to any cluster")
	if Bound(a) {
		cd := a.Spec.ClusterDeploymentName
		bound = conditions.New(v1beta1.BoundCondition, true, v1beta1.BoundReason, "The agent is bound to cluster "+cd.Namespace+"/"+cd.Name)
	}
	var requirements, installed v1beta1.Condition
	detail := func(msg string) string {
		if p.ProgressInfo != "" {
			return msg + ": " + p.ProgressInfo
		}
		return msg
	}

	switch {
	case Released(a):
		unbinding := "The agent was released from its cluster: reboot the host into the discovery image"
		s.State, s.StateInfo = StateUnbindingPendingUserAct, "Host was released from its cluster: reboot the host into the discovery image"
		bound = conditions.New(v1beta1.BoundCondition, false, v1beta1.UnbindingPendingUserActionRsn, unbinding)
		if bmh := a.Labels[v1beta1.BMHLabel]; bmh != "" {
			unbinding = "The agent was released from its cluster; BareMetalHost " + bmh + " reboots the host into the discovery image"
			s.State, s.StateInfo = StateUnbinding, "Host was released from its cluster; its BareMetalHost reboots it into the discovery image"
			bound = conditions.New(v1beta1.BoundCondition, false, v1beta1.UnbindingReason, unbinding)
		}
		requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentRequirementsUnbinding, unbinding)
		validated = conditions.New(v1beta1.ValidatedCondition, false, v1beta1.AgentRequirementsUnbinding, unbinding)
		installed = conditions.New(v1beta1.InstalledCondition, false, v1beta1.AgentRequirementsUnbinding, unbinding)
		s.FrozenValidations = true
	case Bound(a) && Started(a):
		s.FrozenValidations = true
		stopped := conditions.New(v1beta1.RequirementsMetCondition, true, v1beta1.AgentInstallationStoppedReason, "The installation has stopped")
		switch p.CurrentStage {
		case v1beta1.StageFailed:
			s.State, s.StateInfo = StateError, "Host failed to install: "+p.ProgressInfo
			requirements = stopped
			installed = conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationFailedReason, detail("The installation has failed"))
		case v1beta1.StageDone:
			s.State, s.StateInfo = StateAddedToExistingCluster, "Host has joined cluster "+a.Spec.ClusterDeploymentName.Name
			requirements = stopped
			installed = conditions.New(v1beta1.InstalledCondition, true, v1beta1.InstallationCompletedReason, detail("The installation has completed"))
		default:
			s.State, s.StateInfo = StateInstallingInProgress, "Host is installing: "+string(p.CurrentStage)
			if p.CurrentStage == v1beta1.StageStartingInstallation {
				s.State, s.StateInfo = StateInstalling, "Installation is starting"
			}
			requirements = conditions.New(v1beta1.RequirementsMetCondition, true, v1beta1.AgentAlreadyInstallingReason, "The agent cannot begin the installation because it has already started")
			installed = conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationInProgressReason,
				detail(fmt.Sprintf("The installation is in progress: %s, %d%%", p.CurrentStage, p.InstallationPercentage)))
		}
	default:
		s.State, s.StateInfo = preInstallState(a, o)
		validated = validatedCondition(o)
		if !o.Connected {
			connected = conditions.New(v1beta1.ConnectedCondition, false, v1beta1.AgentDisconnectedReason, "The agent has not contacted the installation service in a while; it is disconnected")
		}
		switch {
		case !a.Spec.Approved:
			requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentIsNotApprovedReason, "The agent is not approved")
		case o.passing() && o.Connected:
			requirements = conditions.New(v1beta1.RequirementsMetCondition, true, v1beta1.AgentReadyReason, "The agent is ready to begin the installation")
		default:
			requirements = conditions.New(v1beta1.RequirementsMetCondition, false, v1beta1.AgentNotReadyReason, "The agent is not ready: "+notReady(o.Connected, validated))
		}
		installed = conditions.New(v1beta1.InstalledCondition, false, v1beta1.InstallationNotStartedReason, detail("The installation has not yet started"))
	}
	s.Conditions = []v1beta1.Condition{synced, connected, requirements, validated, installed, bound}
	return s
}

func validatedCondition(o Observed) v1beta1.Condition {
	switch {
	case o.passing():
		return conditions.New(v1beta1.ValidatedCondition, true, v1beta1.ValidationsPassingReason, "The agent's validations are passing")
	case !o.Inventoried:
		return conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsUnknownReason, "The agent's validations have not yet been calculated")
	case len(o.Failing) == 0:
		return conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsUserPendingReason, "The agent's validations are pending: "+strings.Join(o.PendingIDs, ", "))
	}
	return conditions.New(v1beta1.ValidatedCondition, false, v1beta1.ValidationsFailingReason, "The agent's validations are failing: "+o.FailingMessages)
}

// preInstallState is the state of a host that is not installing.
func preInstallState(a *v1beta1.Agent, o Observed) (string, string) {
	state, info := StateKnownUnbound, "Host is ready to be bound to a cluster"
	switch {
	case !o.Connected:
		state, info = StateDisconnectedUnbound, "The host has not checked in for "+o.Silence
	case !o.Inventoried:
		state, info = StateDiscoveringUnbound, "Waiting for the host's inventory"
	case len(o.Failing) > 0:
		state, info = StateInsufficientUnbound, "Host cannot be installed due to following failing validation(s): "+strings.Join(o.Failing, ", ")
	case !o.passing():
		state, info = StateDiscoveringUnbound, "Waiting for validations: "+strings.Join(o.PendingIDs, ", ")
	}
	if Bound(a) {
		// Bound hosts drop the -unbound suffix, as in assisted-service.
		state = strings.TrimSuffix(state, "-unbound")
		if state == "known" {
			info = "Host is bound to cluster " + a.Spec.ClusterDeploymentName.Name + " and ready to be installed"
		}
	}
	return state, info
}

func notReady(connected bool, validated v1beta1.Condition) string {
	if !connected {
		return "it is disconnected"
	}
	return strings.ToLower(validated.Message[:1]) + validated.Message[1:]
}

// Settle brings the Agent's status in line with its spec and what was
// observed of its host this pass (the Agent controller's write): an
// installation of a host unbound before it wrote anything is forgotten
// (it says so: that write makes it owe its sanitization, and must not be
// made from a stale read), then the validations (unless the installation
// froze them), conditions, role and state follow from Derive.
func Settle(a *v1beta1.Agent, o Observed, vs v1beta1.ValidationsStatus, now time.Time) (forgot bool) {
	st := &a.Status
	if forgot = Forgotten(a); forgot {
		// Unbound after its installation failed: the host still runs
		// discovery, so the installation is forgotten; what it may have
		// written before it failed makes it owe a sanitization.
		ForgetInstallation(st, "its installation failed and it was released from its cluster")
	}
	d := Derive(a, o)
	if !d.FrozenValidations || len(st.ValidationsInfo) == 0 {
		st.ValidationsInfo = vs
	}
	t := metav1.NewTime(now)
	for _, c := range d.Conditions {
		st.Conditions = conditions.Set(st.Conditions, c, t)
	}
	st.Role = d.Role
	st.DebugInfo.State, st.DebugInfo.StateInfo = d.State, d.StateInfo
	return forgot
}
