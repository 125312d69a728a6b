package steps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/debts"
	"github.com/agentboot/agentboot/agent-service/internal/hostapi"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// SanitizeStepID names the sanitize step in step results.
const SanitizeStepID = "sanitize"

// Limits on what a host reports of a sanitization.
const (
	maxSanitizedDisks = 256
	maxEvidenceText   = 512
)

// sanitizeStep hands a host that owes a sanitization its step: an attempt
// that failed in this registration session is not handed again (a new boot
// of the discovery image tries again). The step is claimed like the install
// step, by a status write with the resourceVersion it was read at; the
// disks it names are recorded, so that the report must cover exactly those.
func (s *Steps) sanitizeStep(ctx context.Context, a *v1beta1.Agent) ([]agentwire.Step, error) {
	ds := a.Status.DiskSanitization
	// An attempt that failed in this boot is not tried again in it. One
	// shown Running in this boot is handed again: the agent runs steps
	// between heartbeats, so a host asking for instructions is not running
	// it any more (its result was lost, or its agent restarted).
	if !lifecycle.SanitizationToHand(a) {
		return nil, nil
	}
	// The disks are those of an inventory from this boot: one from an
	// earlier boot may miss a disk, and a host that was installed has at
	// least one (none means the host could not list them).
	disks := inventoryDisks(a)
	if !lifecycle.InventoryOfThisSession(a) || len(disks) == 0 {
		return nil, nil
	}
	// A disk to keep that names no disk of the host (a typo, a disk
	// pulled or renamed) holds the erase: erasing what the admin meant to
	// keep cannot be undone.
	keep, held := keptDisks(a.Status.Inventory.Disks, ds.Keep)
	if why, _, err := s.keepNotRecorded(ctx, a); err != nil {
		return nil, err
	} else if why != "" {
		held = append(held, why)
	}
	if len(held) > 0 {
		msg := fmt.Sprintf("waiting: %s; see the %s annotation of its BareMetalHost", strings.Join(held, "; "), sanitize.KeepAnnotation)
		// An attempt shown running in this boot is over (the host asks for
		// instructions): Pending again, so that the BareMetalHost
		// controller may record the new list.
		if next := a.DeepCopy(); lifecycle.HoldSanitization(next, msg) {
			err := s.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{}))
			switch {
			case apierrors.IsConflict(err):
				return nil, nil
			case err != nil:
				return nil, fmt.Errorf("record why the sanitization waits: %w", err)
			}
			s.Events.Eventf(a, nil, corev1.EventTypeWarning, "DiskSanitizationHeld", "Sanitize", "%s", msg)
		}
		return nil, nil
	}
	claimed := a.DeepCopy()
	if err := lifecycle.ClaimSanitization(claimed, disks, keep, s.Now()); err != nil {
		return nil, err
	}
	if err := s.Client.Status().Patch(ctx, claimed, client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return nil, nil // changed meanwhile: the next heartbeat looks again
		}
		return nil, fmt.Errorf("claim the sanitization: %w", err)
	}
	s.Events.Eventf(a, nil, corev1.EventTypeNormal, "DiskSanitizationStarted", "Sanitize", "sanitizing %d disks at level %s: %s", len(disks), ds.Required, strings.Join(disks, ", "))
	return []agentwire.Step{{ID: SanitizeStepID, Kind: agentwire.StepSanitize, Sanitize: &agentwire.SanitizeStep{Level: ds.Required, Disks: disks, Keep: keep}}}, nil
}

// keepNotRecorded says why the disks to keep the Agent records may not be
// those the administrator listed now, or "". The BareMetalHost controller
// copies the list; until its copy matches the annotation of every
// BareMetalHost that may be this host's (named by the Agent's label, or
// booting from a MAC its inventory lists), the erase waits: a list written
// a moment ago, on a paused host, or on a host the controller has not
// matched yet, is still the administrator's.
func (s *Steps) keepNotRecorded(ctx context.Context, a *v1beta1.Agent) (why string, orphan bool, err error) {
	var hosts metal3.BareMetalHostList
	if err := s.Client.List(ctx, &hosts, client.InNamespace(a.Namespace)); err != nil {
		if meta.IsNoMatchError(err) {
			return "", false, nil // no BareMetalHost CRD: no host has disks to keep
		}
		return "", false, fmt.Errorf("list BareMetalHosts for their disks to keep: %w", err)
	}
	macs := map[string]bool{}
	for _, i := range a.Status.Inventory.Interfaces {
		macs[strings.ToLower(i.MacAddress)] = true
	}
	var recorded []string
	if a.Status.DiskSanitization != nil {
		recorded = a.Status.DiskSanitization.Keep
	}
	matched := false
	for _, h := range hosts.Items {
		mac := strings.ToLower(h.Spec.BootMACAddress)
		if h.Name != a.Labels[v1beta1.BMHLabel] && (mac == "" || !macs[mac]) {
			continue
		}
		matched = true
		var want []string
		if raw, ok := h.Annotations[sanitize.KeepAnnotation]; ok {
			want, _ = sanitize.KeepRecord(raw)
		}
		if !slices.Equal(want, recorded) {
			return fmt.Sprintf("the disks to keep of BareMetalHost %s are not recorded on the Agent yet", h.Name), false, nil
		}
	}
	if !matched && len(recorded) > 0 {
		// The BareMetalHost that listed them is gone (deleted to be
		// re-created, handed to another tool), or no longer this
		// host's: what it said to keep is neither erased nor trusted
		// blindly; a BareMetalHost of the host records its own list.
		return "the Agent records disks to keep, but no BareMetalHost of this host lists them any more; give the host a BareMetalHost again (its list replaces this one), or clear status.diskSanitization.keep", true, nil
	}
	return "", false, nil
}

