//go:build bench

package bmc

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc"
	"github.com/agentboot/agentboot/test/bmcsim"
	"github.com/agentboot/agentboot/test/stack"
)

var (
	hosts  = flag.Int("hosts", 50, "BareMetalHosts, each behind its own simulated Redfish BMC")
	window = flag.Duration("window", 2*time.Minute, "steady state measured for this long after enrollment")
)

// meter counts a BMC's requests and the most it had in flight at once.
type meter struct {
	h        http.Handler
	mu       sync.Mutex
	times    []time.Time
	inFlight atomic.Int32
	maxSeen  atomic.Int32
}

func (m *meter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := m.inFlight.Add(1)
	defer m.inFlight.Add(-1)
	for {
		old := m.maxSeen.Load()
		if n <= old || m.maxSeen.CompareAndSwap(old, n) {
			break
		}
	}
	m.mu.Lock()
	m.times = append(m.times, time.Now())
	m.mu.Unlock()
	m.h.ServeHTTP(w, r)
}

func (m *meter) between(from, to time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, t := range m.times {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

type result struct {
	enroll, off          time.Duration // all hosts provisioned and on; all off
	enrollP50, enrollMax time.Duration
	perMinuteMean        float64 // steady state, per BMC
	perMinuteMax         int
	enrollCallsMean      float64
	maxInFlight          int32
	errors               int
	graceful, forced     int
}

func TestBenchBMC(t *testing.T) {
	// One stack at a time: each subtest's cleanup stops its own.
	var ideal, real result
	t.Run("ideal", func(t *testing.T) { ideal = run(t, "ideal", bmcsim.Timing{}) })
	t.Run("realistic", func(t *testing.T) { real = run(t, "realistic", bmcsim.Realistic) })
	if t.Failed() {
		return
	}
	fmt.Printf("\nbench-bmc: %d BareMetalHosts, one simulated Redfish BMC each, production controller timing (8 BMCs at once, resync 1m)\n", *hosts)
	fmt.Printf("%-34s %12s %12s %8s\n", "", "ideal BMCs", "realistic", "ratio")
	row := func(name string, a, b float64, unit string) {
		ratio := "-"
		if a > 0 {
			ratio = fmt.Sprintf("%.2f", b/a)
		}
		fmt.Printf("%-34s %10.1f%-2s %10.1f%-2s %8s\n", name, a, unit, b, unit, ratio)
	}
	row("all enrolled (provisioned, on)", ideal.enroll.Seconds(), real.enroll.Seconds(), "s")
	row("per host p50", ideal.enrollP50.Seconds(), real.enrollP50.Seconds(), "s")
	row("per host max", ideal.enrollMax.Seconds(), real.enrollMax.Seconds(), "s")
	row("BMC calls per host to enroll", ideal.enrollCallsMean, real.enrollCallsMean, "")
	row("steady calls/BMC/min, mean", ideal.perMinuteMean, real.perMinuteMean, "")
	row("steady calls/BMC/min, max", float64(ideal.perMinuteMax), float64(real.perMinuteMax), "")
	row("all powered off (graceful)", ideal.off.Seconds(), real.off.Seconds(), "s")
	fmt.Printf("%-34s %12d %12d\n", "most requests in flight at a BMC", ideal.maxInFlight, real.maxInFlight)
	fmt.Printf("%-34s %12d %12d\n", "hosts that showed an error", ideal.errors, real.errors)
	fmt.Printf("%-34s %12s %12s\n", "graceful / forced power-offs", fmt.Sprintf("%d/%d", ideal.graceful, ideal.forced), fmt.Sprintf("%d/%d", real.graceful, real.forced))
	for name, r := range map[string]result{"ideal": ideal, "realistic": real} {
		if r.maxInFlight > 1 {
			t.Errorf("%s: a BMC had %d requests in flight at once: a host was visited twice at once", name, r.maxInFlight)
		}
		if r.errors > 0 {
			t.Errorf("%s: %d hosts showed an error with healthy BMCs", name, r.errors)
		}
	}
}

func run(t *testing.T, name string, timing bmcsim.Timing) result {
	t.Logf("%s: starting", name)
	s := stack.Start(t, stack.Options{Quiet: true, ISOOverHTTP: true, BMC: bmc.Config{}})
	ctx := context.Background()
	ie := s.CreateInfraEnv(t, "bench-bmc", "lab", nil)
	ns := ie.Namespace
	require.NoError(t, s.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bmc"},
		StringData: map[string]string{"username": "admin", "password": "bench-pw"}}))
	meters := make([]*meter, *hosts)
	sims := make([]*bmcsim.Redfish, *hosts)
	machines := make([]*bmcsim.MemMachine, *hosts)
	errored := map[string]bool{}
	start := time.Now()
	for i := range *hosts {
		machines[i] = &bmcsim.MemMachine{}
		sims[i] = &bmcsim.Redfish{User: "admin", Password: "bench-pw", Machine: machines[i]}
		sims[i].SetTiming(timing)
		meters[i] = &meter{h: sims[i]}
		srv := httptest.NewServer(meters[i])
		t.Cleanup(srv.Close)
		t.Cleanup(sims[i].Close)
		h := &metal3.BareMetalHost{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("host-%02d", i), Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
			Spec: metal3.BareMetalHostSpec{Online: true, BootMACAddress: stack.MAC(i + 1),
				BMC: metal3.BMCDetails{Address: "redfish-virtualmedia+" + srv.URL + "/redfish/v1/Systems/1", CredentialsName: "bmc"}},
		}
		require.NoError(t, s.Client.Create(ctx, h))
	}
	enrolled := map[string]time.Duration{}
	var list metal3.BareMetalHostList
	watch := func(done func(h *metal3.BareMetalHost) bool, seen map[string]time.Duration, from time.Time, limit time.Duration) time.Duration {
		deadline := time.Now().Add(limit)
		for len(seen) < *hosts {
			require.True(t, time.Now().Before(deadline), "%s: %d of %d hosts after %s", name, len(seen), *hosts, limit)
			require.NoError(t, s.Client.List(ctx, &list, client.InNamespace(ns)))
			for i := range list.Items {
				h := &list.Items[i]
				if h.Status.ErrorType != "" && !errored[h.Name] {
					errored[h.Name] = true
					t.Logf("%s: %s: %s", name, h.Name, h.Status.ErrorMessage)
				}
				if _, ok := seen[h.Name]; !ok && done(h) {
					seen[h.Name] = time.Since(from)
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		return time.Since(from)
	}
	var r result
	r.enroll = watch(func(h *metal3.BareMetalHost) bool {
		return h.Status.Provisioning.State == metal3.StateProvisioned && h.Status.PoweredOn
	}, enrolled, start, 10*time.Minute)
	ds := make([]time.Duration, 0, len(enrolled))
	for _, d := range enrolled {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	r.enrollP50, r.enrollMax = ds[len(ds)/2], ds[len(ds)-1]
	steady := time.Now()
	calls := 0
	for _, m := range meters {
		calls += m.between(start, steady)
	}
	r.enrollCallsMean = float64(calls) / float64(*hosts)
	t.Logf("%s: enrolled in %s; steady state for %s", name, r.enroll, *window)
	time.Sleep(*window)
	end := time.Now()
	total := 0
	for _, m := range meters {
		n := m.between(steady, end)
		total += n
		r.perMinuteMax = max(r.perMinuteMax, int(float64(n)/end.Sub(steady).Minutes()+0.5))
	}
	r.perMinuteMean = float64(total) / float64(*hosts) / end.Sub(steady).Minutes()

	offStart := time.Now()
	for i := range list.Items {
		h := list.Items[i].DeepCopy()
		for {
			patch := client.MergeFrom(h.DeepCopy())
			h.Spec.Online = false
			if err := s.Client.Patch(ctx, h, patch); err == nil {
				break
			}
			require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(h), h))
		}
	}
	r.off = watch(func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn }, map[string]time.Duration{}, offStart, 10*time.Minute)
	for i, m := range meters {
		r.maxInFlight = max(r.maxInFlight, m.maxSeen.Load())
		evs := strings.Join(sims[i].Events(), "\n")
		r.graceful += strings.Count(evs, "request GracefulShutdown")
		r.forced += strings.Count(evs, "request ForceOff")
		require.False(t, machines[i].On(), "host %d still on", i)
	}
	r.errors = len(errored)
	return r
}
