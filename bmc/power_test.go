package bmc_test

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/test/bmcsim"
	"github.com/agentboot/agentboot/test/testenv"
)

// hardware is a BMC whose power takes time as a real server's does (scaled
// down: the controller's timeouts in fast are too), which reports the old
// state until the new one is reached and refuses requests meanwhile.
var hardware = bmcsim.Timing{
	PowerOn:  bmcsim.Span{Min: 300 * time.Millisecond, Max: 1200 * time.Millisecond},
	PowerOff: bmcsim.Span{Min: 300 * time.Millisecond, Max: 1200 * time.Millisecond},
	Shutdown: bmcsim.Span{Min: 500 * time.Millisecond, Max: 1500 * time.Millisecond},
	Conflict: true,
}

// count is how many of events equal ev.
func count(events []string, ev string) int {
	n := 0
	for _, e := range events {
		if e == ev {
			n++
		}
	}
	return n
}

// neverFailed checks, while the test runs, that the host never shows an
// error: with a well-behaved BMC that is only slow, none is due.
func neverFailed(t *testing.T, e *env, h *metal3.BareMetalHost) {
	stop := make(chan struct{})
	done := make(chan string, 1)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			got := &metal3.BareMetalHost{}
			if e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got) == nil && got.Status.ErrorType != "" {
				done <- got.Status.ErrorMessage
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		if msg, ok := <-done; ok {
			t.Errorf("host %s showed an error with a slow but healthy BMC: %s", h.Name, msg)
		}
	})
}

func events(t *testing.T, e *env, name, reason string) []eventsv1.Event {
	var evs eventsv1.EventList
	require.NoError(t, e.Client.List(context.Background(), &evs, client.InNamespace(e.ns)))
	var out []eventsv1.Event
	for _, ev := range evs.Items {
		if ev.Regarding.Name == name && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

func waitEvent(t *testing.T, e *env, name, reason, sub string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	require.Eventually(t, func() bool {
		i := slices.IndexFunc(events(t, e, name, reason), func(ev eventsv1.Event) bool { return strings.Contains(ev.Note, sub) })
		if i >= 0 {
			found = events(t, e, name, reason)[i]
		}
		return i >= 0
	}, 30*time.Second, 100*time.Millisecond, "no %s event on %s mentioning %q", reason, name, sub)
	return found
}

func setOnline(t *testing.T, e *env, h *metal3.BareMetalHost, online bool) {
	t.Helper()
	require.NoError(t, retryConflict(func() error {
		got := &metal3.BareMetalHost{}
		if err := e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got); err != nil {
			return err
		}
		got.Spec.Online = online
		return e.Client.Update(context.Background(), got)
	}))
}

// leaveInfraEnv takes the host out of its InfraEnv (drops its labels).
func leaveInfraEnv(t *testing.T, e *env, h *metal3.BareMetalHost) {
	t.Helper()
	require.NoError(t, retryConflict(func() error {
		got := &metal3.BareMetalHost{}
		if err := e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got); err != nil {
			return err
		}
		got.Labels = nil
		return e.Client.Update(context.Background(), got)
	}))
}

func retryConflict(f func() error) error { return retry.RetryOnConflict(retry.DefaultRetry, f) }

