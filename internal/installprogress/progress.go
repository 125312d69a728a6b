// Package installprogress moves an Agent's status.progress through the
// worker installation stages. The agent API (stages the host reports) and
// the NodePool worker controller (stages seen from the hosted cluster) both
// write it, one after the other, through these rules: stages only go
// forward, Failed can follow any stage, and nothing follows Done or Failed.
package installprogress

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

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

// Index is the position of s in WorkerStages, or -1.
func Index(s v1beta1.HostStage) int { return slices.Index(WorkerStages, s) }

// Finished is true after Done or Failed.
func Finished(p *v1beta1.HostProgressInfo) bool {
	return p.CurrentStage == v1beta1.StageDone || p.CurrentStage == v1beta1.StageFailed
}

// Start begins an installation at "Starting installation".
func Start(p *v1beta1.HostProgressInfo, info string, now time.Time) {
	t := metav1.NewTime(now)
	*p = v1beta1.HostProgressInfo{
		CurrentStage:    v1beta1.StageStartingInstallation,
		ProgressStages:  slices.Clone(WorkerStages),
		ProgressInfo:    info,
		StageStartTime:  &t,
		StageUpdateTime: &t,
	}
}

// Advance moves p to stage with the overall percentage and detail. The same
// stage again updates its percentage and detail.
func Advance(p *v1beta1.HostProgressInfo, stage v1beta1.HostStage, percentage int64, info string, now time.Time) error {
	cur := p.CurrentStage
	switch {
	case cur == "":
		return fmt.Errorf("no installation was started for this host")
	case Finished(p):
		return fmt.Errorf("the installation already ended at %q", cur)
	case stage != v1beta1.StageFailed && Index(stage) < 0:
		return fmt.Errorf("%q is not an installation stage", stage)
	case stage != v1beta1.StageFailed && Index(stage) < Index(cur):
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

// Fail ends the installation at Failed with the reason.
func Fail(p *v1beta1.HostProgressInfo, reason string, now time.Time) error {
	return Advance(p, v1beta1.StageFailed, p.InstallationPercentage, reason, now)
}

// Reset forgets an installation: the host is back in discovery.
func Reset(p *v1beta1.HostProgressInfo) { *p = v1beta1.HostProgressInfo{} }
