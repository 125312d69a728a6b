package baremetalhost

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/address"
	"github.com/agentboot/agentboot/bmc/internal/driver"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/signing"
)

// hostRun is one pass over one host with an open BMC session.
type hostRun struct {
	r     *Reconciler
	host  *metal3.BareMetalHost
	bmc   driver.BMC
	addr  address.Address
	agent *v1beta1.Agent // the matched Agent, or nil
	power driver.Power   // as the BMC reported it at the start of the pass
	// wasOn is status.poweredOn as the last pass wrote it: kept in the
	// host, so it survives a restart of the manager.
	wasOn bool
}

func (h *hostRun) state() metal3.ProvisioningState { return h.host.Status.Provisioning.State }

func (h *hostRun) setState(s metal3.ProvisioningState) { h.host.Status.Provisioning.State = s }

// stateHandlers is the host state machine: registering → available →
// provisioning → provisioned, back through deprovisioning when the host
// leaves its InfraEnv.
var stateHandlers = map[metal3.ProvisioningState]func(*hostRun, context.Context) step{
	metal3.StateRegistering:           (*hostRun).register,
	metal3.StateAvailable:             (*hostRun).available,
	metal3.StateProvisioning:          (*hostRun).provision,
	metal3.StateProvisioned:           (*hostRun).provisioned,
	metal3.StateDeprovisioning:        (*hostRun).deprovision,
	metal3.StateExternallyProvisioned: (*hostRun).externallyProvisioned,
}

// register: the BMC answered with a power state, so the host is known.
func (h *hostRun) register(ctx context.Context) step {
	if h.host.Spec.ExternallyProvisioned {
		h.setState(metal3.StateExternallyProvisioned)
		return h.externallyProvisioned(ctx)
	}
	h.setState(metal3.StateAvailable)
	return h.available(ctx)
}

// available: power as asked; enroll once the InfraEnv's image is ready.
func (h *hostRun) available(ctx context.Context) step {
	if h.host.Spec.ExternallyProvisioned {
		h.setState(metal3.StateExternallyProvisioned)
		return h.externallyProvisioned(ctx)
	}
	iso, wait, err := h.enrollment(ctx)
	if err != nil {
		return failed(metal3.ProvisioningError, err)
	}
	if iso == "" || !h.host.Spec.Online {
		if err := h.abandonBoot(ctx); err != nil {
			// Power still follows spec.online; the eject is retried.
			if res := h.enforcePower(ctx); res.err != nil {
				return res
			}
			return failed(metal3.ProvisioningError, fmt.Errorf("eject the virtual media of an abandoned boot: %w", err))
		}
		if wait {
			// The InfraEnv exists but its image is not ready; its status
			// change will enqueue the host, this is a safety net.
			res := h.enforcePower(ctx)
			if res.err == nil && res.requeue == 0 {
				res.requeue = time.Minute
			}
			return res
		}
		return h.enforcePower(ctx)
	}
	h.setState(metal3.StateProvisioning)
	return h.provision(ctx)
}

// bootAttempt is a boot into discovery in progress: what is done of it
// survives a pass that must wait (a BMC busy with a transition) or fail
// after the power request (a status write), so nothing is sent twice.
type bootAttempt struct {
	iso string // the InfraEnv ISO the host is booted into
	// media is the URL inserted as the virtual CD ("" until it is), with
	// the boot proof of nonce.
	media, nonce string
	// busySince is when the BMC first could not take the power request.
	busySince time.Time
	// sent is when the BMC accepted the power-on or restart.
	sent time.Time
}