// keptDisks resolves the admin's disks to keep against the host's
// inventory: each entry is a by-id or by-path link, a serial number or a
// WWN (sanitize.ParseKeep refuses kernel names). Every path of a kept
// disk's WWN is kept (a multipath LUN seen twice). It returns the device
// paths to keep, and what holds the erase: an entry that names no disk, or
// disks that are not one (a serial two drives share).
func keptDisks(inventory []v1beta1.HostDisk, keep []string) (paths, problems []string) {
	// One disk seen twice (multipath): the same WWN, serial and size.
	same := func(x, y v1beta1.HostDisk) bool {
		return x.Wwn != "" && x.Serial != "" && strings.EqualFold(x.Wwn, y.Wwn) && x.Serial == y.Serial && x.SizeBytes == y.SizeBytes
	}
	for _, k := range keep {
		var matched []v1beta1.HostDisk
		for _, d := range inventory {
			if d.Path != "" && k != "" && names(d, k) {
				matched = append(matched, d)
			}
		}
		switch {
		case len(matched) == 0:
			problems = append(problems, fmt.Sprintf("the disk to keep %q matches no disk of the host's inventory", k))
			continue
		case slices.ContainsFunc(matched, func(d v1beta1.HostDisk) bool { return d.Path != matched[0].Path && !same(d, matched[0]) }):
			problems = append(problems, fmt.Sprintf("the disk to keep %q matches %d disks that are not one (%s)", k, len(matched), diskNames(matched)))
			continue
		}
		for _, d := range inventory {
			if d.Path != "" && (d.Path == matched[0].Path || same(d, matched[0])) && !slices.Contains(paths, d.Path) {
				paths = append(paths, d.Path)
			}
		}
	}
	return paths, problems
}

// names reports whether an entry of a keep list names disk d: its by-id or
// by-path link, serial or WWN, or the by-id link udev makes of its WWN
// (the inventory reports one by-id link per disk, which may be another).
// Never its kernel name, nor an ID that is one.
func names(d v1beta1.HostDisk, k string) bool {
	if k == d.ByID || k == d.ByPath || k == d.Serial || strings.HasPrefix(d.ID, "/dev/disk/") && k == d.ID {
		return true
	}
	if d.Wwn == "" {
		return false
	}
	w := strings.TrimPrefix(strings.ToLower(d.Wwn), "naa.")
	k = strings.ToLower(k)
	return k == strings.ToLower(d.Wwn) || k == w || k == "/dev/disk/by-id/wwn-"+w || k == "/dev/disk/by-id/wwn-0x"+strings.TrimPrefix(w, "0x") ||
		k == "/dev/disk/by-id/nvme-"+w
}

