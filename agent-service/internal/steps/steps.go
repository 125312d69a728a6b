// Package steps hands bound Agents their installation and turns what the
// host reports into status.progress. A host gets the install step once: the
// step is claimed by writing "Starting installation" to the Agent's status
// with the resourceVersion it was read at, so two replicas answering two
// heartbeats cannot both hand it out.
package steps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/debts"
	"github.com/agentboot/agentboot/agent-service/internal/hostapi"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/diskboot"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/internal/signing"
)

// InstallStepID names the install step in step results.
const InstallStepID = "install"

// Steps implements hostapi.Steps.
type Steps struct {
	Client    client.Client
	APIReader client.Reader
	// Keys open the installations the manager hands over (package
	// handover), which Client reads in Namespace, agentboot's own.
	Keys      signing.Source
	Namespace string
	// Binding resolves an Agent's binding to its digest (nil:
	// binding.Resolve through APIReader).
	Binding func(ctx context.Context, a *v1beta1.Agent) (string, error)
	// Debts records, by hardware, the erase an installation leaves owed,
	// and settles it when the machine sanitized its disks.
	Debts  *debts.Store
	Events events.EventRecorder
	Log    logr.Logger
	Now    func() time.Time
}

var _ hostapi.Steps = (*Steps)(nil)

// Next gives a host that owes a disk sanitization its sanitize step
// (sanitize.go), and a bound, approved, validated Agent that has not
// started installing its install step, from the installation the manager
// handed over for it. When something it needs is missing, the reason goes
// to status.progress.progressInfo (shown in the Installed condition) and
// the host is asked again on its next heartbeat. A bound Agent the manager
// handed nothing over for (it installs nothing, --nodepools=false; or has
// not prepared it yet) gets no step, and nothing is written on it.
func (s *Steps) Next(ctx context.Context, ref *hostapi.AgentRef) ([]agentwire.Step, error) {
	a := ref.Agent
	if lifecycle.SanitizationOwed(a) {
		// Before anything else, bound or not: a binder that took the host
		// anyway gets it only once its disks hold nothing of the last
		// tenant.
		return s.sanitizeStep(ctx, a)
	}
	if !lifecycle.Bound(a) || !a.Spec.Approved || lifecycle.Started(a) {
		return nil, nil
	}
	var cm corev1.ConfigMap
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: handover.Name(a)}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read the installation's handover: %w", err)
	}
	key, err := s.Keys.Key()
	if err != nil {
		return nil, err
	}
	// The host's own reasons first: they are what a person can act on.
	disk, err := s.hostReady(ctx, a)
	var inst handover.Install
	if err == nil {
		// The binding afresh, from what only HyperShift and the provider
		// write: one revoked since the manager looked is refused now.
		inst, err = handover.Open(key, &cm, a, ref.InfraEnv, func() (string, error) { return s.binding(ctx, a) }, s.Now())
	}
	if err != nil {
		return nil, s.block(ctx, a, err.Error(), reason(err))
	}
	step := &agentwire.InstallStep{DiskPath: disk.Path, ImageURL: inst.ImageURL, ImageSHA256: inst.ImageSHA256, Ignition: inst.Ignition}
	onRelease := inst.OnRelease
	// The debt first, by hardware: once the step is out the disks may hold
	// the cluster's data, whatever becomes of this Agent.
	if s.Debts != nil {
		if err := s.Debts.Record(ctx, a, onRelease, fmt.Sprintf("installed through InfraEnv %s/%s", ref.InfraEnv.Namespace, ref.InfraEnv.Name)); err != nil {
			return nil, err
		}
	}
	claimed := a.DeepCopy()
	// With the Node name the config just built gives the host: what the
	// nodepool worker looks for, whatever spec.hostname says later.
	lifecycle.StartInstallation(claimed, lifecycle.Installation{Disk: disk, ImageURL: step.ImageURL, OnRelease: onRelease}, s.Now())
	if err := s.Client.Status().Patch(ctx, claimed, client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return nil, nil // changed meanwhile: the next heartbeat looks again
		}
		return nil, fmt.Errorf("claim the installation: %w", err)
	}
	s.Events.Eventf(a, nil, corev1.EventTypeNormal, "InstallationStarted", "Install", "installing to %s", disk.Path)
	return []agentwire.Step{{ID: InstallStepID, Kind: agentwire.StepInstall, Install: step}}, nil
}

// hostReady checks what the host itself must be to install: validated,
// with a disk to install to, and its BareMetalHost's keep list recorded.
func (s *Steps) hostReady(ctx context.Context, a *v1beta1.Agent) (v1beta1.HostDisk, error) {
	if !conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) {
		return v1beta1.HostDisk{}, errors.New("waiting for the host's validations to pass")
	}
	disk, err := ChooseDisk(a)
	if err != nil {
		return disk, err
	}
	// A list on the host's BareMetalHost not on the Agent yet may name
	// the disk chosen. (A list no BareMetalHost keeps any more holds the
	// erase, not the installation: ChooseDisk honours it.)
	if why, orphan, err := s.keepNotRecorded(ctx, a); err != nil {
		return disk, err
	} else if why != "" && !orphan {
		return disk, fmt.Errorf("waiting: %s", why)
	}
	return disk, nil
}

