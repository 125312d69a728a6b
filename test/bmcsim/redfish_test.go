package bmcsim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentboot/agentboot/test/testenv"
)

// The simulator is the yardstick the controller is measured with: these
// check that it really behaves as the hardware it stands for.

func do(t *testing.T, srv *httptest.Server, method, path, body string, auth func(*http.Request)) int {
	t.Helper()
	var r *bytes.Buffer
	if body != "" {
		r = bytes.NewBufferString(body)
	} else {
		r = &bytes.Buffer{}
	}
	req, err := http.NewRequest(method, srv.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	auth(req)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func basic(req *http.Request) { req.SetBasicAuth("admin", "pw") }

// sim is a Redfish service whose hardware keeps the test's time: the test
// steps the clock and checks the state at each step.
func sim(t *testing.T) (*Redfish, *MemMachine, *httptest.Server, *testenv.ManualClock) {
	m := &MemMachine{}
	c := testenv.NewManualClock()
	r := &Redfish{User: "admin", Password: "pw", Machine: m, Clock: c}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	t.Cleanup(r.Close)
	return r, m, srv, c
}

const reset = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"

func requireState(t *testing.T, r *Redfish, want, when string) {
	t.Helper()
	if got := r.PowerState(); got != want {
		t.Fatalf("%s: power state %s, want %s", when, got, want)
	}
}

func TestTransitionsTakeTime(t *testing.T) {
	r, m, srv, clock := sim(t)
	span := Span{Min: 300 * time.Millisecond, Max: 300 * time.Millisecond}
	r.SetTiming(Timing{PowerOn: span, PowerOff: span, Shutdown: span, Transitional: true, Conflict: true})
	r.HoldTransitions(true)
	if got := do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic); got != http.StatusNoContent {
		t.Fatalf("On: %d", got)
	}
	if r.PowerState() != PoweringOn || m.On() {
		t.Fatalf("right after On: %s, machine on %v", r.PowerState(), m.On())
	}
	if got := do(t, srv, "POST", reset, `{"ResetType":"ForceOff"}`, basic); got != http.StatusConflict {
		t.Fatalf("ForceOff during power-on: %d, want 409", got)
	}
	r.HoldTransitions(false)
	clock.Step(299 * time.Millisecond)
	requireState(t, r, PoweringOn, "299ms into a 300ms power-on")
	clock.Step(time.Millisecond)
	requireState(t, r, On, "after 300ms")
	// Graceful: the OS takes its time, then the platform.
	if got := do(t, srv, "POST", reset, `{"ResetType":"GracefulShutdown"}`, basic); got != http.StatusNoContent {
		t.Fatalf("GracefulShutdown: %d", got)
	}
	// The OS shutting down is the host on, as the BMC reports it.
	clock.Step(599 * time.Millisecond)
	requireState(t, r, On, "599ms into shutdown (300ms) and power-off (300ms)")
	if !m.On() {
		t.Fatal("the platform went off before the OS shut down and the platform powered off")
	}
	clock.Step(time.Millisecond)
	requireState(t, r, Off, "after 600ms")
	if m.On() {
		t.Fatal("reported Off, machine on")
	}
}

func TestHungOSAndEarlyOff(t *testing.T) {
	r, m, srv, clock := sim(t)
	m.PowerOn("", "")
	r.SetTiming(Timing{HungOS: true})
	do(t, srv, "POST", reset, `{"ResetType":"GracefulShutdown"}`, basic)
	clock.Step(24 * time.Hour)
	if r.PowerState() != On || !m.On() {
		t.Fatal("a hung OS shut down")
	}
	do(t, srv, "POST", reset, `{"ResetType":"ForceOff"}`, basic)
	requireState(t, r, Off, "forced off")

	// EarlyOff: Off at once, a power-on in the window dropped.
	m.PowerOn("", "")
	r.SetTiming(Timing{EarlyOff: true, PowerOff: Span{Min: 300 * time.Millisecond, Max: 300 * time.Millisecond}})
	r.HoldTransitions(true)
	do(t, srv, "POST", reset, `{"ResetType":"ForceOff"}`, basic)
	if r.PowerState() != Off || !m.On() {
		t.Fatalf("EarlyOff: reported %s, machine on %v; want Off while still on", r.PowerState(), m.On())
	}
	do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic)
	r.HoldTransitions(false)
	clock.Step(300 * time.Millisecond)
	if m.On() {
		t.Fatal("the platform never finished shutting down")
	}
	clock.Step(24 * time.Hour)
	if m.On() {
		t.Fatal("a power-on in the early-off window was not dropped")
	}
}

