package hostapi

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The gate serves as many requests at once as it has slots, lets one wait
// for a slot freed within its wait, and refuses the rest with turns spread
// at the rate requests finish.
func TestGate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := newGate(2, func() time.Time { return now })
	g.wait = time.Hour // a waiter is let in by a slot freed, not by the timer
	ctx := context.Background()

	leave1, _ := g.enter(ctx)
	leave2, _ := g.enter(ctx)
	if leave1 == nil || leave2 == nil {
		t.Fatal("refused with slots free")
	}
	in := make(chan func())
	go func() {
		leave, _ := g.enter(ctx)
		in <- leave
	}()
	leave1()
	leave3 := <-in
	if leave3 == nil {
		t.Fatal("a waiter was refused although a slot was freed")
	}

	// Full, and no wait: refused, and told to come back no sooner than
	// in a second.
	g.wait = time.Nanosecond
	if leave, retry := g.enter(ctx); leave != nil || retry != time.Second {
		t.Fatalf("full gate: admitted %v, retry %s; want refused, retry 1s (nothing measured yet)", leave != nil, retry)
	}

	// Requests hold a slot 40 ms each: two slots serve 50 a second. The
	// refused then get turns 20 ms apart, the 100th two seconds out.
	leave2()
	leave3()
	for range 100 {
		leave, _ := g.enter(ctx)
		now = now.Add(40 * time.Millisecond)
		leave()
	}
	var last time.Duration
	for i := range 100 {
		retry := g.turn()
		if retry < last {
			t.Fatalf("turn %d is %s, before the one given earlier (%s)", i, retry, last)
		}
		last = retry
	}
	if want := 2 * time.Second; last < want-50*time.Millisecond || last > want+50*time.Millisecond {
		t.Fatalf("the 100th refused at 50 served a second is told %s, want about %s", last, want)
	}
	// Turns end at two minutes: past that, hosts' own backoff spreads
	// them.
	for range 100_000 {
		last = g.turn()
	}
	if last != maxRetryAfter {
		t.Fatalf("turn after 100,000 refusals is %s, want the cap %s", last, maxRetryAfter)
	}
	// A gate of no slots is no gate.
	if leave, _ := newGate(0, time.Now).enter(ctx); leave == nil {
		t.Fatal("no gate refused")
	}
}

// A refusal is a 429 naming the cause, with Retry-After in whole seconds,
// rounded up.
func TestBusyAnswer(t *testing.T) {
	w := httptest.NewRecorder()
	busy(w, 1500*time.Millisecond)
	if w.Code != 429 || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("busy: %d, Retry-After %q; want 429, 2", w.Code, w.Header().Get("Retry-After"))
	}
	if body := w.Body.String(); !strings.Contains(body, `"code":"Busy"`) {
		t.Fatalf("busy body %s names no code Busy", body)
	}
}