// reason is the event reason for why the installation waits: the one the
// manager gave (BindingRefused, InstallationWaiting), HandoverBroken for a
// handover that does not open, else InstallationWaiting.
func reason(err error) string {
	var r interface{ EventReason() string }
	switch {
	case errors.As(err, &r):
		return r.EventReason()
	case errors.Is(err, signing.ErrSealBroken):
		return "HandoverBroken"
	}
	return "InstallationWaiting"
}

// block records why the installation cannot start, once per reason.
func (s *Steps) block(ctx context.Context, a *v1beta1.Agent, why, reason string) error {
	patch := client.MergeFrom(a.DeepCopy())
	if !lifecycle.WaitInstallation(a, why) {
		return nil
	}
	if err := s.Client.Status().Patch(ctx, a, patch); err != nil {
		return fmt.Errorf("record why the installation waits: %w", err)
	}
	s.Events.Eventf(a, nil, corev1.EventTypeWarning, reason, "Install", "%s", why)
	return nil
}

// ChooseDisk is the disk to install to: the one spec.installation_disk_id
// or spec.installation_disk_path names, else the best eligible disk (solid
// state before rotating, then the smallest, then by name), which keeps
// larger disks free for data.
func ChooseDisk(a *v1beta1.Agent) (v1beta1.HostDisk, error) {
	disks := a.Status.Inventory.Disks
	// A disk an administrator marked to keep is never written, by an
	// installation either (docs/security.md).
	var kept []string
	if ds := a.Status.DiskSanitization; ds != nil {
		var held []string
		if kept, held = keptDisks(disks, ds.Keep); len(held) > 0 {
			return v1beta1.HostDisk{}, fmt.Errorf("waiting: %s (annotation %s of its BareMetalHost)", strings.Join(held, "; "), sanitize.KeepAnnotation)
		}
	}
	named := func(field, want string, match func(d v1beta1.HostDisk) bool) (v1beta1.HostDisk, error) {
		for _, d := range disks {
			if !match(d) {
				continue
			}
			if slices.Contains(kept, d.Path) {
				return d, fmt.Errorf("%s %q is a disk an administrator marked to keep (annotation %s of its BareMetalHost)", field, want, sanitize.KeepAnnotation)
			}
			if !d.InstallationEligibility.Eligible {
				return d, fmt.Errorf("%s %q is not eligible for installation: %s", field, want, strings.Join(d.InstallationEligibility.NotEligibleReasons, "; "))
			}
			return d, nil
		}
		return v1beta1.HostDisk{}, fmt.Errorf("%s %q is not a disk of this host (it has %s)", field, want, diskNames(disks))
	}
	if id := a.Spec.InstallationDiskID; id != "" {
		return named("spec.installation_disk_id", id, func(d v1beta1.HostDisk) bool { return d.ID == id })
	}
	if p := a.Spec.InstallationDiskPath; p != "" {
		return named("spec.installation_disk_path", p, func(d v1beta1.HostDisk) bool { return p == d.ByID || p == d.ByPath || p == d.Path })
	}
	var eligible []v1beta1.HostDisk
	for _, d := range disks {
		if d.InstallationEligibility.Eligible && d.Path != "" && !slices.Contains(kept, d.Path) {
			eligible = append(eligible, d)
		}
	}
	if len(eligible) == 0 {
		return v1beta1.HostDisk{}, fmt.Errorf("no eligible installation disk among %s", diskNames(disks))
	}
	rank := func(d v1beta1.HostDisk) int {
		if d.DriveType == "SSD" {
			return 0
		}
		return 1
	}
	slices.SortFunc(eligible, func(x, y v1beta1.HostDisk) int {
		switch {
		case rank(x) != rank(y):
			return rank(x) - rank(y)
		case x.SizeBytes != y.SizeBytes:
			if x.SizeBytes < y.SizeBytes {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Name, y.Name)
	})
	return eligible[0], nil
}

func diskNames(disks []v1beta1.HostDisk) string {
	if len(disks) == 0 {
		return "no disks"
	}
	var names []string
	for _, d := range disks {
		n := d.Name
		if n == "" {
			n = d.ID
		}
		if !d.InstallationEligibility.Eligible {
			n += " (not eligible: " + strings.Join(d.InstallationEligibility.NotEligibleReasons, "; ") + ")"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// Result takes the install step's outcome: a failure ends the installation
// at Failed with the agent's error, unless the host already said so. A
// host unbound while it installed is still in discovery: its installation
// is forgotten (it is free again) and it is told so (ErrReleased), so that
// it wipes what it wrote instead of rebooting into a system that would
// join a cluster it no longer belongs to.
func (s *Steps) Result(ctx context.Context, ref *hostapi.AgentRef, step string, r agentwire.StepResult) error {
	if step == SanitizeStepID {
		return s.sanitizeResult(ctx, ref.Agent, r)
	}
	if step != InstallStepID {
		return &hostapi.RefusedError{Msg: fmt.Sprintf("no step %q was given to this host", step)}
	}
	if released, err := s.forgetIfReleased(ctx, ref.Agent); err != nil || released {
		if err == nil {
			err = hostapi.ErrReleased
		}
		return err
	}
	if r.ExitCode == 0 {
		return nil
	}
	reason := r.Error
	if reason == "" {
		reason = fmt.Sprintf("the install step exited with %d", r.ExitCode)
	}
	_, err := s.update(ctx, ref.Agent, func(next *v1beta1.Agent) error {
		if next.Status.Progress.CurrentStage == v1beta1.StageFailed {
			return nil
		}
		return lifecycle.FailInstallation(next, reason, s.Now())
	})
	return err
}

// forgetIfReleased forgets the installation of an Agent that is no longer
// bound, read fresh from the apiserver.
func (s *Steps) forgetIfReleased(ctx context.Context, a *v1beta1.Agent) (bool, error) {
	cur := &v1beta1.Agent{}
	if err := s.APIReader.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
		return false, err
	}
	if lifecycle.Bound(cur) {
		return false, nil
	}
	if lifecycle.Started(cur) {
		next := cur.DeepCopy()
		// What it wrote before it was told (the image, the pointer config
		// with the tenant's token) makes it owe a sanitization too.
		lifecycle.ForgetInstallation(&next.Status, "it was released from a cluster while it installed")
		if err := s.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{})); err != nil {
			return false, fmt.Errorf("forget the installation of a released host: %w", err)
		}
		s.Events.Eventf(cur, nil, corev1.EventTypeNormal, "BackInDiscovery", "Install",
			"the host was released from its cluster while it installed; it wipes what it wrote and stays in discovery")
	}
	return true, nil
}

// Progress records a stage the host reports; the stages after Rebooting are
// the service's to observe.
func (s *Steps) Progress(ctx context.Context, ref *hostapi.AgentRef, p agentwire.Progress) error {
	if p.Stage == agentwire.StageSanitizing {
		return s.sanitizeProgress(ctx, ref.Agent, p)
	}
	stage := v1beta1.HostStage(p.Stage)
	if stage != v1beta1.StageFailed && !slices.Contains(lifecycle.HostStages, stage) {
		return fmt.Errorf("stage %q is not one a host reports", p.Stage)
	}
	a, err := s.update(ctx, ref.Agent, func(next *v1beta1.Agent) error {
		return lifecycle.Advance(next, stage, int64(p.Percentage), p.Info, s.Now())
	})
	if err == nil {
		// Before the host is answered (and reboots): the image service
		// sends it to its disk by this record, whether or not the
		// manager, which keeps the records, is there at this moment.
		if rec := diskboot.For(s.Namespace, a); rec != nil {
			if err := s.Client.Create(ctx, rec); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("record that the host boots from its disk: %w", err)
			}
		}
	}
	if err == nil && stage == v1beta1.StageFailed {
		s.Events.Eventf(ref.Agent, nil, corev1.EventTypeWarning, v1beta1.InstallationFailedReason, "Install", "the installation failed: %s", p.Info)
	}
	return err
}

