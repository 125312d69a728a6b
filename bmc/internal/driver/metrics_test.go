package driver

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/bmc/internal/address"
	"github.com/agentboot/agentboot/test/bmcsim"
)

// Every BMC call is counted by operation, protocol and outcome, and timed:
// a rejected password is "auth", an answer is "ok".
func TestOperationsAreCounted(t *testing.T) {
	sim := &bmcsim.Redfish{User: "admin", Password: "right-password", Machine: &bmcsim.MemMachine{}}
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	a, err := address.Parse("redfish+" + srv.URL + "/redfish/v1/Systems/1")
	require.NoError(t, err)
	opts := Options{CallTimeout: 10 * time.Second, MediaTimeout: 10 * time.Second}
	count := func(op, outcome string) float64 {
		return testutil.ToFloat64(operations.WithLabelValues(op, "redfish", outcome))
	}
	register()
	timed := func() uint64 {
		var m dto.Metric
		require.NoError(t, latency.WithLabelValues(opPowerState, "redfish").(prometheus.Histogram).Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	timedBefore := timed()
	okBefore, authBefore := count(opPowerState, outcomeOK), count(opPowerState, outcomeAuth)+count(opConnect, outcomeAuth)

	b, err := Open(context.Background(), a, Credentials{Username: "admin", Password: "right-password"}, opts)
	require.NoError(t, err)
	_, err = b.PowerState(context.Background())
	require.NoError(t, err)
	b.Close()
	require.Equal(t, okBefore+1, count(opPowerState, outcomeOK))

	b, err = Open(context.Background(), a, Credentials{Username: "admin", Password: "wrong-password"}, opts)
	if err == nil {
		_, err = b.PowerState(context.Background())
		b.Close()
	}
	require.ErrorContains(t, err, "rejected the username or password")
	require.Equal(t, authBefore+1, count(opPowerState, outcomeAuth)+count(opConnect, outcomeAuth))
	require.Equal(t, timedBefore+2, timed(), "both power-state calls timed")
}
