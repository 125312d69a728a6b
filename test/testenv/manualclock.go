package testenv

import (
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ManualClock is time that moves only when the test steps it: Now, and
// AfterFunc callbacks, which Step runs in order, on the test's goroutine,
// once their time has come (with no lock held, so a callback may read the
// clock). For simulators whose timing a test checks exactly: "not before
// 2 s" is a step of 1.9 s, then of 0.1 s, not two sleeps.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	pending []*manualTimer
}

// NewManualClock starts at a fixed time.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now is the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since is the clock's time elapsed since t.
func (c *ManualClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// AfterFunc runs f when a Step reaches d from now.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(max(d, 0)), f: f}
	c.pending = append(c.pending, t)
	return t
}

// Step moves the clock forward by d, running the callbacks that come due,
// earliest first, each at its own time.
func (c *ManualClock) Step(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.pending, func(i, j int) bool { return c.pending[i].at.Before(c.pending[j].at) })
		if len(c.pending) == 0 || c.pending[0].at.After(end) {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.pending[0]
		c.pending = c.pending[1:]
		c.now = t.at
		c.mu.Unlock()
		t.f()
	}
}

type manualTimer struct {
	c  *ManualClock
	at time.Time
	f  func()
}

func (t *manualTimer) C() <-chan time.Time { return nil }

// Stop cancels the callback; it says whether it was still pending.
func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, p := range t.c.pending {
		if p == t {
			t.c.pending = append(t.c.pending[:i], t.c.pending[i+1:]...)
			return true
		}
	}
	return false
}

// Reset runs the callback d from the clock's now instead.
func (t *manualTimer) Reset(d time.Duration) bool {
	was := t.Stop()
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at = t.c.now.Add(max(d, 0))
	t.c.pending = append(t.c.pending, t)
	return was
}
