package hostapi

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// gate bounds the registrations and inventory uploads the agent API has in
// flight, and so how long the ones it serves take. When a rack or a site
// powers on at once, more hosts arrive than the apiserver can take writes
// from; served all at once, every one of them waits in line at the
// apiserver (25 s at the 99th percentile with 250 arrivals a second on two
// cores, make bench-agents). Instead, a request waits at most gateWait for
// one of the gate's slots and is otherwise refused with 429 and a
// Retry-After that schedules its return: each refusal takes the next free
// turn at the rate the gate serves requests (its slots over the time a
// request holds one, as measured), so the refused come back spread at what
// the apiserver takes, not all in the same second.
// Heartbeats do not pass the gate: a host's liveness never waits on
// another host's registration.
type gate struct {
	slots chan struct{}
	wait  time.Duration
	now   func() time.Time

	mu sync.Mutex
	// held is the moving average of how long a request holds a slot.
	held time.Duration
	// next is the turn the next refused request is given.
	next time.Time
}

const (
	// gateWait is the longest a request waits for a slot: with the
	// service time of a write under load, what a host waits stays well
	// under a second.
	gateWait = 250 * time.Millisecond
	// maxRetryAfter is the latest turn given: past it, the host's own
	// backoff spreads it anyway.
	maxRetryAfter = 2 * time.Minute
)

func newGate(slots int, now func() time.Time) *gate {
	if slots <= 0 {
		return nil
	}
	// Until a request was served, one that was refused held its slot
	// for the whole wait at least.
	return &gate{slots: make(chan struct{}, slots), wait: gateWait, now: now, held: gateWait}
}

// enter takes a slot, waiting at most g.wait. It returns the function that
// gives the slot back, or, refused, when the request should come again.
func (g *gate) enter(ctx context.Context) (leave func(), retry time.Duration) {
	if g == nil {
		return func() {}, 0
	}
	select {
	case g.slots <- struct{}{}:
		return g.entered(), 0
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.entered(), 0
	case <-ctx.Done():
		return nil, time.Second
	case <-t.C:
		return nil, g.turn()
	}
}

// entered is the leave of a request that took a slot now.
func (g *gate) entered() func() {
	start := g.now()
	return func() {
		<-g.slots
		d := g.now().Sub(start)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.held += (d - g.held) / 8
	}
}

// turn gives a refused request the next free turn, one per slot freed at
// the rate the slots free up, never sooner than a second from now.
func (g *gate) turn() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.next.Before(now) {
		g.next = now
	}
	g.next = g.next.Add(g.held / time.Duration(cap(g.slots)))
	d := max(g.next.Sub(now), time.Second)
	return min(d, maxRetryAfter)
}

// busy answers a request the gate refused.
func busy(w http.ResponseWriter, retry time.Duration) {
	secs := int((retry + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, "Busy", "the agent API is serving as many registrations and inventories as the apiserver takes; retry in %ds", secs)
}
