package boottrace

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/scheme"
)

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	o := Observation{MAC: "52-54-00-AA-00-01", Hop: DHCP, At: now.Add(-48 * time.Hour), Outcome: strings.Repeat("x", 2000)}
	require.NoError(t, o.Check(now))
	require.Equal(t, "52:54:00:aa:00:01", o.MAC)
	require.Equal(t, now, o.At, "a clock that is off: the time it arrived")
	require.LessOrEqual(t, len(o.Outcome), MaxOutcome)
	require.EqualValues(t, 1, o.Count)
	for _, bad := range []Observation{{MAC: "zz", Hop: DHCP}, {MAC: "52:54:00:aa:00:01", Hop: "registered"}, {MAC: "52:54:00:aa:00:01", Hop: DHCP, Count: -1}} {
		require.Error(t, bad.Check(now), "%+v", bad)
	}
}

// A flood of made-up MACs fills the journal to its bound and no further;
// the same MAC's hops merge.
func TestJournalIsBounded(t *testing.T) {
	j := &Journal{MaxMACs: 3}
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 10; i++ {
		err := j.Add(SourcePXE, Observation{MAC: fmt.Sprintf("52:54:00:00:00:%02x", i), Hop: DHCP, At: at, Count: 1})
		if i < 3 {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, ErrJournalFull)
		}
	}
	require.NoError(t, j.Add(SourcePXE, Observation{MAC: "52:54:00:00:00:00", Hop: DHCP, At: at.Add(time.Minute), Count: 2, OK: true, Outcome: "later"}))
	require.Equal(t, 3, j.Len())
	require.EqualValues(t, 7, j.Dropped())
	got := j.take(10)
	require.Len(t, got["52:54:00:00:00:00"], 1)
	h := got["52:54:00:00:00:00"][0]
	require.EqualValues(t, 3, h.Count)
	require.Equal(t, at, h.First.Time.UTC())
	require.Equal(t, at.Add(time.Minute), h.Last.Time.UTC())
	require.Equal(t, "later", h.Outcome, "what the latest sighting said")
	require.Zero(t, j.Len())
}

// Old traces go; past the bound, the least recently seen unclaimed ones.
func TestSweep(t *testing.T) {
	s, err := scheme.New()
	require.NoError(t, err)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	trace := func(ns string, n int, seen time.Time, claim ...string) client.Object {
		t := metav1.NewTime(seen)
		bt := &v1alpha1.BootTrace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("mac-%d", n)}, Status: v1alpha1.BootTraceStatus{LastSeen: &t}}
		if len(claim) > 0 {
			bt.Labels = map[string]string{v1alpha1.ClaimLabel: claim[0]}
		}
		return bt
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		trace("agentboot-system", 1, now.Add(-time.Minute)),
		trace("agentboot-system", 2, now.Add(-2*time.Minute)),
		trace("agentboot-system", 3, now.Add(-3*time.Minute)),
		trace("team", 4, now.Add(-8*24*time.Hour)),
		trace("team", 5, now.Add(-time.Hour)),
		// A PXE default claims any MAC: capped per namespace; what a
		// BareMetalHost names is not.
		trace("team", 6, now.Add(-time.Minute), v1alpha1.ClaimPXEDefault),
		trace("team", 7, now.Add(-2*time.Minute), v1alpha1.ClaimPXEDefault),
		trace("team", 8, now.Add(-3*time.Minute), v1alpha1.ClaimPXEDefault),
		trace("team", 9, now.Add(-4*time.Minute), v1alpha1.ClaimBareMetalHost),
	).Build()
	w := &Writer{Client: c, Namespace: "agentboot-system", MaxUnclaimed: 2, MaxByDefault: 2, Now: func() time.Time { return now }, Log: logr.Discard()}
	require.NoError(t, w.Sweep(context.Background()))
	var list v1alpha1.BootTraceList
	require.NoError(t, c.List(context.Background(), &list))
	var left []string
	for _, bt := range list.Items {
		left = append(left, bt.Namespace+"/"+bt.Name)
	}
	require.ElementsMatch(t, []string{"agentboot-system/mac-1", "agentboot-system/mac-2", "team/mac-5", "team/mac-6", "team/mac-7", "team/mac-9"}, left)
}

