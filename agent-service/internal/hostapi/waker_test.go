package hostapi

import "testing"

// A wake reaches every watcher of its key, once, and no other key's; one
// heartbeat per key is held, at most Max in all; shutting down wakes every
// watcher and holds nothing more.
func TestWaker(t *testing.T) {
	w := Waker{Max: 2}
	a1, stopA1 := w.Watch("a")
	a2, _ := w.Watch("a")
	b, stopB := w.Watch("b")
	w.Wake("a")
	for i, ch := range []<-chan struct{}{a1, a2} {
		select {
		case <-ch:
		default:
			t.Fatalf("watcher %d of a not woken", i)
		}
	}
	select {
	case <-b:
		t.Fatal("b woken by a's wake")
	default:
	}
	stopA1() // after its wake: nothing to forget
	w.Wake("a")
	stopB()
	if len(w.watchers) != 0 {
		t.Fatalf("%d keys still watched after every watcher was woken or stopped", len(w.watchers))
	}
	w.Wake("b") // no watcher: nothing to close twice

	releaseA, ok := w.Hold("a")
	if !ok {
		t.Fatal("the first heartbeat of a not held")
	}
	if _, ok := w.Hold("a"); ok {
		t.Fatal("a second heartbeat of a held: one host would hold as many as its rate limit lets it send")
	}
	if _, ok := w.Hold("b"); !ok {
		t.Fatal("b not held")
	}
	if _, ok := w.Hold("c"); ok {
		t.Fatal("a third heartbeat held past Max 2")
	}
	if w.Held() != 2 {
		t.Fatalf("held %d, want 2", w.Held())
	}
	releaseA()
	if _, ok := w.Hold("a"); !ok {
		t.Fatal("a's heartbeat not held again after the first was released")
	}

	c, _ := w.Watch("c")
	w.Shutdown()
	select {
	case <-c:
	default:
		t.Fatal("a held heartbeat not woken by the shutdown")
	}
	if _, ok := w.Hold("d"); ok {
		t.Fatal("a heartbeat held after the shutdown")
	}
	if d, _ := w.Watch("d"); d != nil {
		select {
		case <-d:
		default:
			t.Fatal("a watch begun after the shutdown waits")
		}
	}
}
