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
// another host's registration. The gate is shared fairly between
// InfraEnvs, which may be different tenants': one InfraEnv holds at most
// half the slots, and each InfraEnv's refused get turns of their own, so a
// storm of one tenant's hosts (or a holder of its registration token)
// neither takes every slot nor pushes other tenants' turns back.
type gate struct {
	slots chan struct{}
	share int // the most slots one InfraEnv holds
	wait  time.Duration
	now   func() time.Time

	mu sync.Mutex
	// held is the moving average of how long a request holds a slot.
	held time.Duration
	// holding counts the slots each InfraEnv holds, and next is the turn
	// the next refused request of each is given.
	holding map[string]int
	next    map[string]time.Time
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
	return &gate{slots: make(chan struct{}, slots), share: max(slots/2, 1), wait: gateWait, now: now, held: gateWait,
		holding: map[string]int{}, next: map[string]time.Time{}}
}

// enter takes a slot for a request of InfraEnv infraEnv, waiting at most
// g.wait. It returns the function that gives the slot back, or, refused,
// when the request should come again.
func (g *gate) enter(ctx context.Context, infraEnv string) (leave func(), retry time.Duration) {
	if g == nil {
		return func() {}, 0
	}
	g.mu.Lock()
	if g.holding[infraEnv] >= g.share {
		g.mu.Unlock()
		return nil, g.turn(infraEnv)
	}
	g.holding[infraEnv]++
	g.mu.Unlock()
	select {
	case g.slots <- struct{}{}:
		return g.entered(infraEnv), 0
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.entered(infraEnv), 0
	case <-ctx.Done():
		g.release(infraEnv)
		return nil, time.Second
	case <-t.C:
		g.release(infraEnv)
		return nil, g.turn(infraEnv)
	}
}

// release gives back infraEnv's claim on its share.
func (g *gate) release(infraEnv string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holding[infraEnv]--; g.holding[infraEnv] <= 0 {
		delete(g.holding, infraEnv)
	}
}

// entered is the leave of a request that took a slot now.
func (g *gate) entered(infraEnv string) func() {
	start := g.now()
	return func() {
		<-g.slots
		g.release(infraEnv)
		d := g.now().Sub(start)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.held += (d - g.held) / 8
	}
}

// turn gives a refused request of infraEnv the next free turn of that
// InfraEnv: the slots free up at slots/held a second, shared by the
// InfraEnvs waiting (one alone gets at most its share), never sooner than
// a second from now nor later than maxRetryAfter. A queue of turns never
// runs further ahead than that either, so a burst long over leaves no
// two-minute turns behind.
func (g *gate) turn(infraEnv string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	waiting := 0
	for k, t := range g.next {
		switch {
		case t.After(now):
			waiting++
		case len(g.next) > 1024:
			delete(g.next, k)
		}
	}
	next := g.next[infraEnv]
	if next.Before(now) {
		next = now
		waiting++ // this one
	}
	step := max(g.held*time.Duration(waiting)/time.Duration(cap(g.slots)), g.held/time.Duration(g.share))
	next = next.Add(step)
	if limit := now.Add(maxRetryAfter); next.After(limit) {
		next = limit
	}
	g.next[infraEnv] = next
	return max(next.Sub(now), time.Second)
}

// busy answers a request the gate refused.
func busy(w http.ResponseWriter, retry time.Duration) {
	secs := int((retry + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, "Busy", "the agent API is serving as many registrations and inventories as the apiserver takes; retry in %ds", secs)
}
