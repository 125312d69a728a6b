// Package gate bounds the requests of a kind a service has in flight,
// shared fairly between tenants, and turns the rest away with a time to
// come back that spreads them at the rate the service serves.
//
// When a rack or a site powers on at once, more hosts arrive than a
// service can serve well at once: the agent API's registrations wait in
// line at the apiserver (25 s at the 99th percentile with 250 arrivals a
// second on two cores, make bench-agents), the image service's initrds
// share one link. Instead, a request waits at most the gate's wait for one
// of its slots and is otherwise refused with a Retry-After that schedules
// its return: each refusal takes the next free turn at the rate the gate
// serves requests (its slots over the time a request holds one, as
// measured), so the refused come back spread at what the service takes,
// not all in the same second. The gate is shared fairly between keys
// (InfraEnvs, which may be different tenants'): one key holds at most its
// share of the slots, and each key's refused get turns of their own, so a
// storm of one tenant's hosts (or a holder of its token) neither takes
// every slot nor pushes other tenants' turns back.
package gate

import (
	"context"
	"sync"
	"time"
)

// Gate is a set of slots shared between keys; a nil Gate admits every
// request.
type Gate struct {
	slots chan struct{}
	share int // the most slots one key holds
	wait  time.Duration
	now   func() time.Time

	mu sync.Mutex
	// held is the moving average of how long a request holds a slot.
	held time.Duration
	// holding counts the slots each key holds, and next is the turn
	// the next refused request of each is given.
	holding map[string]int
	next    map[string]time.Time
}

// MaxRetryAfter is the latest turn given: past it, a client's own backoff
// spreads it anyway.
const MaxRetryAfter = 2 * time.Minute

// New is a gate of slots (none: nil, no gate), of which one key holds at
// most share (at least 1), where a request waits at most wait for a slot.
func New(slots, share int, wait time.Duration, now func() time.Time) *Gate {
	if slots <= 0 {
		return nil
	}
	// Until a request was served, one that was refused held its slot
	// for the whole wait at least.
	return &Gate{slots: make(chan struct{}, slots), share: min(max(share, 1), slots), wait: wait, now: now, held: wait,
		holding: map[string]int{}, next: map[string]time.Time{}}
}

// Refused says why the gate turned a request away, and when it should
// come again.
type Refused struct {
	RetryAfter time.Duration
	// Share: its key held its share of the slots; otherwise every slot
	// was taken for the whole wait.
	Share bool
}

// Enter takes a slot for a request of key, waiting at most the gate's
// wait. It returns the function that gives the slot back, or why it was
// refused.
func (g *Gate) Enter(ctx context.Context, key string) (leave func(), refused *Refused) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	if g.holding[key] >= g.share {
		g.mu.Unlock()
		return nil, &Refused{RetryAfter: g.turn(key), Share: true}
	}
	g.holding[key]++
	g.mu.Unlock()
	select {
	case g.slots <- struct{}{}:
		return g.entered(key), nil
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.entered(key), nil
	case <-ctx.Done():
		g.release(key)
		return nil, &Refused{RetryAfter: time.Second}
	case <-t.C:
		g.release(key)
		return nil, &Refused{RetryAfter: g.turn(key)}
	}
}

// release gives back key's claim on its share.
func (g *Gate) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holding[key]--; g.holding[key] <= 0 {
		delete(g.holding, key)
	}
}

// entered is the leave of a request that took a slot now.
func (g *Gate) entered(key string) func() {
	start := g.now()
	return func() {
		<-g.slots
		g.release(key)
		d := g.now().Sub(start)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.held += (d - g.held) / 8
	}
}

// turn gives a refused request of key the next free turn of that
// key: the slots free up at slots/held a second, shared by the
// keys waiting (one alone gets at most its share), never sooner than
// a second from now nor later than MaxRetryAfter. A queue of turns never
// runs further ahead than that either, so a burst long over leaves no
// two-minute turns behind.
func (g *Gate) turn(key string) time.Duration {
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
	next := g.next[key]
	if next.Before(now) {
		next = now
		waiting++ // this one
	}
	step := max(g.held*time.Duration(waiting)/time.Duration(cap(g.slots)), g.held/time.Duration(g.share))
	next = next.Add(step)
	if limit := now.Add(MaxRetryAfter); next.After(limit) {
		next = limit
	}
	g.next[key] = next
	return max(next.Sub(now), time.Second)
}

// Seconds is RetryAfter in whole seconds, rounded up, as Retry-After
// carries it.
func (r *Refused) Seconds() int {
	return int((r.RetryAfter + time.Second - 1) / time.Second)
}