func TestSessionsExpire(t *testing.T) {
	r, _, srv, clock := sim(t)
	r.SetQuirks(Quirks{SessionTimeout: 2 * time.Second})
	req, _ := http.NewRequest("POST", srv.URL+"/redfish/v1/SessionService/Sessions", bytes.NewBufferString(`{"UserName":"admin","Password":"pw"}`))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tok := resp.Header.Get("X-Auth-Token")
	withToken := func(req *http.Request) { req.Header.Set("X-Auth-Token", tok) }
	if got := do(t, srv, "GET", "/redfish/v1/Systems/1", "", withToken); got != http.StatusOK {
		t.Fatalf("fresh session: %d", got)
	}
	// Idle for less than the timeout, twice: each use renews it.
	for range 2 {
		clock.Step(1900 * time.Millisecond)
		if got := do(t, srv, "GET", "/redfish/v1/Systems/1", "", withToken); got != http.StatusOK {
			t.Fatalf("session used within its idle timeout: %d", got)
		}
	}
	clock.Step(2001 * time.Millisecond)
	if got := do(t, srv, "GET", "/redfish/v1/Systems/1", "", withToken); got != http.StatusUnauthorized {
		t.Fatalf("expired session: %d, want 401", got)
	}
	if got := do(t, srv, "GET", "/redfish/v1/Systems/1", "", basic); got != http.StatusOK {
		t.Fatalf("basic auth: %d", got)
	}
}

func TestVendorQuirks(t *testing.T) {
	r, m, srv, clock := sim(t)
	const cd = "/redfish/v1/Managers/1/VirtualMedia/Cd/Actions/VirtualMedia."
	if got := do(t, srv, "POST", cd+"InsertMedia", `{"Image":"http://x/a.iso"}`, basic); got != http.StatusNoContent {
		t.Fatalf("insert: %d", got)
	}
	if got := do(t, srv, "POST", cd+"InsertMedia", `{"Image":"http://x/b.iso"}`, basic); got != http.StatusConflict {
		t.Fatalf("insert over inserted media: %d, want 409", got)
	}
	r.SetQuirks(Quirks{ILOMedia: true})
	if got := do(t, srv, "POST", cd+"EjectMedia", "", basic); got != http.StatusUnsupportedMediaType {
		t.Fatalf("iLO eject without a body: %d, want 415", got)
	}
	if got := do(t, srv, "POST", cd+"EjectMedia", "{}", basic); got != http.StatusNoContent {
		t.Fatalf("iLO eject: %d", got)
	}
	if got := do(t, srv, "POST", cd+"EjectMedia", "{}", basic); got != http.StatusBadRequest {
		t.Fatalf("iLO eject with nothing inserted: %d, want 400", got)
	}

	r.SetQuirks(Quirks{SupermicroBootPatch: true})
	do(t, srv, "PATCH", "/redfish/v1/Systems/1", `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`, basic)
	do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic)
	if b := m.Boots(); len(b) != 1 || b[0] != " " {
		t.Fatalf("Supermicro with a partial PATCH booted %q, want its own order", b)
	}
	do(t, srv, "POST", reset, `{"ResetType":"ForceOff"}`, basic)

	r.SetQuirks(Quirks{IDRACPowerOnConflict: 2 * time.Second})
	if got := do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic); got != http.StatusConflict {
		t.Fatalf("iDRAC power-on right after power-off: %d, want 409", got)
	}
	clock.Step(1900 * time.Millisecond)
	if got := do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic); got != http.StatusConflict {
		t.Fatalf("iDRAC power-on 1.9s after power-off: %d, want 409", got)
	}
	clock.Step(200 * time.Millisecond)
	if got := do(t, srv, "POST", reset, `{"ResetType":"On"}`, basic); got != http.StatusNoContent || !m.On() {
		t.Fatalf("iDRAC power-on after the window: %d, on %v", got, m.On())
	}

	do(t, srv, "POST", reset, `{"ResetType":"ForceOff"}`, basic)
	r.SetQuirks(Quirks{NoGracefulShutdown: true})
	m.PowerOn("", "")
	if got := do(t, srv, "POST", reset, `{"ResetType":"GracefulShutdown"}`, basic); got != http.StatusBadRequest || !m.On() {
		t.Fatalf("iLO 4 GracefulShutdown: %d, on %v; want 400 and still on", got, m.On())
	}
}
