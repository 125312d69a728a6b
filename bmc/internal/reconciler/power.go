package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/driver"
)

// maxPowerRequests is how many times one power request is sent, each after
// the BMC failed to report its effect for PowerTimeout, before the host
// reports an error.
const maxPowerRequests = 3

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
	// forced is true once the grace period of a soft power-off ran out.
	forced bool
	// busySince is the first ErrBusy answer since the last request went in.
	busySince time.Time
	// polls counts reads since the last request, for the backoff.
	polls int
}

func (r *Reconciler) pendingPower(uid types.UID) *powerChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending[uid]
}

func (r *Reconciler) trackPower(uid types.UID, p *powerChange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[uid] = p
}

func (r *Reconciler) forgetPower(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, uid)
}

// sentPower records a request the BMC accepted outside enforcePower (the
// power-on or reset that boots a host into discovery), so the next visits
// wait for it rather than send it again.
func (r *Reconciler) sentPower(uid types.UID, on bool) {
	r.trackPower(uid, &powerChange{on: on, sent: time.Now(), requests: 1})
}

// enforcePower makes the power state follow spec.online: one request, then
// reading the state back until the BMC reports it.
func (h *hostRun) enforcePower(ctx context.Context) step {
	want := h.host.Spec.Online
	uid := h.host.UID
	if h.power.Settled() && h.power.IsOn() == want {
		h.r.forgetPower(uid)
		return step{}
	}
	p := h.r.pendingPower(uid)
	if p != nil && p.on != want {
		p = nil // spec.online changed; a new change starts
	}
	if p == nil {
		p = &powerChange{on: want}
		if !h.power.Settled() && (h.power == driver.PoweringOn) == want {
			// Already on its way (asked by someone else, or before a
			// restart of this controller): wait for it.
			p.sent, p.requests = time.Now(), 1
		}
		h.r.trackPower(uid, p)
	}
	if !p.sent.IsZero() {
		waited := time.Since(p.sent)
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
			h.r.forgetPower(uid)
			return failed(metal3.PowerManagementError, fmt.Errorf("the BMC accepted %d requests to power %s over %s but still reports %s",
				p.requests, onOff(want), time.Duration(p.requests)*h.r.PowerTimeout, h.power))
		default:
			h.r.Events.Eventf(h.host, nil, corev1.EventTypeNormal, "PowerRequestRepeated", "Power",
				"the BMC accepted a request to power %s %s ago but still reports %s; asking again", onOff(want), waited.Round(time.Second), h.power)
		}
	}
	soft := !want && !p.forced
	var err error
	switch {
	case want:
		err = h.bmc.PowerOn(ctx)
	default:
		err = h.bmc.PowerOff(ctx, soft)
	}
	if errors.Is(err, driver.ErrBusy) {
		// Nothing was done: ask again once the transition is over.
		if p.busySince.IsZero() {
			p.busySince = time.Now()
		}
		if time.Since(p.busySince) > h.r.PowerTimeout {
			h.r.forgetPower(uid)
			return failed(metal3.PowerManagementError, fmt.Errorf("the BMC refused to power %s for %s: %w", onOff(want), h.r.PowerTimeout, err))
		}
		return h.r.pollPower(p)
	}
	if err != nil {
		h.r.forgetPower(uid)
		return failed(metal3.PowerManagementError, err)
	}
	p.sent, p.soft, p.busySince, p.polls = time.Now(), soft, time.Time{}, 0
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