// sanitizeResult takes the host's evidence. Only a report for the attempt
// running in the host's current session counts, and only evidence that
// covers every disk handed to it, each erased by a method that gives the
// owed level (or spared as the boot medium or a kept disk) and checked,
// ends the quarantine. Anything else fails the attempt with the reasons.
func (s *Steps) sanitizeResult(ctx context.Context, a *v1beta1.Agent, r agentwire.StepResult) error {
	var done *v1beta1.AgentDiskSanitization
	var cur v1beta1.Agent
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.APIReader.Get(ctx, client.ObjectKeyFromObject(a), &cur); err != nil {
			return err
		}
		if !lifecycle.SanitizationRunning(&cur) {
			return errNotRunning
		}
		ds := cur.Status.DiskSanitization
		records, problems := judge(ds, cur.Status.Inventory.Disks, r)
		now := s.Now()
		var took time.Duration
		if ds.StartTime != nil { // always, but for a status written by hand
			took = now.Sub(ds.StartTime.Time)
		}
		next := cur.DeepCopy()
		if err := lifecycle.FinishSanitization(next, lifecycle.Evidence{Records: records, Problems: problems, Summary: summary(records, took)}, now); err != nil {
			return err
		}
		done = next.Status.DiskSanitization
		return s.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(&cur, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		var refused *hostapi.RefusedError
		if errors.As(err, &refused) {
			return err
		}
		return fmt.Errorf("record the sanitization: %w", err)
	}
	for _, d := range done.Disks {
		if !d.Kept && d.Error == "" {
			poolmetrics.ObserveErase(d.Method, d.Bytes, d.Duration.Duration)
		}
	}
	if done.State == v1beta1.SanitizationFailed {
		poolmetrics.ObserveSanitization(poolmetrics.SanitizationFailed)
		s.Events.Eventf(&cur, nil, corev1.EventTypeWarning, "DiskSanitizationFailed", "Sanitize", "%s", done.Message)
		return nil
	}
	poolmetrics.ObserveSanitization(poolmetrics.SanitizationDone)
	s.Events.Eventf(&cur, nil, corev1.EventTypeNormal, "DisksSanitized", "Sanitize", "level %s: %s", done.Level, done.Message)
	if s.Debts != nil {
		// The machine is clean: what it owed by its hardware is paid. A
		// debt left by a failure here is owed again at its next boot (an
		// erase too many, never one too few).
		if err := s.Debts.Settle(ctx, debts.AgentMarks(&cur), debts.DiskMarks(erasedDisks(done.Disks, cur.Status.Inventory.Disks)), done.Level); err != nil {
			s.Log.Error(err, "settle erase debts", "agent", cur.Namespace+"/"+cur.Name)
		}
	}
	return nil
}

var errNotRunning = &hostapi.RefusedError{Msg: "no sanitize step is running for this host"}

// erasedDisks are the inventory's disks the records say were erased (not
// kept, not spared).
func erasedDisks(records []v1beta1.DiskSanitizationRecord, inventory []v1beta1.HostDisk) []v1beta1.HostDisk {
	var out []v1beta1.HostDisk
	for _, r := range records {
		if r.Kept || r.Method == "" || r.Method == "skip" {
			continue
		}
		for _, d := range inventory {
			if d.Path == r.Disk {
				out = append(out, d)
			}
		}
	}
	return out
}

// inventoryDisks are the paths of the disks the host's inventory lists.
func inventoryDisks(a *v1beta1.Agent) []string {
	var disks []string
	for _, d := range a.Status.Inventory.Disks {
		if d.Path != "" && !slices.Contains(disks, d.Path) {
			disks = append(disks, d.Path)
		}
	}
	return disks
}

