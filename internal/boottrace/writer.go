package boottrace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	"github.com/agentboot/agentboot/internal/clip"
)

// Claim is where a MAC's trace lives: the namespace of the InfraEnv it
// boots into, or agentboot's own when nothing claims it.
type Claim struct {
	// Namespace and InfraEnv: the InfraEnv the MAC boots into; InfraEnv
	// is empty when nothing claims it.
	Namespace, InfraEnv string
	// Why says what claims it, or why nothing does.
	Why string
	// ByDefault: only the namespace's PXE-default InfraEnv claims it, as
	// it claims any MAC a host on the boot network makes up.
	ByDefault bool
}

// Unclaimed reports whether nothing claimed the trace's MAC when it was
// last written: its claim label says so, or (a trace written before the
// label) it is in home, agentboot's namespace.
func Unclaimed(t *v1alpha1.BootTrace, home string) bool {
	claim := t.Labels[v1alpha1.ClaimLabel]
	return claim == v1alpha1.ClaimNone || claim == "" && t.Namespace == home
}

// kind is the ClaimLabel value.
func (c Claim) kind() string {
	switch {
	case c.InfraEnv == "":
		return v1alpha1.ClaimNone
	case c.ByDefault:
		return v1alpha1.ClaimPXEDefault
	}
	return v1alpha1.ClaimBareMetalHost
}

// Writer writes the journal's observations into BootTraces, every
// Interval. Every replica of the image service runs one for what it saw:
// each write reads the trace and folds its hops in, retrying on conflict.
type Writer struct {
	// Client writes; its List (a cache) finds the traces to sweep.
	Client client.Client
	// Reader reads a trace before it is written (the apiserver, not a
	// cache that may be behind).
	Reader  client.Reader
	Journal *Journal
	// Claim finds where a MAC's trace lives.
	Claim func(ctx context.Context, mac string) (Claim, error)
	// Namespace is agentboot's own, where unclaimed MACs' traces live.
	Namespace string
	// Interval between writes (default 2 s); PerInterval bounds the MACs
	// written in one (default 200): a boot storm is written over several.
	Interval    time.Duration
	PerInterval int
	// Retention: traces not seen for this long are deleted (default
	// 7 days). MaxUnclaimed bounds the traces of unclaimed MACs, and
	// MaxByDefault those a PXE-default InfraEnv claims in each namespace
	// (default 1000 each): past it the least recently seen go.
	Retention    time.Duration
	MaxUnclaimed int
	MaxByDefault int
	// SweepEvery is how often old traces are deleted (default 1 min).
	SweepEvery time.Duration
	// NewUnclaimed limits the traces created for MACs nothing claims or
	// only a PXE default claims, a second (default 1, bursts of 100): with
	// the sweep, what bounds the traces a flood of made-up MACs leaves.
	// Their observations wait meanwhile.
	NewUnclaimed *rate.Limiter
	Now          func() time.Time
	Log          logr.Logger
}

func (w *Writer) defaults() {
	if w.Interval <= 0 {
		w.Interval = 2 * time.Second
	}
	if w.PerInterval <= 0 {
		w.PerInterval = 200
	}
	if w.Retention <= 0 {
		w.Retention = 7 * 24 * time.Hour
	}
	if w.MaxUnclaimed <= 0 {
		w.MaxUnclaimed = 1000
	}
	if w.MaxByDefault <= 0 {
		w.MaxByDefault = 1000
	}
	if w.SweepEvery <= 0 {
		w.SweepEvery = time.Minute
	}
	if w.NewUnclaimed == nil {
		w.NewUnclaimed = rate.NewLimiter(1, 100)
	}
	if w.Now == nil {
		w.Now = time.Now
	}
}

// NeedLeaderElection is false: each replica writes what it saw.
func (w *Writer) NeedLeaderElection() bool { return false }

// Start writes until ctx ends, then once more.
func (w *Writer) Start(ctx context.Context) error {
	w.defaults()
	tick := time.NewTicker(w.Interval)
	defer tick.Stop()
	sweep := time.NewTicker(w.SweepEvery)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			w.Flush(final)
			cancel()
			return nil
		case <-tick.C:
			w.Flush(ctx)
		case <-sweep.C:
			if err := w.Sweep(ctx); err != nil {
				w.Log.Error(err, "delete old boot traces")
			}
		}
	}
}

// Flush writes up to PerInterval MACs' pending observations.
func (w *Writer) Flush(ctx context.Context) {
	w.defaults()
	for mac, hops := range w.Journal.take(w.PerInterval) {
		if err := w.write(ctx, mac, hops); err != nil {
			if apierrors.IsInvalid(err) {
				// Written again it would be refused again.
				w.Log.Error(err, "boot trace refused by the apiserver; its observations are dropped", "mac", mac)
				continue
			}
			if err == errUnclaimedLimit {
				// A MAC anyone could have made up, past the limit: its
				// observations are dropped (and counted), so that a flood
				// cannot fill the journal and crowd out the hosts
				// BareMetalHosts name.
				w.Journal.drop(len(hops))
				continue
			}
			w.Log.Error(err, "write boot trace", "mac", mac)
			w.Journal.putBack(mac, hops)
		}
	}
}