// provision boots the host into discovery: the ISO as a virtual CD, or the
// network; then it is provisioned (running the discovery image).
func (h *hostRun) provision(ctx context.Context) (res step) {
	iso, _, err := h.enrollment(ctx)
	if err != nil {
		return failed(metal3.ProvisioningError, err)
	}
	if iso == "" || !h.host.Spec.Online {
		h.setState(metal3.StateAvailable)
		return h.available(ctx)
	}
	mem := h.r.memoryOf(h.host)
	b := mem.boot
	if b == nil || b.iso != iso || !b.sent.IsZero() && h.r.Clock.Since(b.sent) > h.r.PowerTimeout {
		// A new boot: the first, one for another ISO, or one whose
		// power-on went in long ago (the host left and came back).
		b = &bootAttempt{iso: iso}
		mem.boot = b
	}
	defer func() {
		if res.err != nil && b.sent.IsZero() {
			// The BMC failed us before the boot went in (an outage may be
			// its reboot, which drops virtual media): insert again.
			b.media = ""
		}
	}()
	a := h.addr
	if b.sent.IsZero() {
		if !h.power.Settled() {
			// Nothing goes in while the BMC is switching power: it may
			// refuse (409), or the platform may come up before the
			// override is set.
			return h.bootBusy(b, fmt.Errorf("the BMC kept reporting %s", h.power))
		}
		efi := h.host.Spec.BootMode != metal3.BootModeLegacy
		dev := driver.PXE
		if a.VirtualMedia {
			dev = driver.CDROM
			if b.media == "" {
				// Each insert is a new boot, with a proof of its own.
				nonce := signing.NewBootNonce()
				media, err := h.r.withBootProof(iso, h.host, nonce)
				if err != nil {
					return failed(metal3.ProvisioningError, err)
				}
				if err := h.bmc.InsertMedia(ctx, media); err != nil {
					return failed(metal3.ProvisioningError, err)
				}
				b.media, b.nonce = media, nonce
			}
		}
		if err := h.setBoot(ctx, dev, efi); err != nil {
			return failed(metal3.ProvisioningError, err)
		}
		boot := h.bmc.PowerOn
		if h.power.IsOn() {
			boot = h.bmc.Reset
		}
		if err := boot(ctx); errors.Is(err, driver.ErrBusy) {
			return h.bootBusy(b, err) // refused, nothing done: asked again
		} else if err != nil {
			return failed(metal3.PowerManagementError, err)
		}
		// Sent once; the next passes read the power state back rather
		// than send it again while the BMC still reports the old state.
		b.sent = h.r.Clock.Now()
		mem.power = &powerChange{on: true, sent: b.sent, requests: 1}
	}
	if err := h.r.markDiscoveryBoot(ctx, h.host, time.Now(), b.nonce); err != nil {
		return failed(metal3.ProvisioningError, err)
	}
	// mem.boot stays until a pass finds the host provisioned with this
	// ISO: a status write that fails now must not lead to a second boot.
	h.host.Status.Provisioning.Image = metal3.Image{URL: iso, DiskFormat: ptr.To("live-iso")}
	h.host.Status.Provisioning.BootMode = h.host.Spec.BootMode
	if h.host.Status.Provisioning.BootMode == "" {
		h.host.Status.Provisioning.BootMode = metal3.BootModeUEFI
	}
	h.r.Events.Eventf(h.host, nil, corev1.EventTypeNormal, "Provisioned", "BootDiscovery", "booting the discovery image from %s", map[bool]string{true: "virtual media", false: "the network"}[a.VirtualMedia])
	h.setState(metal3.StateProvisioned)
	return poll(h.r.PowerPoll)
}

// bootBusy waits for a BMC busy with a power transition, and makes it an
// error once that lasts longer than PowerTimeout.
func (h *hostRun) bootBusy(b *bootAttempt, why error) step {
	if b.busySince.IsZero() {
		b.busySince = h.r.Clock.Now()
	}
	if waited := h.r.Clock.Since(b.busySince); waited > h.r.PowerTimeout {
		b.busySince = time.Time{}
		return failed(metal3.PowerManagementError, fmt.Errorf("could not boot the host into discovery for %s: %w", waited.Round(time.Second), why))
	}
	return poll(h.r.PowerPoll)
}

