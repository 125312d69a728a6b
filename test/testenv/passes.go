package testenv

import (
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Pass is one finished reconcile pass and what it returned.
type Pass struct {
	Result ctrl.Result
	Err    error
}

// Passes records a controller's finished reconcile passes by object (give
// Observe to a component's Passes hook), so that a test waits for the
// controller to have looked again, not for the wall clock: "nothing
// happened" holds after two passes that began after the change, however
// slow the machine.
type Passes struct {
	mu     sync.Mutex
	seen   map[types.NamespacedName][]Pass
	signal chan struct{}
}

// NewPasses returns an empty record.
func NewPasses() *Passes {
	return &Passes{seen: map[types.NamespacedName][]Pass{}, signal: make(chan struct{})}
}

// Observe records a pass; it is the hook controllers call.
func (p *Passes) Observe(key types.NamespacedName, res ctrl.Result, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[key] = append(p.seen[key], Pass{Result: res, Err: err})
	close(p.signal)
	p.signal = make(chan struct{})
}

// Mark is a point in an object's passes to wait from.
type Mark struct {
	key  types.NamespacedName
	from int
}

// Mark returns the point after the passes of key finished so far.
func (p *Passes) Mark(key types.NamespacedName) Mark {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Mark{key: key, from: len(p.seen[key])}
}

// Since is how many passes of the object finished since m.
func (p *Passes) Since(m Mark) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen[m.key]) - m.from
}

// Await waits for n more passes of the object since m and returns them.
// Mark before the change; two passes after it include one that began
// after it. It fails the test after a minute.
func (p *Passes) Await(t testing.TB, m Mark, n int) []Pass {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		got, wake := p.seen[m.key], p.signal
		p.mu.Unlock()
		if len(got) >= m.from+n {
			return append([]Pass(nil), got[m.from:m.from+n]...)
		}
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("%s: %d passes in a minute, want %d", m.key, len(got)-m.from, n)
			return nil
		}
	}
}

// Settle waits for two more passes of key than now, the second of which
// began after the call: whatever the controller's cache held at that
// moment was looked at. (A write the test made a moment ago may not have
// reached the cache yet; where the controller shows that it saw it, wait
// for that instead.)
func (p *Passes) Settle(t testing.TB, key types.NamespacedName) {
	t.Helper()
	p.Await(t, p.Mark(key), 2)
}