func (w *Writer) write(ctx context.Context, mac string, hops []v1alpha1.BootTraceHop) error {
	claim, err := w.Claim(ctx, mac)
	if err != nil {
		return fmt.Errorf("find what claims it: %w", err)
	}
	ns := claim.Namespace
	if claim.InfraEnv == "" {
		ns = w.Namespace
	}
	key := client.ObjectKey{Namespace: ns, Name: Name(mac)}
	kind := claim.kind()
	// A new trace of a MAC anyone could have made up waits for the
	// limiter, before anything is asked of the apiserver (the cache knows
	// the traces that exist).
	allowed := false
	if kind != v1alpha1.ClaimBareMetalHost {
		var cached v1alpha1.BootTrace
		if err := w.Client.Get(ctx, key, &cached); err != nil {
			if !w.NewUnclaimed.Allow() {
				return errUnclaimedLimit
			}
			allowed = true
		}
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var t v1alpha1.BootTrace
		err := w.Reader.Get(ctx, key, &t)
		if apierrors.IsNotFound(err) {
			// The cache may still show one the sweep just deleted.
			if kind != v1alpha1.ClaimBareMetalHost && !allowed {
				if !w.NewUnclaimed.Allow() {
					return errUnclaimedLimit
				}
				allowed = true
			}
			t = v1alpha1.BootTrace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name,
				Labels: map[string]string{v1alpha1.MACLabel: Label(mac), v1alpha1.ClaimLabel: kind}}}
			if err := w.Client.Create(ctx, &t); err != nil {
				if apierrors.IsAlreadyExists(err) {
					// Another replica made it: read it again.
					return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("boottraces").GroupResource(), key.Name, err)
				}
				return err
			}
		} else if err != nil {
			return err
		}
		if t.Labels[v1alpha1.ClaimLabel] != kind {
			if t.Labels == nil {
				t.Labels = map[string]string{}
			}
			t.Labels[v1alpha1.ClaimLabel] = kind
			if err := w.Client.Update(ctx, &t); err != nil {
				return err
			}
		}
		Apply(&t.Status, mac, hops)
		t.Status.InfraEnv, t.Status.Claim = "", clip.Text(claim.Why, 512)
		if claim.InfraEnv != "" {
			t.Status.InfraEnv = claim.Namespace + "/" + claim.InfraEnv
		}
		return w.Client.Status().Update(ctx, &t)
	})
}

// unclaimedKey groups the traces of unclaimed MACs in Sweep (no namespace
// is named so).
const unclaimedKey = "_unclaimed"

var errUnclaimedLimit = errors.New("traces of unclaimed MACs are created faster than NewUnclaimed allows")

// Sweep deletes the traces not seen for Retention, and the least recently
// seen past MaxUnclaimed of unclaimed MACs and past MaxByDefault of MACs
// a namespace's PXE default claims.
func (w *Writer) Sweep(ctx context.Context) error {
	w.defaults()
	var list v1alpha1.BootTraceList
	if err := w.Client.List(ctx, &list); err != nil {
		return err
	}
	now := w.Now()
	capped := map[string][]*v1alpha1.BootTrace{} // by namespace, the traces of MACs anyone can make up
	for i := range list.Items {
		t := &list.Items[i]
		if now.Sub(lastSeen(t)) > w.Retention {
			if err := client.IgnoreNotFound(w.Client.Delete(ctx, t)); err != nil {
				return err
			}
			continue
		}
		switch {
		case t.Labels[v1alpha1.ClaimLabel] == v1alpha1.ClaimPXEDefault:
			capped[t.Namespace] = append(capped[t.Namespace], t)
		case Unclaimed(t, w.Namespace):
			capped[unclaimedKey] = append(capped[unclaimedKey], t)
		}
	}
	for ns, traces := range capped {
		max := w.MaxByDefault
		if ns == unclaimedKey {
			max = w.MaxUnclaimed
		}
		if len(traces) <= max {
			continue
		}
		slices.SortFunc(traces, func(a, b *v1alpha1.BootTrace) int { return lastSeen(a).Compare(lastSeen(b)) })
		for _, t := range traces[:len(traces)-max] {
			if err := client.IgnoreNotFound(w.Client.Delete(ctx, t)); err != nil {
				return err
			}
		}
	}
	return nil
}

func lastSeen(t *v1alpha1.BootTrace) time.Time {
	if t.Status.LastSeen != nil {
		return t.Status.LastSeen.Time
	}
	return t.CreationTimestamp.Time
}