// judge turns the host's evidence into records and says what keeps the
// quarantine.
func judge(ds *v1beta1.AgentDiskSanitization, inventory []v1beta1.HostDisk, r agentwire.StepResult) ([]v1beta1.DiskSanitizationRecord, []string) {
	handed := map[string]bool{}
	for _, d := range ds.Disks {
		handed[d.Disk] = true
	}
	var problems []string
	if len(r.Sanitization) > len(handed) || len(r.Sanitization) > maxSanitizedDisks {
		return ds.Disks, []string{fmt.Sprintf("the host reported %d disks, more than the %d it was given", len(r.Sanitization), len(handed))}
	}
	size := map[string]int64{}
	for _, d := range inventory {
		size[d.Path] = d.SizeBytes
	}
	level := sanitize.Level(ds.Required)
	var kept []string // as handed out with the attempt
	for _, d := range ds.Disks {
		if d.Kept {
			kept = append(kept, d.Disk)
		}
	}
	if kept == nil && len(ds.Keep) > 0 {
		// Claimed by a service that did not record them yet.
		kept, _ = keptDisks(inventory, ds.Keep)
	}
	seen := map[string]bool{}
	var records []v1beta1.DiskSanitizationRecord
	for _, e := range r.Sanitization {
		rec := v1beta1.DiskSanitizationRecord{
			Disk: clip.Text(e.Disk, 256), Kept: slices.Contains(kept, e.Disk), Method: clip.Text(e.Method, 64), Why: clip.Text(e.Why, maxEvidenceText), Bytes: e.Bytes,
			Duration: metav1.Duration{Duration: time.Duration(e.DurationSeconds * float64(time.Second))}, Verification: clip.Text(e.Verification, 64),
			Checked: clip.Text(e.Checked, maxEvidenceText), Error: clip.Text(e.Error, maxEvidenceText),
		}
		records = append(records, rec)
		switch {
		case !handed[e.Disk]:
			problems = append(problems, fmt.Sprintf("%s: not a disk the host was given", rec.Disk))
		case seen[e.Disk]:
			problems = append(problems, fmt.Sprintf("%s: reported twice", rec.Disk))
		case e.Error != "":
			problems = append(problems, fmt.Sprintf("%s: %s", rec.Disk, rec.Error))
		case slices.Contains(kept, e.Disk) && sanitize.Method(e.Method) != sanitize.Skip:
			// The agent did not keep it (one older than the keep list):
			// done is done, but the record and the event say so.
			problems = append(problems, fmt.Sprintf("%s: a disk to keep, but the host reports it erased by %s", rec.Disk, rec.Method))
		case sanitize.Method(e.Method) == sanitize.Skip:
			if !spared(inventory, e.Disk) && !slices.Contains(kept, e.Disk) {
				problems = append(problems, fmt.Sprintf("%s: spared, but the host's inventory shows no boot medium there and it is not a disk to keep", rec.Disk))
			}
		case !sanitize.Gives(sanitize.Method(e.Method), level):
			problems = append(problems, fmt.Sprintf("%s: method %q does not give level %s", rec.Disk, rec.Method, level))
		case e.Verification == "" || e.Checked == "":
			problems = append(problems, fmt.Sprintf("%s: erased by %s but not checked", rec.Disk, rec.Method))
		case sanitize.Verification(e.Verification) != sanitize.VerificationOf(sanitize.Method(e.Method)):
			problems = append(problems, fmt.Sprintf("%s: erased by %s but checked by %q, not %q", rec.Disk, rec.Method, rec.Verification, sanitize.VerificationOf(sanitize.Method(e.Method))))
		case sanitize.Method(e.Method) != sanitize.WipeMetadata && e.Bytes < size[e.Disk]:
			problems = append(problems, fmt.Sprintf("%s: erased %d bytes of %d", rec.Disk, e.Bytes, size[e.Disk]))
		}
		seen[e.Disk] = true
	}
	for _, d := range ds.Disks {
		if !seen[d.Disk] {
			problems = append(problems, fmt.Sprintf("%s: no evidence", d.Disk))
			records = append(records, v1beta1.DiskSanitizationRecord{Disk: d.Disk, Error: "no evidence reported"})
		}
	}
	for _, d := range inventory {
		if d.Path != "" && !handed[d.Path] {
			problems = append(problems, fmt.Sprintf("%s: the host listed this disk after it was given the step", d.Path))
		}
	}
	if r.ExitCode != 0 && len(problems) == 0 {
		problems = append(problems, "the sanitize step failed: "+clip.Text(r.Error, maxEvidenceText))
	}
	return records, problems
}

// spared reports whether the inventory shows disk as something the agent
// spares (agent/internal/erase): an optical drive, a disk with a file
// system the discovery OS mounted, a read-only removable device with an ISO
// 9660 volume (a BMC's virtual media), or a drive without a medium. The
// admin's disks to keep are judged apart (keptDisks).
func spared(inventory []v1beta1.HostDisk, disk string) bool {
	for _, d := range inventory {
		if d.Path != disk {
			continue
		}
		var removable, iso, readOnly bool
		for _, r := range d.InstallationEligibility.NotEligibleReasons {
			switch {
			case r == agentwire.DiskOptical, strings.HasPrefix(r, agentwire.DiskMounted):
				return true
			case r == agentwire.DiskRemovable:
				removable = true
			case r == agentwire.DiskHoldsISO:
				iso = true
			case r == agentwire.DiskReadOnly:
				readOnly = true
			}
		}
		return d.DriveType == "ODD" || d.SizeBytes == 0 || removable && iso && readOnly
	}
	return false
}

// summary is a Done sanitization in a line.
func summary(records []v1beta1.DiskSanitizationRecord, took time.Duration) string {
	var parts []string
	for _, r := range records {
		if sanitize.Method(r.Method) == sanitize.Skip {
			parts = append(parts, fmt.Sprintf("%s spared (%s)", r.Disk, r.Why))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s, %d bytes in %s, checked", r.Disk, r.Method, r.Bytes, r.Duration.Round(time.Second)))
	}
	if len(parts) == 0 {
		parts = append(parts, "the host has no disks")
	}
	return clip.Text(strings.Join(parts, "; ")+fmt.Sprintf(" (%s in all)", took.Round(time.Second)), 2048)
}

// sanitizeProgress records what a sanitizing host reports.
func (s *Steps) sanitizeProgress(ctx context.Context, a *v1beta1.Agent, p agentwire.Progress) error {
	msg := clip.Text(fmt.Sprintf("%d%%: %s", p.Percentage, p.Info), maxEvidenceText)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1beta1.Agent{}
		if err := s.APIReader.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
			return err
		}
		next := cur.DeepCopy()
		if changed, err := lifecycle.SanitizationProgress(next, msg); err != nil {
			return errNotRunning
		} else if !changed {
			return nil
		}
		return s.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	})
}