// update applies change to the Agent's progress with optimistic locking.
// It reads the Agent from the apiserver, not the cache: a host reports its
// first stage right after its step was claimed, before the cache may have
// the claim.
func (s *Steps) update(ctx context.Context, a *v1beta1.Agent, change func(*v1beta1.Agent) error) (*v1beta1.Agent, error) {
	cur := &v1beta1.Agent{}
	var next *v1beta1.Agent
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.APIReader.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
			return err
		}
		if !lifecycle.Bound(cur) {
			return errors.New("the host was released from its cluster: its installation is void")
		}
		next = cur.DeepCopy()
		if err := change(next); err != nil {
			return err
		}
		if equalProgress(cur.Status.Progress, next.Status.Progress) {
			return nil
		}
		return s.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return nil, err
	}
	return next, nil
}

func equalProgress(a, b v1beta1.HostProgressInfo) bool {
	return a.CurrentStage == b.CurrentStage && a.ProgressInfo == b.ProgressInfo && a.InstallationPercentage == b.InstallationPercentage &&
		a.StageUpdateTime.Equal(b.StageUpdateTime)
}

func (s *Steps) binding(ctx context.Context, a *v1beta1.Agent) (string, error) {
	if s.Binding != nil {
		return s.Binding(ctx, a)
	}
	b, err := binding.Resolve(ctx, s.APIReader, a)
	if err != nil {
		return "", err
	}
	return b.Digest(), nil
}
