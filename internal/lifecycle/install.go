package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// The installation's progress (status.progress) moves through the worker
// stages. The agent API (stages the host reports) and the NodePool worker
// controller (stages seen from the hosted cluster) both move it, one after
// the other, by these rules: stages only go forward, Failed can follow any
// stage, and nothing follows Done or Failed.

// WorkerStages are the stages of a worker joining a hosted cluster, in
// order (api.md); status.progress.progressStages lists them.
var WorkerStages = []v1beta1.HostStage{
	v1beta1.StageStartingInstallation, v1beta1.StageInstalling, v1beta1.StageWritingImageToDisk,
	v1beta1.StageWaitingControlPlane, v1beta1.StageRebooting, v1beta1.StageWaitingForIgnition,
	v1beta1.StageConfiguring, v1beta1.StageJoined, v1beta1.StageDone,
}

// HostStages are the stages the host itself reports; the later ones are
// observed in the hosted cluster.
var HostStages = []v1beta1.HostStage{
	v1beta1.StageStartingInstallation, v1beta1.StageInstalling, v1beta1.StageWritingImageToDisk, v1beta1.StageRebooting,
}

// StageIndex is the position of s in WorkerStages, or -1.
func StageIndex(s v1beta1.HostStage) int { return slices.Index(WorkerStages, s) }

// Finished is true after Done or Failed.
func Finished(s v1beta1.HostStage) bool {
	return s == v1beta1.StageDone || s == v1beta1.StageFailed
}

// Installation is what the host is handed to install, as the Agent
// records it.
type Installation struct {
	// Disk is the disk it installs to.
	Disk v1beta1.HostDisk
	// ImageURL is the OS image it writes, for the record.
	ImageURL string
	// OnRelease is the sanitization level its disks will owe when it
	// leaves the cluster (none or "" for none).
	OnRelease string
}

// StartInstallation records that the host was handed its installation: at
// "Starting installation", to the disk given, owing OnRelease when it is
// released, joining as the Node named by its hostname now (spec.hostname
// may change after; the Node's name does not).
func StartInstallation(a *v1beta1.Agent, in Installation, now time.Time) {
	t := metav1.NewTime(now)
	a.Status.Progress = v1beta1.HostProgressInfo{
		CurrentStage:    v1beta1.StageStartingInstallation,
		ProgressStages:  slices.Clone(WorkerStages),
		ProgressInfo:    fmt.Sprintf("installing to %s (%s) from %s", in.Disk.Path, in.Disk.ID, in.ImageURL),
		StageStartTime:  &t,
		StageUpdateTime: &t,
	}
	a.Status.InstallationDiskID = in.Disk.ID
	if a.Status.DiskSanitization == nil {
		a.Status.DiskSanitization = &v1beta1.AgentDiskSanitization{}
	}
	a.Status.DiskSanitization.OnRelease = in.OnRelease
	rec := Registration(a)
	rec.NodeName = a.Hostname()
	a.Status.Registration = &rec
}

// ErrNotInstalling is returned for progress of a host that was handed no
// installation.
var ErrNotInstalling = errors.New("no installation was started for this host")

// Advance moves the installation to stage with the overall percentage and
// detail. The same stage again updates its percentage and detail.
func Advance(a *v1beta1.Agent, stage v1beta1.HostStage, percentage int64, info string, now time.Time) error {
	p := &a.Status.Progress
	cur := p.CurrentStage
	switch {
	case cur == "":
		return ErrNotInstalling
	case Finished(cur):
		return fmt.Errorf("the installation already ended at %q", cur)
	case stage != v1beta1.StageFailed && StageIndex(stage) < 0:
		return fmt.Errorf("%q is not an installation stage", stage)
	case stage != v1beta1.StageFailed && StageIndex(stage) < StageIndex(cur):
		return fmt.Errorf("stage %q cannot follow %q", stage, cur)
	case percentage < 0 || percentage > 100:
		return fmt.Errorf("percentage %d is not within 0-100", percentage)
	}
	t := metav1.NewTime(now)
	if stage != cur {
		p.StageStartTime = &t
	}
	p.CurrentStage, p.ProgressInfo, p.StageUpdateTime = stage, info, &t
	if stage != v1beta1.StageFailed {
		// The overall percentage never goes back.
		p.InstallationPercentage = max(p.InstallationPercentage, percentage)
	}
	return nil
}

// FailInstallation ends the installation at Failed with the reason.
func FailInstallation(a *v1beta1.Agent, reason string, now time.Time) error {
	return Advance(a, v1beta1.StageFailed, a.Status.Progress.InstallationPercentage, reason, now)
}

// WaitInstallation records why a bound host's installation cannot start
// yet, and says whether that is news.
func WaitInstallation(a *v1beta1.Agent, why string) bool {
	if a.Status.Progress.ProgressInfo == why {
		return false
	}
	a.Status.Progress.ProgressInfo = why
	return true
}