// abandonBoot takes out the virtual CD of a boot into discovery that did
// not finish (the host left its InfraEnv, went offline or became
// externally provisioned meanwhile).
func (h *hostRun) abandonBoot(ctx context.Context) error {
	mem := h.r.memoryOf(h.host)
	if mem.boot == nil {
		return nil
	}
	// Whether or not the insert is known to have gone in (an error may
	// have come after it): ejecting nothing is harmless.
	if h.addr.VirtualMedia {
		if err := h.bmc.EjectMedia(ctx); err != nil {
			return err
		}
	}
	mem.boot = nil
	return nil
}

// setBoot sets a one-time boot device and reads it back where the BMC can
// tell: some BMCs accept an override and drop it. A BMC without one-time
// overrides reports it as Continuous; that is accepted (the host boots
// dev until the controller sets the disk) and said in an event. A UEFI
// override read back as Legacy is asked again, then let through with a
// warning: bmclib cannot tell Legacy from a BMC that does not report the
// mode.
func (h *hostRun) setBoot(ctx context.Context, dev driver.Device, efi bool) error {
	for attempt := 1; ; attempt++ {
		if err := h.bmc.SetOneTimeBoot(ctx, dev, efi); err != nil {
			return err
		}
		got, ok, err := h.bmc.BootOverride(ctx)
		if err != nil {
			return err
		}
		modeOK := !ok || !efi || got.UEFI
		if !ok || got.Device == dev && (modeOK || attempt == 3) {
			if !modeOK {
				h.r.Events.Eventf(h.host, nil, corev1.EventTypeWarning, "BootModeNotConfirmed", "SetBoot",
					"the BMC took the one-time boot from %s but reports its mode as Legacy or not at all, although UEFI was asked three times; if the host does not boot the discovery image, check its boot mode (spec.bootMode)", dev)
			}
			if ok && got.Persistent && dev != driver.Disk {
				h.r.Events.Eventf(h.host, nil, corev1.EventTypeNormal, "BootOverrideContinuous", "SetBoot",
					"the BMC keeps the boot from %s for every boot (Continuous); the disk is set as the boot device when the host leaves discovery", dev)
			}
			return nil
		}
		if attempt == 3 {
			return fmt.Errorf("the BMC accepted a one-time boot from %s three times but kept %q", dev, got.Device)
		}
	}
}

// leaveDiscovery takes out what booted the host into discovery: the
// virtual CD (its URL carries the InfraEnv's token), and a boot override
// the BMC keeps for every boot (Continuous), which is pointed at the disk.
func (h *hostRun) leaveDiscovery(ctx context.Context) error {
	if err := h.bmc.EjectMedia(ctx); err != nil {
		return err
	}
	// Best effort: an override bmclib cannot read (a target outside its
	// table, such as UefiTarget) is left as it is.
	if ov, ok, err := h.bmc.BootOverride(ctx); err == nil && ok && ov.Persistent && ov.Device != driver.Disk {
		return h.bmc.SetOneTimeBoot(ctx, driver.Disk, h.host.Spec.BootMode != metal3.BootModeLegacy)
	}
	return nil
}