// A flood of made-up MACs that a PXE default claims creates traces no
// faster than the limiter allows; the rest wait in the journal.
func TestNewTracesOfMadeUpMACsAreLimited(t *testing.T) {
	s, err := scheme.New()
	require.NoError(t, err)
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.BootTrace{}).Build()
	j := &Journal{}
	at := time.Now()
	for i := 0; i < 5; i++ {
		require.NoError(t, j.Add(SourcePXE, Observation{MAC: fmt.Sprintf("52:54:00:00:01:%02x", i), Hop: DHCP, At: at, Count: 1}))
	}
	w := &Writer{Client: c, Reader: c, Journal: j, Namespace: "agentboot-system", NewUnclaimed: rate.NewLimiter(0, 2), Log: logr.Discard(),
		Claim: func(context.Context, string) (Claim, error) {
			return Claim{Namespace: "team", InfraEnv: "pool", Why: "boots InfraEnv team/pool (its PXE default)", ByDefault: true}, nil
		}}
	w.Flush(context.Background())
	var list v1alpha1.BootTraceList
	require.NoError(t, c.List(context.Background(), &list))
	require.Len(t, list.Items, 2)
	for _, bt := range list.Items {
		require.Equal(t, v1alpha1.ClaimPXEDefault, bt.Labels[v1alpha1.ClaimLabel])
		require.Equal(t, "team/pool", bt.Status.InfraEnv)
	}
	require.Zero(t, j.Len(), "the others are dropped, not kept to crowd out the hosts BareMetalHosts name")
	require.EqualValues(t, 3, j.Dropped())
}

// A stalled boot is told of once, on the trace and on the BareMetalHost
// whose boot MAC it is; a new stall (the host moved on, then stopped again)
// once more; a MAC nothing claims never.
func TestStallsTellOnce(t *testing.T) {
	s, err := scheme.New()
	require.NoError(t, err)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	mac := "52:54:00:aa:20:01"
	trace := func(ns, claim string) *v1alpha1.BootTrace {
		seen := metav1.NewTime(now.Add(-20 * time.Minute))
		return &v1alpha1.BootTrace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Name(mac), Labels: map[string]string{v1alpha1.ClaimLabel: claim}},
			Status: v1alpha1.BootTraceStatus{MACAddress: mac, LastSeen: &seen, Hops: []v1alpha1.BootTraceHop{
				{Hop: BootScript, Source: SourceImageService, OK: true, Outcome: "discovery", First: seen, Last: seen, Count: 1}}}}
	}
	claimed := trace("team", v1alpha1.ClaimBareMetalHost)
	host := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "worker-0"}, Spec: metal3.BareMetalHostSpec{BootMACAddress: mac}}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.BootTrace{}).
		WithObjects(claimed, trace("agentboot-system", v1alpha1.ClaimNone), host).
		WithIndex(&v1beta1.Agent{}, macindex.AgentMAC, macindex.AgentMACs).
		WithIndex(&metal3.BareMetalHost{}, macindex.BootMAC, macindex.HostBootMAC).Build()
	rec := events.NewFakeRecorder(10)
	st := &Stalls{Client: c, Events: rec, After: 10 * time.Minute, Home: "agentboot-system", Now: func() time.Time { return now }}
	ctx := context.Background()
	told := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	pass := func(ns string) {
		_, err := st.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: Name(mac)}})
		require.NoError(t, err)
	}
	pass("team")
	got := told()
	require.Len(t, got, 2, "the trace and the BareMetalHost")
	require.Contains(t, got[0], "BootStalled MAC "+mac+" stopped at boot_script")
	pass("team")
	require.Empty(t, told(), "once per stall")
	pass("agentboot-system")
	require.Empty(t, told(), "a MAC nothing claims")

	// The host moved on and stopped again: a new stall.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(claimed), claimed))
	later := metav1.NewTime(now.Add(-15 * time.Minute))
	claimed.Status.Hops = append(claimed.Status.Hops, v1alpha1.BootTraceHop{Hop: Kernel, Source: SourceImageService, OK: true, First: later, Last: later, Count: 1})
	claimed.Status.LastSeen = &later
	require.NoError(t, c.Status().Update(ctx, claimed))
	pass("team")
	require.Len(t, told(), 2)
}

// A flood of addresses cannot evict the known ones; expired ones make room.
func TestAddressesKeepTheKnown(t *testing.T) {
	var a Addresses
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	a.Put("198.18.0.1", "52:54:00:00:00:01", now)
	for i := 0; i < MaxAddrs+10; i++ {
		a.Put(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "52:54:00:00:00:02", now)
	}
	require.Equal(t, "52:54:00:00:00:01", a.MAC("198.18.0.1", now))
	require.Empty(t, a.MAC("10.0.195.90", now), "past the bound, not remembered")
	later := now.Add(AddrTTL + time.Minute)
	require.Empty(t, a.MAC("198.18.0.1", later), "expired")
	a.Put("198.18.0.9", "52:54:00:00:00:09", later)
	require.Equal(t, "52:54:00:00:00:09", a.MAC("198.18.0.9", later), "the expired made room")
}
