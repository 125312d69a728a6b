package bmcsim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Span is a range of durations; each transition draws one uniformly.
type Span struct{ Min, Max time.Duration }

func (s Span) draw() time.Duration {
	if s.Max <= s.Min {
		return s.Min
	}
	return s.Min + rand.N(s.Max-s.Min)
}

// Timing makes a simulated BMC's power behave like hardware's. The zero
// Timing is an ideal BMC: every change takes effect before its answer.
type Timing struct {
	// PowerOn and PowerOff are how long the platform takes to change
	// power state after the BMC accepted a request (real servers: 1–11 s).
	PowerOn, PowerOff Span
	// Shutdown is how long the OS takes to shut down after a graceful
	// request; the power-off transition follows it.
	Shutdown Span
	// HungOS makes graceful shutdowns never complete: only a forced
	// power-off stops the host.
	HungOS bool
	// Transitional reports PoweringOn and PoweringOff during transitions
	// (as iDRAC and iLO do); otherwise the old state is reported until the
	// new one is reached.
	Transitional bool
	// Conflict refuses a request for another state while a transition is
	// in progress (Redfish 409; IPMI: the chassis program fails, which
	// ipmi_sim answers with an error completion code); otherwise the new
	// request replaces the transition.
	Conflict bool
	// EarlyOff is the quirk Digital Rebar documents for Redfish BMCs
	// (ipmi/power-confirm-timeout): Off is reported as soon as a power-off
	// is accepted while the platform still shuts down, and a power-on sent
	// in that window is accepted and dropped.
	EarlyOff bool
	// Latency holds every Redfish answer this long (BMCs answer in
	// 100 ms to seconds).
	Latency Span
}

// Realistic is a BMC as field reports describe real servers': answers in
// 0.1–0.6 s, power transitions of 1–11 s, an OS taking 2–10 s to shut
// down, requests for another state refused (409) during a transition.
var Realistic = Timing{
	Latency:  Span{Min: 100 * time.Millisecond, Max: 600 * time.Millisecond},
	PowerOn:  Span{Min: time.Second, Max: 11 * time.Second},
	PowerOff: Span{Min: time.Second, Max: 11 * time.Second},
	Shutdown: Span{Min: 2 * time.Second, Max: 10 * time.Second},
	Conflict: true,
}

// Power states as Redfish reports them.
const (
	On          = "On"
	Off         = "Off"
	PoweringOn  = "PoweringOn"
	PoweringOff = "PoweringOff"
)

// ErrBusy is a request refused because a transition is in progress.
var ErrBusy = errors.New("a power transition is in progress")

// Clock is the time simulated hardware keeps (k8s.io/utils/clock's
// RealClock, or a test's testenv.ManualClock).
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) clock.Timer
}

// chassis is the power of a Machine with a Timing: what a BMC requests
// and what it reports. Both simulators drive their Machine through one.
type chassis struct {
	m Machine

	mu     sync.Mutex
	timing Timing
	// target is the state a transition in progress ends in ("" when none);
	// until is when it does.
	target   string
	until    time.Time
	timer    clock.Timer
	clock    Clock
	shutdown bool // the transition is the OS shutting down first
	boot     func() (dev, cdrom string)
	// held keeps transitions from ending; due is set when one would have.
	held, due bool
	// note records what the platform did ("power off", "power on dropped");
	// it is called with mu held.
	note func(string)
}

func (c *chassis) latency() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timing.Latency.draw()
}

func (c *chassis) setTiming(t Timing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timing = t
}

// state reports the power state as the BMC would.
func (c *chassis) state() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	on := c.m.On()
	if c.target == "" {
		return onOff(on)
	}
	if c.target == Off && c.timing.EarlyOff {
		return Off
	}
	if c.timing.Transitional && !c.shutdown {
		if c.target == On {
			return PoweringOn
		}
		return PoweringOff
	}
	return onOff(on)
}

func onOff(on bool) string {
	if on {
		return On
	}
	return Off
}

// powerOn starts the machine; boot is read when the platform comes up,
// so a boot override set during the transition applies, as on hardware.
// dropped is true when the request was accepted and ignored (EarlyOff).
func (c *chassis) powerOn(boot func() (dev, cdrom string)) (dropped bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.target == On:
		return false, nil
	case c.target == Off && c.timing.EarlyOff:
		c.note("power on dropped")
		return true, nil
	case c.target == Off && c.timing.Conflict:
		return false, ErrBusy
	case c.target == "" && c.m.On():
		return false, nil
	}
	c.begin(On, c.timing.PowerOn.draw(), false)
	c.boot = boot
	if c.until.IsZero() {
		return false, c.finish()
	}
	return false, nil
}

// powerOff stops the machine: graceful asks the OS first.
func (c *chassis) powerOff(graceful bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.target == Off && (graceful || !c.shutdown):
		return nil // already going
	case c.target == On && c.timing.Conflict:
		return ErrBusy
	case c.target == "" && !c.m.On():
		return nil
	}
	d := c.timing.PowerOff.draw()
	if graceful {
		if c.timing.HungOS {
			c.begin(Off, -1, true)
			return nil
		}
		d += c.timing.Shutdown.draw()
	}
	c.begin(Off, d, graceful)
	if c.until.IsZero() {
		return c.finish()
	}
	return nil
}

// restart forces the machine off and on again; it needs a running host.
func (c *chassis) restart(boot func() (dev, cdrom string)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != "" {
		if c.timing.Conflict {
			return ErrBusy
		}
	} else if !c.m.On() {
		return fmt.Errorf("Command not supported in present state: Off")
	}
	c.note("power off")
	if err := c.m.PowerOff(); err != nil {
		return err
	}
	c.begin(On, c.timing.PowerOn.draw(), false)
	c.boot = boot
	if c.until.IsZero() {
		return c.finish()
	}
	return nil
}

// begin starts a transition to target lasting d (d < 0: never ends; 0:
// the caller finishes it at once). Callers hold mu.
func (c *chassis) begin(target string, d time.Duration, shutdown bool) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.target, c.shutdown, c.until, c.due = target, shutdown, time.Time{}, false
	switch {
	case d < 0:
		c.until = c.clock.Now().Add(100 * 365 * 24 * time.Hour)
	case d > 0:
		c.until = c.clock.Now().Add(d)
		c.timer = c.clock.AfterFunc(d, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.target == target && !c.until.After(c.clock.Now()) {
				if c.held {
					c.due = true
					return
				}
				_ = c.finish()
			}
		})
	}
}

// finish ends the transition in progress. Callers hold mu.
func (c *chassis) finish() error {
	target, boot := c.target, c.boot
	c.target, c.until, c.timer, c.shutdown, c.boot, c.due = "", time.Time{}, nil, false, nil, false
	if target == Off {
		c.note("power off")
		return c.m.PowerOff()
	}
	dev, cdrom := BootDefault, ""
	if boot != nil {
		dev, cdrom = boot()
	}
	return c.m.PowerOn(dev, cdrom)
}

// hold keeps transitions that take time from ending until released, so a
// test can act inside one whatever the machine's load.
func (c *chassis) hold(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = on
	if !on && c.due {
		c.due = false
		if c.target != "" {
			_ = c.finish()
		}
	}
}

// close stops a transition in progress where it stands.
func (c *chassis) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}