// provisioned: the host runs discovery, or was installed by it. Once its
// Agent boots from disk, the CD goes and the disk is the next boot; a new
// discovery image reboots hosts not yet installing, and a host released from
// its cluster boots discovery again.
func (h *hostRun) provisioned(ctx context.Context) step {
	iso, wait, err := h.enrollment(ctx)
	if err != nil {
		return failed(metal3.ProvisioningError, err)
	}
	booted := h.host.Status.Provisioning.Image.URL
	mem := h.r.memoryOf(h.host)
	if mem.boot != nil && mem.boot.iso == booted {
		mem.boot = nil // the boot is on record
	}
	if !h.host.Spec.Online || h.power.Settled() && h.power.IsOn() {
		mem.offSince = time.Time{}
	}
	switch {
	case iso == "" && !wait:
		h.setState(metal3.StateDeprovisioning)
		return h.deprovision(ctx)
	case h.agent != nil && lifecycle.Released(h.agent) && booted == "" && iso != "" && h.host.Spec.Online:
		// Released from its cluster while booting its disk: back into
		// discovery, where it re-registers and rejoins the free pool.
		h.r.Events.Eventf(h.host, nil, corev1.EventTypeNormal, "Released", "BootDiscovery", "Agent %s was released from its cluster; rebooting into discovery", h.agent.Name)
		h.setState(metal3.StateProvisioning)
		return h.provision(ctx)
	case h.agent != nil && lifecycle.BootsFromDisk(h.agent):
		if booted != "" {
			if err := h.bmc.EjectMedia(ctx); err != nil {
				return failed(metal3.ProvisioningError, err)
			}
			if err := h.bmc.SetOneTimeBoot(ctx, driver.Disk, h.host.Spec.BootMode != metal3.BootModeLegacy); err != nil {
				return failed(metal3.ProvisioningError, err)
			}
			h.host.Status.Provisioning.Image = metal3.Image{}
		}
	case iso != "" && iso != booted && h.host.Spec.Online && !lifecycle.Occupied(h.agent):
		h.setState(metal3.StateProvisioning)
		return h.provision(ctx)
	case booted != "" && iso != "" && h.host.Spec.Online && h.power.Settled() && !h.power.IsOn() && mem.power == nil &&
		(h.wasOn || !mem.offSince.IsZero()) && h.r.Clock.Since(mem.powerLost) > 5*h.r.PowerTimeout:
		// Reported on by the last pass, now off with no power change of
		// ours under way, while it should be running discovery: it lost
		// power (a cut, a button). Powering it on would boot its default
		// device, which may be a half-written or half-erased disk: it
		// boots discovery again, where it registers anew (an erase cut
		// short starts over; an installation cut short is Failed). Off
		// for less than a power timeout may be a reboot (some servers
		// cut the power in one; the installed disk's boot comes next,
		// which the Agent in the cache may not show yet): look again,
		// holding the power-on meanwhile.
		if mem.offSince.IsZero() {
			mem.offSince = h.r.Clock.Now()
		}
		if h.r.Clock.Since(mem.offSince) < h.r.PowerTimeout {
			return poll(h.r.PowerPoll)
		}
		h.r.Events.Eventf(h.host, nil, corev1.EventTypeWarning, "PowerLost", "BootDiscovery", "the host was found powered off while running discovery; booting the discovery image again")
		mem.offSince, mem.powerLost = time.Time{}, h.r.Clock.Now()
		h.setState(metal3.StateProvisioning)
		return h.provision(ctx)
	}
	return h.enforcePower(ctx)
}

// deprovision: the host left its InfraEnv; take the CD out.
func (h *hostRun) deprovision(ctx context.Context) step {
	if h.host.Status.Provisioning.Image.URL != "" {
		if err := h.leaveDiscovery(ctx); err != nil {
			return failed(metal3.ProvisioningError, err)
		}
	}
	h.host.Status.Provisioning.Image = metal3.Image{}
	h.setState(metal3.StateAvailable)
	return h.enforcePower(ctx)
}

func (h *hostRun) externallyProvisioned(ctx context.Context) step {
	if !h.host.Spec.ExternallyProvisioned {
		h.setState(metal3.StateAvailable)
		return h.available(ctx)
	}
	if err := h.abandonBoot(ctx); err != nil {
		if res := h.enforcePower(ctx); res.err != nil {
			return res
		}
		return failed(metal3.ProvisioningError, fmt.Errorf("eject the virtual media of an abandoned boot: %w", err))
	}
	return h.enforcePower(ctx)
}

