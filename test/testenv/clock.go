package testenv

import (
	"sync"
	"time"
)

// SteppedClock is the wall clock plus the steps a test took
// (k8s.io/utils/clock.PassiveClock). Give it to a component with long
// timers: the short ones run as usual, and the test jumps past a long one
// (a grace period of minutes) when it has checked what must not happen
// before it ends.
type SteppedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the wall clock's time plus the steps taken.
func (c *SteppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Since is the time elapsed since t on this clock.
func (c *SteppedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Step moves the clock forward by d.
func (c *SteppedClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}
