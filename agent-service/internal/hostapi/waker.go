package hostapi

import "sync"

// Waker holds heartbeats (agentwire.InstructionsRequest.WaitSeconds) and
// tells them that something about their Agent changed: the Agent itself
// (approved, bound) or its installation's handover. Keys are Agent UIDs.
// It is fed by the informers of the cache the agent API reads from, so a
// heartbeat woken finds the change in the cache. One heartbeat per Agent
// is held at a time, and at most Max in all: past either, heartbeats are
// answered at once, as from agents that do not ask to be held.
type Waker struct {
	// Max is the most heartbeats held at once (DefaultMaxHeld).
	Max int

	mu       sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
	holding  map[string]struct{}
	closed   bool
}

// DefaultMaxHeld bounds the heartbeats one replica holds: about 75 KiB
// each (make bench-agents with every host held: 7,500 held took the
// manager from 425 to 987 MiB), so at most about 370 MiB.
const DefaultMaxHeld = 5000

// Hold claims key's one held heartbeat; ok is false when key already has
// one, Max are held, or the service is shutting down.
func (w *Waker) Hold(key string) (release func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holding == nil {
		w.holding = map[string]struct{}{}
	}
	limit := w.Max
	if limit <= 0 {
		limit = DefaultMaxHeld
	}
	if _, held := w.holding[key]; held || w.closed || len(w.holding) >= limit {
		return nil, false
	}
	w.holding[key] = struct{}{}
	heldHeartbeats.Inc()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.holding, key)
		heldHeartbeats.Dec()
	}, true
}

// Held is how many heartbeats are held now.
func (w *Waker) Held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.holding)
}

// Watch returns a channel closed at the next Wake of key (or at
// Shutdown), and what stops watching.
func (w *Waker) Watch(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		close(ch)
		return ch, func() {}
	}
	if w.watchers == nil {
		w.watchers = map[string]map[chan struct{}]struct{}{}
	}
	if w.watchers[key] == nil {
		w.watchers[key] = map[chan struct{}]struct{}{}
	}
	w.watchers[key][ch] = struct{}{}
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.watchers[key][ch]; ok {
			delete(w.watchers[key], ch)
			if len(w.watchers[key]) == 0 {
				delete(w.watchers, key)
			}
		}
	}
}

// Wake wakes every heartbeat watching key.
func (w *Waker) Wake(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.watchers[key] {
		close(ch)
	}
	delete(w.watchers, key)
}

// Shutdown answers every held heartbeat now and holds no more: the
// replica is going away, and its hosts should come back to another one
// rather than lose their requests with it.
func (w *Waker) Shutdown() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	for key, chs := range w.watchers {
		for ch := range chs {
			close(ch)
		}
		delete(w.watchers, key)
	}
}

// ShuttingDown reports whether Shutdown was called.
func (w *Waker) ShuttingDown() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}