// enrollment returns the ISO the host should boot: the discovery ISO of
// the InfraEnv its label names, once that image is ready. wait is true
// while the InfraEnv exists but its image is not ready.
func (h *hostRun) enrollment(ctx context.Context) (iso string, wait bool, err error) {
	name := h.host.Labels[v1beta1.InfraEnvNameLabel]
	if name == "" || h.host.Spec.ExternallyProvisioned {
		return "", false, nil
	}
	ie := &v1beta1.InfraEnv{}
	if err := h.r.Client.Get(ctx, client.ObjectKey{Namespace: h.host.Namespace, Name: name}, ie); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return "", false, fmt.Errorf("InfraEnv %s/%s named by label %s does not exist", h.host.Namespace, name, v1beta1.InfraEnvNameLabel)
		}
		return "", false, err
	}
	if !conditions.IsTrue(ie.Status.Conditions, v1beta1.ImageCreatedCondition) || ie.Status.ISODownloadURL == "" {
		return "", true, nil
	}
	return ie.Status.ISODownloadURL, false, nil
}

// delete forgets the host: it takes its virtual media out of the BMC, and
// powers it off first only when asked to.
func (r *Reconciler) delete(ctx context.Context, host *metal3.BareMetalHost) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(host, Finalizer) {
		return ctrl.Result{}, nil
	}
	_, detached := host.Annotations[DetachedAnnotation]
	if !detached {
		before := host.Status.DeepCopy()
		res := r.ejectForDelete(ctx, host)
		if res.err == nil && host.Annotations[PowerOffOnDeleteAnnotation] == "true" {
			res = r.powerOffForDelete(ctx, host)
		}
		if res.err != nil || res.requeue > 0 {
			if err := r.writeStatus(ctx, host, before, res); err != nil {
				return ctrl.Result{}, err
			}
			res.errCount = host.Status.ErrorCount
			return res.result(r), nil
		}
	}
	controllerutil.RemoveFinalizer(host, Finalizer)
	if err := r.Client.Update(ctx, host); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(host))
	return ctrl.Result{}, nil
}

// ejectForDelete takes the virtual CD out of a virtual media host's BMC:
// its URL carries the InfraEnv's token and, left in, would boot the server
// into discovery again. It is retried with backoff for
// EjectOnDeleteTimeout, then the host is let go with a warning: a BMC that
// is gone for good must not keep a BareMetalHost from being deleted.
func (r *Reconciler) ejectForDelete(ctx context.Context, host *metal3.BareMetalHost) step {
	a, err := address.Parse(host.Spec.BMC.Address)
	if _, done := host.Annotations[ejectedAnnotation]; err != nil || !a.VirtualMedia || done {
		return step{}
	}
	switch host.Status.Provisioning.State {
	case metal3.StateNone, metal3.StateRegistering:
		return step{} // never reached: nothing of ours went in
	}
	res := r.withSession(ctx, host, func(bmc driver.BMC, _ address.Address, _ metal3.ErrorType) step {
		if err := bmc.EjectMedia(ctx); err != nil {
			return failed(metal3.ProvisioningError, fmt.Errorf("eject the virtual media before the host is deleted: %w", err))
		}
		return step{}
	})
	if res.err == nil {
		if host.Status.Provisioning.Image.URL != "" {
			r.Events.Eventf(host, nil, corev1.EventTypeNormal, "MediaEjected", "Delete", "the discovery ISO was ejected from the BMC before the host was deleted")
		}
		return r.markEjected(ctx, host, "true")
	}
	if r.Clock.Since(host.DeletionTimestamp.Time) < r.EjectOnDeleteTimeout {
		return res
	}
	// Marked first, so that a power-off that follows does not try again
	// and the event is said once.
	if mark := r.markEjected(ctx, host, "abandoned"); mark.err != nil {
		return mark
	}
	r.Events.Eventf(host, nil, corev1.EventTypeWarning, "MediaNotEjected", "Delete",
		"the BMC did not eject the virtual media for %s; deleting the host anyway: the BMC may still hold the discovery ISO's URL (%s)",
		r.EjectOnDeleteTimeout, boundMessage(res.err.Error()))
	return step{}
}

