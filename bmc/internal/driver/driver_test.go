package driver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stmcginnis/gofish/common"
	"github.com/stretchr/testify/require"
)

func TestParsePowerState(t *testing.T) {
	for raw, want := range map[string]Power{
		"Chassis Power is on\n":  On,
		"Chassis Power is off\n": Off,
		"On":                     On,
		"Off":                    Off,
		"PoweringOn":             PoweringOn,
		"PoweringOff":            PoweringOff,
	} {
		got, err := ParsePowerState(raw)
		if err != nil || got != want {
			t.Errorf("ParsePowerState(%q) = %v, %v; want %v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"", "  ", "Paused", "unknown"} {
		if _, err := ParsePowerState(raw); err == nil {
			t.Errorf("ParsePowerState(%q) accepted", raw)
		}
	}
}

func TestScrub(t *testing.T) {
	got := Scrub("failed: 1 error occurred:\n\t* provider: gofish: 401 for user admin password hunter2\n\n", "hunter2")
	if want := "failed: 1 error occurred:; provider: gofish: 401 for user admin password ***"; got != want {
		t.Fatalf("Scrub = %q, want %q", got, want)
	}
}

// Only a request the BMC does not offer is "unsupported" (and a graceful
// shutdown then gives way to a forced one); a BMC that is not ready, or
// any other failure, is an ordinary error.
func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&common.Error{HTTPReturnedStatusCode: 400, Code: "Base.1.8.ActionParameterNotSupported"}, true},
		{&common.Error{HTTPReturnedStatusCode: 400, Code: "Base.1.8.GeneralError", ExtendedInfos: []common.ErrExtendedInfo{{MessageID: "Base.1.8.PropertyValueNotInList"}}}, true},
		{&common.Error{HTTPReturnedStatusCode: 400, Code: "iLO.0.10.ExtendedInfo", ExtendedInfos: []common.ErrExtendedInfo{{MessageID: "iLO.2.15.InvalidOperationForSystemState"}}}, false},
		{&common.Error{HTTPReturnedStatusCode: 405}, true},
		{&common.Error{HTTPReturnedStatusCode: 501}, true},
		{&common.Error{HTTPReturnedStatusCode: 500, Message: "internal error"}, false},
		{fmt.Errorf("provider: gofish: %w", errors.New("reset type 'GracefulShutdown' is not supported by this service")), true},
		{errors.New("Chassis Power Control: Soft failed: Invalid command"), true},
		{errors.New("context deadline exceeded"), false},
		{errors.New("Unable to establish IPMI v2 / RMCP+ session"), false},
	} {
		if got := unsupported(tc.err); got != tc.want {
			t.Errorf("unsupported(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// "Busy" is one decision for Redfish and IPMI, for every operation: the BMC
// did nothing and the request may be asked again; anything else is not.
func TestBusy(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("provider: gofish: %w", &common.Error{HTTPReturnedStatusCode: 409, Code: "Base.1.8.ActionParameterValueConflict"}), true},
		{errors.New("Set Chassis Power Control to Up/On failed: Node busy"), true},
		{&common.Error{HTTPReturnedStatusCode: 400}, false},
		{&common.Error{HTTPReturnedStatusCode: 503}, false},
		{errors.New("context deadline exceeded"), false},
	} {
		if got := busy(tc.err); got != tc.want {
			t.Errorf("busy(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	s := &session{secret: "pw"}
	if err := s.fail("set boot device", errors.New("Node busy")); !errors.Is(err, ErrBusy) {
		t.Errorf("an IPMI busy answer to another operation is not ErrBusy: %v", err)
	}
}

// A Redfish session's connections go to the checked addresses only, the
// first that answers (never to what the name resolves to now), and read an
// answer up to MaxAnswerBytes.
func TestRedfishClientPinsAndBounds(t *testing.T) {
	big := strings.Repeat("x", MaxAnswerBytes+1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, big)
			return
		}
		_, _ = io.WriteString(w, `{"@odata.id":"/redfish/v1/"}`)
	}))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	// 127.0.0.2 refuses (nothing listens there); the name does not resolve.
	c := redfishClient(Options{Pins: []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")}, CallTimeout: 10 * time.Second, MediaTimeout: 10 * time.Second})
	resp, err := c.Get("http://bmc.example.invalid:" + port + "/redfish/v1/")
	require.NoError(t, err, "the second checked address answers")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "/redfish/v1/")

	resp, err = c.Get("http://bmc.example.invalid:" + port + "/big")
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, ErrAnswerTooLarge)
}
