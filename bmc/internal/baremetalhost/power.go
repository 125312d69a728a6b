package baremetalhost

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/driver"
)

// maxPowerRequests is how many times one power request is sent, each after
// the BMC failed to report its effect for PowerTimeout, before the host
// reports an error.
const maxPowerRequests = 3

// memory is what the controller remembers of a host between passes. It is
// lost when the manager restarts; everything in it is an optimisation
// of the number of BMC requests, never a condition of correctness: a new
// manager starts the host's power change or boot over.
type memory struct {
	uid types.UID
	// power is the power change in progress, if any.
	power *powerChange
	// boot is the boot into discovery in progress, if any.
	boot *bootAttempt
	// written are the resourceVersions the host had before the last pass
	// wrote it; seeing one again means the cache is behind.
	written []string
	// offSince is when a host that was on was first found off while it
	// should run discovery: off for less than a power timeout is a
	// reboot's, not a loss. Lost with a restart within that time, the
	// host is then powered on as any host found off.
	offSince time.Time
	// powerLost is when the host was last booted into discovery after a
	// power loss: one that keeps losing it (a failing power supply) is
	// booted so again only five power timeouts later, and powered on as
	// any host found off meanwhile.
	powerLost time.Time
	// counted is the registration session whose time from the boot into
	// discovery was last counted (agentboot_agent_phase_seconds): each
	// session once, again after a restart of the manager at most.
	counted string
}

// memoryOf returns the host's memory, a fresh one for a new UID. Only the
// pass over the host uses it (controller-runtime never reconciles one host
// twice at once), so its fields need no lock.
func (r *Reconciler) memoryOf(host client.Object) *memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := types.NamespacedName{Namespace: host.GetNamespace(), Name: host.GetName()}
	m := r.hosts[key]
	if m == nil || m.uid != host.GetUID() {
		m = &memory{uid: host.GetUID()}
		r.hosts[key] = m
	}
	return m
}

// forget drops what the controller remembers of a host that is gone.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.hosts, key)
}

// powerChange is a power state asked of a BMC and not yet seen in effect.
// One request is sent per wanted state; the controller then reads the
// power state back (polling with backoff) and sends it again only when the
// BMC has not reported the state for PowerTimeout: some BMCs accept a
// request and drop it.
type powerChange struct {
	on bool
	// sent is when the BMC last accepted a request; zero while none was.
	sent time.Time
	// requests counts the requests of the current kind the BMC accepted.
	requests int
	// soft is true while the last request asked the OS to shut down.
	soft bool
	// forced is true once a soft power-off timed out or was refused.
	forced bool
	// busySince is the first ErrBusy answer since the last request went in.
	busySince time.Time
	// polls counts reads since the last request, for the backoff.
	polls int
}

// window is how long the BMC has to reach the state after the request.
func (p *powerChange) window(r *Reconciler) time.Duration {
	if p.soft {
		return r.SoftPowerOffTimeout
	}
	return r.PowerTimeout
}

// enforcePower makes the power state follow spec.online: one request, then
// reading the state back until the BMC reports it.
func (h *hostRun) enforcePower(ctx context.Context) step {
	want := h.host.Spec.Online
	mem := h.r.memoryOf(h.host)
	p := mem.power
	if h.power.Settled() && h.power.IsOn() == want {
		if p != nil && p.on != want && !p.sent.IsZero() && h.r.Clock.Since(p.sent) < p.window(h.r) {
			// spec.online flipped back while the other state's request is
			// under way (an OS shutting down reports on): watch it land,
			// then undo it, rather than wait for the next resync.
			return h.r.pollPower(p)
		}
		mem.power = nil
		return step{}
	}
	if p != nil && p.on != want {
		p = nil // spec.online changed; a new change starts
	}
	if p == nil {
		p = &powerChange{on: want}
		if !h.power.Settled() && (h.power == driver.PoweringOn) == want {
			// Already on its way (asked by someone else, or before a
			// restart of this controller): wait for it.
			p.sent, p.requests = h.r.Clock.Now(), 1
		}
		mem.power = p
	}
	repeat := false
	if !p.sent.IsZero() {
		waited := h.r.Clock.Since(p.sent)
		switch {
		case p.soft && waited < h.r.SoftPowerOffTimeout:
			return h.r.pollPower(p) // the OS is shutting down
		case p.soft:
			p.soft, p.forced, p.requests = false, true, 0
			h.r.Events.Eventf(h.host, nil, corev1.EventTypeWarning, "PowerOffForced", "PowerOff",
				"the OS did not shut down within %s of the graceful shutdown request; forcing the power off", h.r.SoftPowerOffTimeout)
		case waited < h.r.PowerTimeout:
			return h.r.pollPower(p)
		case p.requests >= maxPowerRequests:
			mem.power = nil
			return failed(metal3.PowerManagementError, fmt.Errorf("the BMC accepted %d requests to power %s over %s but still reports %s",
				p.requests, onOff(want), time.Duration(p.requests)*h.r.PowerTimeout, h.power))
		default:
			repeat = true
		}
	}
	return h.sendPower(ctx, mem, p, repeat)
}

// sendPower sends the request p stands for and records it.
func (h *hostRun) sendPower(ctx context.Context, mem *memory, p *powerChange, repeat bool) step {
	want := p.on
	soft := !want && !p.forced
	var err error
	switch {
	case want:
		err = h.bmc.PowerOn(ctx)
	default:
		err = h.bmc.PowerOff(ctx, soft)
	}
	if soft && errors.Is(err, driver.ErrUnsupported) {
		// Some BMCs offer no graceful shutdown (iLO 4 does not list it;
		// IPMI BMCs without ACPI soft-off reject it): cut the power. Any
		// other failure is an error, retried gracefully.
		h.r.Events.Eventf(h.host, nil, corev1.EventTypeWarning, "PowerOffForced", "PowerOff",
			"the BMC refused the graceful shutdown (%s); forcing the power off", boundMessage(err.Error()))
		p.forced, soft = true, false
		err = h.bmc.PowerOff(ctx, false)
	}
	if errors.Is(err, driver.ErrBusy) {
		// Nothing was done: ask again once the transition is over.
		if p.busySince.IsZero() {
			p.busySince = h.r.Clock.Now()
		}
		if h.r.Clock.Since(p.busySince) > h.r.PowerTimeout {
			mem.power = nil
			return failed(metal3.PowerManagementError, fmt.Errorf("the BMC refused to power %s for %s: %w", onOff(want), h.r.PowerTimeout, err))
		}
		return h.r.pollPower(p)
	}
	if err != nil {
		mem.power = nil
		return failed(metal3.PowerManagementError, err)
	}
	if repeat {
		h.r.Events.Eventf(h.host, nil, corev1.EventTypeNormal, "PowerRequestRepeated", "Power",
			"the BMC accepted a request to power %s %s ago but still reported %s; asked again", onOff(want), h.r.Clock.Since(p.sent).Round(time.Second), h.power)
	}
	p.sent, p.soft, p.busySince, p.polls = h.r.Clock.Now(), soft, time.Time{}, 0
	p.requests++
	return h.r.pollPower(p)
}

// pollPower is when to read the power state again: soon after a request,
// then less often, up to PowerPoll.
func (r *Reconciler) pollPower(p *powerChange) step {
	d := r.PowerPoll / 8
	for i := 0; i < p.polls && d < r.PowerPoll; i++ {
		d *= 2
	}
	p.polls++
	return poll(max(min(d, r.PowerPoll), time.Millisecond))
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