func TestPowerLikeHardware(t *testing.T) {
	// The grace periods are long, as in production, on a clock the test
	// steps past them once it checked that nothing was done before.
	clock := &testenv.SteppedClock{}
	powerCfg := fast
	powerCfg.SoftPowerOffTimeout, powerCfg.EjectOnDeleteTimeout, powerCfg.Clock = 10*time.Minute, 10*time.Minute, clock
	e := startWith(t, powerCfg, true)

	// First: its window begins at the apiserver's deletionTimestamp, which
	// knows nothing of the steps later subtests take.
	t.Run("deletion with the BMC gone lets go after a while, saying so", func(t *testing.T) {
		sim, _, hostport := redfish(t)
		h := e.host("gone", "redfish-virtualmedia+http://"+hostport, 76)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		sim.SetFaults(bmcsim.Faults{Unreachable: true})
		require.NoError(t, e.Client.Delete(context.Background(), h))
		// Tried, and held, until the timeout is over.
		e.passes.Await(t, e.passes.Mark(client.ObjectKeyFromObject(h)), 3)
		require.NoError(t, e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), &metal3.BareMetalHost{}), "let go before the eject timeout")
		clock.Step(powerCfg.EjectOnDeleteTimeout)
		waitGone(t, e, h)
		ev := waitEvent(t, e, h.Name, "MediaNotEjected", "may still hold the discovery ISO")
		require.Equal(t, corev1.EventTypeWarning, ev.Type)
		require.NotEmpty(t, sim.Image())
	})

	t.Run("one request per state, graceful power-off", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		sim.SetTiming(hardware)
		h := e.host("slow", "redfish-virtualmedia+http://"+hostport, 70)
		neverFailed(t, e, h)
		e.wait(h, "provisioned and on", func(h *metal3.BareMetalHost) bool {
			return h.Status.Provisioning.State == metal3.StateProvisioned && h.Status.PoweredOn
		})
		require.True(t, m.On())
		require.Equal(t, 1, count(sim.Events(), "request On"), "power-on sent more than once: %q", sim.Events())

		setOnline(t, e, h, false)
		e.wait(h, "powered off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
		require.False(t, m.On())
		evs := sim.Events()
		require.Equal(t, 1, count(evs, "request GracefulShutdown"), "%q", evs)
		require.Zero(t, count(evs, "request ForceOff"), "the OS shut down in time, yet the power was cut: %q", evs)
		require.Empty(t, events(t, e, h.Name, "PowerOffForced"))

		// Back on; still one request.
		setOnline(t, e, h, true)
		e.wait(h, "powered on", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })
		e.settle(t, h)
		require.Equal(t, 2, count(sim.Events(), "request On"), "%q", sim.Events())
	})

	t.Run("hung OS forced off after the grace period", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("hung", "redfish+http://"+hostport, 71)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		hung := hardware
		hung.HungOS = true
		sim.SetTiming(hung)
		neverFailed(t, e, h)
		setOnline(t, e, h, false)
		waitEvents(t, sim.Events, "request GracefulShutdown")
		e.settle(t, h)
		require.Zero(t, count(sim.Events(), "request ForceOff"), "forced before the grace period ended: %q", sim.Events())
		require.True(t, m.On())
		clock.Step(powerCfg.SoftPowerOffTimeout)
		ev := waitEvent(t, e, h.Name, "PowerOffForced", "the OS did not shut down within 10m0s")
		require.Equal(t, corev1.EventTypeWarning, ev.Type)
		e.wait(h, "powered off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
		require.False(t, m.On())
		evs := sim.Events()
		require.Equal(t, 1, count(evs, "request GracefulShutdown"), "%q", evs)
		require.Equal(t, 1, count(evs, "request ForceOff"), "%q", evs)
		require.Less(t, slices.Index(evs, "request GracefulShutdown"), slices.Index(evs, "request ForceOff"))
	})

	t.Run("busy BMC asked again after its transition", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("busy", "redfish+http://"+hostport, 72)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		require.True(t, m.On())
		slow := hardware
		slow.Transitional = true
		sim.SetTiming(slow)
		neverFailed(t, e, h)
		// Someone else restarts the host through the BMC; while it comes
		// up (held until the controller met the busy BMC), the host is to
		// be powered off.
		sim.HoldTransitions(true)
		resetSim(t, hostport, "ForceRestart")
		require.Equal(t, bmcsim.PoweringOn, sim.PowerState())
		setOnline(t, e, h, false)
		waitEvents(t, sim.Events, "refused GracefulShutdown")
		sim.HoldTransitions(false)
		e.wait(h, "powered off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn && sim.PowerState() == bmcsim.Off })
		evs := sim.Events()
		require.Zero(t, count(evs, "request ForceOff"), "%q", evs)
	})

	t.Run("power-on dropped in the early-off window is sent again", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("early", "redfish+http://"+hostport, 73)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		sim.SetTiming(bmcsim.Timing{EarlyOff: true, PowerOff: bmcsim.Span{Min: time.Second, Max: time.Second}})
		neverFailed(t, e, h)
		// The platform shuts down until the test lets it: the power-on
		// lands in the window.
		sim.HoldTransitions(true)
		setOnline(t, e, h, false)
		e.wait(h, "reported off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
		setOnline(t, e, h, true)
		waitEvents(t, sim.Events, "request GracefulShutdown", "request On", "power on dropped")
		sim.HoldTransitions(false)
		waitEvents(t, sim.Events, "power on dropped", "power off", "request On", "power on default")
		waitEvent(t, e, h.Name, "PowerRequestRepeated", "the BMC accepted a request to power on")
		e.wait(h, "on again", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })
		require.True(t, m.On())
	})

	t.Run("continuous boot override pointed at the disk when leaving discovery", func(t *testing.T) {
		sim, _, hostport := redfish(t)
		sim.SetQuirks(bmcsim.Quirks{OnceAsContinuous: true})
		h := e.host("continuous", "redfish-virtualmedia+http://"+hostport, 74)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		waitEvents(t, sim.Events, "boot-override Cd Continuous", "power on cdrom")
		waitEvent(t, e, h.Name, "BootOverrideContinuous", "for every boot (Continuous)")
		// The host leaves its InfraEnv: the CD goes, the disk is the boot.
		leaveInfraEnv(t, e, h)
		waitEvents(t, sim.Events, "power on cdrom", "eject", "boot-override Hdd Continuous")
		e.wait(h, "available", state(metal3.StateAvailable))
		require.Empty(t, sim.Image())
	})

	t.Run("BMC that accepts and ignores power requests", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("deaf", "redfish+http://"+hostport, 80)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		sim.SetFaults(bmcsim.Faults{IgnorePower: true})
		setOnline(t, e, h, false)
		// Asked gracefully, forced after the grace period, forced again
		// after each power timeout: then a specific error, never silence.
		waitEvents(t, sim.Events, "ignored GracefulShutdown")
		clock.Step(powerCfg.SoftPowerOffTimeout)
		got := e.wait(h, "reporting the ignored requests", errorContains(metal3.PowerManagementError, "the BMC accepted 3 requests to power off over 9s but still reports on"))
		require.True(t, got.Status.PoweredOn)
		require.True(t, m.On())
		evs := sim.Events()
		require.GreaterOrEqual(t, count(evs, "ignored ForceOff"), 3, "%q", evs)
		require.Less(t, slices.Index(evs, "ignored GracefulShutdown"), slices.Index(evs, "ignored ForceOff"), "%q", evs)
		// The BMC behaves again: the host recovers by itself.
		sim.SetFaults(bmcsim.Faults{})
		e.wait(h, "off, recovered", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn && h.Status.ErrorType == "" })
		require.False(t, m.On())
	})

	// The vendor quirks users report most (docs/bmc.md).
	t.Run("iDRAC refuses a power-on right after a power-off", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("idrac", "redfish+http://"+hostport, 77)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		sim.SetTiming(hardware)
		// A window shorter than the controller's resync (2s): only the
		// controller watching the shutdown land powers on inside it.
		sim.SetQuirks(bmcsim.Quirks{IDRACPowerOnConflict: time.Second})
		neverFailed(t, e, h)
		// online flips back while the OS shuts down (held): the controller
		// watches the shutdown land, then powers on at once, into the
		// iDRAC's refusal window.
		sim.HoldTransitions(true)
		setOnline(t, e, h, false)
		waitEvents(t, sim.Events, "request GracefulShutdown")
		setOnline(t, e, h, true)
		e.settle(t, h) // it has seen online: true while the shutdown is held
		sim.HoldTransitions(false)
		waitEvents(t, sim.Events, "power off", "request On", "refused On", "request On", "power on default")
		e.wait(h, "on again", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })
		require.True(t, m.On())
	})

	t.Run("iLO 4 has no graceful shutdown", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		sim.SetQuirks(bmcsim.Quirks{NoGracefulShutdown: true})
		h := e.host("ilo4", "redfish+http://"+hostport, 81)
		e.wait(h, "provisioned and on", func(h *metal3.BareMetalHost) bool {
			return h.Status.Provisioning.State == metal3.StateProvisioned && h.Status.PoweredOn
		})
		neverFailed(t, e, h)
		setOnline(t, e, h, false)
		e.wait(h, "off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
		require.False(t, m.On())
		waitEvent(t, e, h.Name, "PowerOffForced", "the BMC refused the graceful shutdown")
		require.Equal(t, 1, count(sim.Events(), "request ForceOff"), "%q", sim.Events())
	})

	t.Run("Supermicro keeps only the target of a partial boot PATCH", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		sim.SetQuirks(bmcsim.Quirks{SupermicroBootPatch: true})
		h := e.host("supermicro", "redfish-virtualmedia+http://"+hostport, 78)
		neverFailed(t, e, h)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		waitEvents(t, sim.Events, "boot-override Cd Once", "power on cdrom")
		require.True(t, strings.HasPrefix(m.Boots()[0], "cdrom "), "the host did not boot the CD: %q", m.Boots())
	})

	t.Run("iLO media actions", func(t *testing.T) {
		sim, _, hostport := redfish(t)
		sim.SetQuirks(bmcsim.Quirks{ILOMedia: true})
		h := e.host("ilo", "redfish-virtualmedia+http://"+hostport, 79)
		neverFailed(t, e, h)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		leaveInfraEnv(t, e, h)
		e.wait(h, "available", state(metal3.StateAvailable))
		require.Empty(t, sim.Image())
		require.NoError(t, e.Client.Delete(context.Background(), h))
		waitGone(t, e, h)
		require.Equal(t, 1, count(sim.Events(), "eject"), "%q", sim.Events())
	})

	t.Run("deletion ejects the media", func(t *testing.T) {
		sim, m, hostport := redfish(t)
		h := e.host("forget", "redfish-virtualmedia+http://"+hostport, 75)
		e.wait(h, "provisioned", state(metal3.StateProvisioned))
		require.NotEmpty(t, sim.Image())
		require.NoError(t, e.Client.Delete(context.Background(), h))
		waitGone(t, e, h)
		require.Empty(t, sim.Image(), "the discovery ISO (and the InfraEnv token in its URL) stayed in the BMC")
		require.True(t, m.On(), "deleting without power-off-on-delete powered the host off")
		require.NotEmpty(t, events(t, e, h.Name, "MediaEjected"))
	})

}

func waitGone(t *testing.T, e *env, h *metal3.BareMetalHost) {
	t.Helper()
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), &metal3.BareMetalHost{}))
	}, 60*time.Second, 100*time.Millisecond, "%s not deleted", h.Name)
}

// resetSim sends a ComputerSystem.Reset to the simulator, as another tool
// would.
func resetSim(t *testing.T, hostport, resetType string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+hostport+"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
		bytes.NewBufferString(`{"ResetType":"`+resetType+`"}`))
	require.NoError(t, err)
	req.SetBasicAuth("admin", password)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
}