// markEjected records the eject (or that it was given up) on the host, so
// a deletion that goes on (a power-off that takes its time) does not eject
// again.
func (r *Reconciler) markEjected(ctx context.Context, host *metal3.BareMetalHost, value string) step {
	patch := client.MergeFromWithOptions(host.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if host.Annotations == nil {
		host.Annotations = map[string]string{}
	}
	host.Annotations[ejectedAnnotation] = value
	if err := r.update(host, func() error { return r.Client.Patch(ctx, host, patch) }); err != nil {
		return failed(metal3.ProvisioningError, fmt.Errorf("record the eject: %w", err))
	}
	return step{}
}

func (r *Reconciler) powerOffForDelete(ctx context.Context, host *metal3.BareMetalHost) step {
	host.Status.Provisioning.State = metal3.StatePoweringOffBeforeDelete
	return r.withBMC(ctx, host, func(bmc driver.BMC, _ address.Address, power driver.Power) step {
		// enforcePower also waits out a power-on still under way (one the
		// BMC accepted but does not report yet), which would otherwise
		// switch the host on after it is forgotten.
		off := *host
		off.Spec.Online = false
		res := (&hostRun{r: r, host: &off, bmc: bmc, power: power}).enforcePower(ctx)
		if res.err == nil && res.requeue == 0 {
			host.Status.Provisioning.State = metal3.StateDeleting
		}
		return res
	})
}

// BootProofLifetime is how long the proof in an inserted ISO holds: enough
// for a slow server's firmware and a retried registration, short enough
// that a proof obtained later (from the BMC, or from an ISO over plain
// HTTP) is worth nothing.
const BootProofLifetime = time.Hour

// withBootProof adds to an InfraEnv's ISO URL the proof, for this host's
// BMC only, that a host booted from it was booted by this BareMetalHost's
// BMC in the boot named nonce: the image service embeds it, the agent
// sends it when it registers.
func (r *Reconciler) withBootProof(iso string, host *metal3.BareMetalHost, nonce string) (string, error) {
	if r.Keys == nil {
		return iso, nil
	}
	key, err := r.Keys.Key()
	if err != nil {
		return "", err
	}
	proof := key.BootProof(host.Namespace, host.Name, string(host.UID), nonce, time.Now().Add(BootProofLifetime))
	if proof == "" {
		return "", fmt.Errorf("no key to sign the boot proof of the inserted ISO with")
	}
	return iso + "&bmh=" + url.QueryEscape(host.Name) + "&proof=" + proof, nil
}

// markDiscoveryBoot records on the host when the controller booted it into
// discovery, and the nonce of that boot's proof (virtual media); only
// metadata is patched, so the status written afterwards does not conflict.
func (r *Reconciler) markDiscoveryBoot(ctx context.Context, host *metal3.BareMetalHost, at time.Time, nonce string) error {
	cp := host.DeepCopy()
	// Optimistic lock: a pass that acted on a host someone else has since
	// changed fails here and looks again, rather than record over it.
	patch := client.MergeFromWithOptions(host.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	cp.Annotations[DiscoveryBootAnnotation] = at.UTC().Format(time.RFC3339Nano)
	if nonce != "" {
		cp.Annotations[signing.BootNonceAnnotation] = nonce
	} else {
		delete(cp.Annotations, signing.BootNonceAnnotation)
	}
	return r.update(host, func() error {
		if err := r.Client.Patch(ctx, cp, patch); err != nil {
			return fmt.Errorf("record the discovery boot: %w", err)
		}
		host.Annotations, host.ResourceVersion = cp.Annotations, cp.ResourceVersion
		return nil
	})
}
