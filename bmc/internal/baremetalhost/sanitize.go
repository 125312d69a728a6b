package baremetalhost

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// What the owner of a host asks of its disks, on its BareMetalHost, which
// holds its BMC credentials: whoever writes it owns the server already
// (docs/bmc.md, docs/security.md).
const (
	// SanitizeRequestAnnotation asks for the host's disks to be sanitized
	// at the level it names (metadata or erase; empty is erase) before it
	// can be bound again. The controller records the request on the
	// host's Agent once it is unbound and not sanitizing, then removes the
	// annotation, as metal3's controller does with its reboot annotation.
	SanitizeRequestAnnotation = "agentboot.io/sanitize-disks"
	// SanitizeKeepAnnotation lists, comma-separated, the disks never to
	// erase: /dev/disk/by-id or by-path links, serial numbers or WWNs as
	// the host's inventory reports them (sanitize.ParseKeep). The agent
	// API also reads it when it hands a sanitization, and holds it while
	// the copy on the Agent differs.
	SanitizeKeepAnnotation = sanitize.KeepAnnotation
)

// diskRequests records the administrator's disks to keep and request for
// a wipe on the host's Agent, where the agent API reads them. The disks to
// keep do not change while an attempt runs in the host's current boot (its
// evidence is judged against them). An invalid list is recorded as it is
// written, clipped: it names no disk, so the sanitization waits rather
// than erase a disk the administrator meant to keep. A request waits while
// the Agent is bound, installing or sanitizing, and is recorded only on an
// Agent with the evidence that it booted this host.
func (r *Reconciler) diskRequests(ctx context.Context, host *metal3.BareMetalHost, a *v1beta1.Agent) error {
	raw, hasKeep := host.Annotations[SanitizeKeepAnnotation]
	keep, err := sanitize.KeepRecord(raw)
	if err != nil {
		r.Events.Eventf(host, nil, corev1.EventTypeWarning, "InvalidAnnotation", "Sanitize", "annotation %s: %v; the host's next sanitization waits until it is corrected", SanitizeKeepAnnotation, err)
	}
	if !hasKeep {
		keep = nil
	}
	next := a.DeepCopy()
	// An attempt shown running in an earlier boot (power was cut) is
	// over: the next claim uses the list as it is now.
	running := lifecycle.SanitizationRunning(a)
	changed, err := lifecycle.KeepDisks(next, keep)
	if errors.Is(err, lifecycle.ErrSanitizing) {
		r.Events.Eventf(host, nil, corev1.EventTypeWarning, "KeepDeferred", "Sanitize", "Agent %s is erasing its disks with the disks to keep it was given; the new list applies to its next sanitization", a.Name)
	}
	req, hasReq := host.Annotations[SanitizeRequestAnnotation]
	recorded := false
	if hasReq {
		level, err := sanitize.ParseLevel(req)
		switch {
		case err != nil || level == sanitize.None:
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "InvalidAnnotation", "Sanitize", "annotation %s: %q: want metadata or erase", SanitizeRequestAnnotation, clip.Text(req, 64))
		case running || lifecycle.Bound(a) || lifecycle.Occupied(a):
			// Asked again at the next pass: the release sanitizes at
			// the policy's level, and this request adds to it then.
		case bootEvidence(host, a) != nil:
			// An Agent matched by its MAC alone may not be this host:
			// the request waits for the one that booted its ISO.
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "DiskSanitizationRequestWaits", "Sanitize", "not recorded on Agent %s: %v", a.Name, bootEvidence(host, a))
		default:
			lifecycle.OweSanitization(&next.Status, string(level), fmt.Sprintf("requested by an administrator on BareMetalHost %s", host.Name))
			changed, recorded = true, true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(a, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("record the disks to keep and the sanitization requested on Agent %s: %w", a.Name, err)
	}
	*a = *next
	if !recorded {
		return nil
	}
	r.Events.Eventf(host, nil, corev1.EventTypeNormal, "DiskSanitizationRequested", "Sanitize", "Agent %s owes a sanitization of its disks at level %s before it can be bound again", a.Name, a.Status.DiskSanitization.Required)
	// With the resourceVersion read: a request changed meanwhile (a
	// stronger level) is a conflict, and recorded at the next pass, not
	// removed unseen.
	// On a copy: this pass's status (written at its end) stays as it is.
	cp := host.DeepCopy()
	patch := client.MergeFromWithOptions(host.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(cp.Annotations, SanitizeRequestAnnotation)
	if err := r.update(host, func() error { return r.Client.Patch(ctx, cp, patch) }); err != nil {
		return err
	}
	host.Annotations, host.ResourceVersion = cp.Annotations, cp.ResourceVersion
	return nil
}
