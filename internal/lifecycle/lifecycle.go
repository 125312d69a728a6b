// Package lifecycle is the one home of the rules of an Agent's life: when it
// is bound, installing, released or free, when its host boots its disk, when
// cluster-api-provider-agent may take it, and the host state, role and
// conditions that follow. The agent API, the Agent controller, the BMC
// controller, the image service and the NodePool controllers read these
// rules; none keeps a copy. The conditions mirror what assisted-service
// writes for the same host states, because cluster-api-provider-agent
// copies them into AgentMachines and decides on them.
//
// It is also the only writer of an Agent's status: registration, inventory,
// validations and conditions, the installation's stages, the
// sanitization's state machine and the release are functions here that
// change the Agent they are given, and the caller sends the result
// (TestOnlyLifecycleWritesAgentState holds every other package to that).
// It never talks to the apiserver.
package lifecycle

import (
	"time"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// Host states (status.debugInfo.state), named as assisted-service names
// them. Bound hosts drop the -unbound suffix.
const (
	StateDiscoveringUnbound  = "discovering-unbound"
	StateKnownUnbound        = "known-unbound"
	StateInsufficientUnbound = "insufficient-unbound"
	StateDisconnectedUnbound = "disconnected-unbound"

	StateInstalling              = "installing"
	StateInstallingInProgress    = "installing-in-progress"
	StateAddedToExistingCluster  = "added-to-existing-cluster"
	StateError                   = "error"
	StateUnbinding               = "unbinding"
	StateUnbindingPendingUserAct = "unbinding-pending-user-action"
)

// Labels and annotations cluster-api-provider-agent writes on the Agents it
// binds.
const (
	// AgentMachineRefLabel names (by name or, in older releases, by UID)
	// the AgentMachine that took the Agent.
	AgentMachineRefLabel = "agentMachineRef"
	// AgentMachineRefNamespaceAnnotation is that AgentMachine's namespace:
	// the hosted cluster's control-plane namespace.
	AgentMachineRefNamespaceAnnotation = "agentMachineRefNamespace"
)

// Registration is the Agent's registration record (status.registration,
// written by the agent API only), or an empty one.
func Registration(a *v1beta1.Agent) v1beta1.AgentRegistration {
	if a.Status.Registration == nil {
		return v1beta1.AgentRegistration{}
	}
	return *a.Status.Registration
}

// NodeName is the name of the Node the host's installation joins as: the
// hostname recorded when its install step was handed out (spec.hostname is
// tenant-writable and may change after), or the effective hostname before.
func NodeName(a *v1beta1.Agent) string {
	if n := Registration(a).NodeName; n != "" {
		return n
	}
	return a.Hostname()
}

// Bound reports whether the Agent is bound to a cluster.
func Bound(a *v1beta1.Agent) bool { return a.Spec.ClusterDeploymentName != nil }

// Started reports whether an installation was handed to the host (and not
// forgotten since).
func Started(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage != "" }

// Occupied reports whether rebooting the host (into a new discovery
// image, say) would break what it is doing: it is bound (a host waiting
// for its installation would start a new session, and its installation
// over, for nothing), installing, or booted from its installed disk. A
// failed installation occupies nothing.
func Occupied(a *v1beta1.Agent) bool {
	if a == nil {
		return false
	}
	st := a.Status.Progress.CurrentStage
	return (st != "" && st != v1beta1.StageFailed) || BootsFromDisk(a) || Bound(a) && st == ""
}

// mayHaveWrittenDisk is true once the host was handed its installation,
// unless it failed before it wrote anything: the agent reports Rebooting
// at 100% only once image and config are on the disk, and a failed write
// wipes what it wrote and keeps the percentage below 100.
func mayHaveWrittenDisk(p *v1beta1.HostProgressInfo) bool {
	if p.CurrentStage == v1beta1.StageFailed {
		return p.InstallationPercentage == 100
	}
	return p.CurrentStage != ""
}

// Released reports whether the host was unbound after its installation
// began: it may be writing or have written its disk, so it must boot the
// discovery image again to rejoin the free pool (it registers again and the
// installation is forgotten). Its BareMetalHost reboots it; without one a
// person must.
func Released(a *v1beta1.Agent) bool {
	return !Bound(a) && mayHaveWrittenDisk(&a.Status.Progress)
}

// Forgotten reports whether an installation should be forgotten at once:
// the host was unbound before it could write anything, so it still runs
// discovery and is free.
func Forgotten(a *v1beta1.Agent) bool {
	return !Bound(a) && Started(a) && !Released(a)
}

// ForgetInstallation forgets the host's installation (it is back in
// discovery and free) and, in the same change, makes it owe the
// sanitization recorded when the installation was handed out: every path
// that frees an installed host goes through here, so none can free it with
// the last tenant's data on its disks. It says whether a sanitization is
// now owed.
func ForgetInstallation(st *v1beta1.AgentStatus, why string) bool {
	st.Progress = v1beta1.HostProgressInfo{}
	st.InstallationDiskID = ""
	if st.Registration != nil {
		st.Registration.NodeName = ""
	}
	ds := st.DiskSanitization
	if ds == nil {
		return false
	}
	return OweSanitization(st, ds.OnRelease, why)
}

// InventoryOfThisSession reports whether the Agent's inventory was reported
// in the host's current registration session (a boot of the discovery
// image): an earlier boot's may miss a disk. The agent API stores an
// unchanged inventory once per session for this.
func InventoryOfThisSession(a *v1beta1.Agent) bool {
	inv := a.Status.Inventory.ReportTime
	started, err := time.Parse(time.RFC3339, Registration(a).SessionStarted)
	// The report time is stored to the second; the session start is not.
	return inv != nil && err == nil && !inv.Time.Before(started.Truncate(time.Second))
}

// BootsFromDisk reports whether the host's next boot must be its disk: its
// installation wrote the disk and it is rebooting or past it. iPXE scripts,
// the PXE service and the BMC controller send such hosts to local boot.
func BootsFromDisk(a *v1beta1.Agent) bool {
	if Released(a) {
		return false
	}
	switch a.Status.Progress.CurrentStage {
	case v1beta1.StageRebooting, v1beta1.StageWaitingForIgnition, v1beta1.StageConfiguring, v1beta1.StageJoined, v1beta1.StageDone:
		return true
	}
	for _, c := range a.Status.Conditions {
		if c.Type == v1beta1.InstalledCondition && c.Status == "True" {
			return true
		}
	}
	return false
}

// Bindable reports whether cluster-api-provider-agent may take the Agent
// for a Machine (its isValidAgent and findAgent): approved, not taken by
// an AgentMachine, Validated and Connected True, Bound False (a missing
// Bound condition makes it ineligible). The label selector is the
// caller's.
func Bindable(a *v1beta1.Agent) bool {
	return Unbindable(a) == ""
}

// Unbindable says in a few words why cluster-api-provider-agent would not
// take the Agent, or "" when it would.
func Unbindable(a *v1beta1.Agent) string {
	status := func(t v1beta1.ConditionType) string {
		for _, c := range a.Status.Conditions {
			if c.Type == t {
				return string(c.Status)
			}
		}
		return ""
	}
	_, taken := a.Labels[AgentMachineRefLabel]
	switch {
	case taken || Bound(a) || status(v1beta1.BoundCondition) == "True":
		return "already bound"
	case Registration(a).Disputed != "":
		return "identity disputed"
	case !a.Spec.Approved:
		return "not approved"
	case Released(a):
		return "released, not yet back in discovery"
	case SanitizationOwed(a):
		return "disks not yet sanitized"
	case status(v1beta1.BoundCondition) != "False":
		return "not yet observed"
	case status(v1beta1.ConnectedCondition) != "True":
		return "disconnected"
	case status(v1beta1.ValidatedCondition) != "True":
		return "failing validation"
	}
	return ""
}
