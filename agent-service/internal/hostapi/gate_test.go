package hostapi

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The gate serves as many requests at once as it has slots, one InfraEnv
// at most half of them; lets one wait for a slot freed within its wait;
// and refuses the rest with turns of their InfraEnv's own, spread at the
// rate requests are served, never queued more than two minutes ahead.
func TestGate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := newGate(4, func() time.Time { return now })
	g.wait = time.Hour // a waiter is let in by a slot freed, not by the timer
	ctx := context.Background()

	a1, _ := g.enter(ctx, "a")
	a2, _ := g.enter(ctx, "a")
	if a1 == nil || a2 == nil {
		t.Fatal("refused with slots free")
	}
	if leave, retry := g.enter(ctx, "a"); leave != nil || retry != time.Second {
		t.Fatalf("a third request of an InfraEnv holding half the slots: admitted %v, retry %s; want refused at once, retry 1s", leave != nil, retry)
	}
	b1, _ := g.enter(ctx, "b")
	b2, _ := g.enter(ctx, "b")
	if b1 == nil || b2 == nil {
		t.Fatal("another InfraEnv refused the half left to it")
	}
	in := make(chan func())
	go func() {
		leave, _ := g.enter(ctx, "c")
		in <- leave
	}()
	a1()
	c1 := <-in
	if c1 == nil {
		t.Fatal("a waiter was refused although a slot was freed")
	}

	// Full, and no wait: refused, and told to come back no sooner than
	// in a second.
	g.wait = time.Nanosecond
	if leave, retry := g.enter(ctx, "c"); leave != nil || retry != time.Second {
		t.Fatalf("full gate: admitted %v, retry %s; want refused, retry 1s", leave != nil, retry)
	}

	// Requests hold a slot 40 ms each: an InfraEnv's share of two serves
	// 50 a second. Its refused get turns 20 ms apart, the 100th two
	// seconds out; another InfraEnv's first turn is not behind them.
	a2()
	b1()
	b2()
	c1()
	for range 100 {
		leave, _ := g.enter(ctx, "a")
		now = now.Add(40 * time.Millisecond)
		leave()
	}
	var last time.Duration
	for i := range 100 {
		retry := g.turn("a")
		if retry < last {
			t.Fatalf("turn %d is %s, before the one given earlier (%s)", i, retry, last)
		}
		last = retry
	}
	if want := 2 * time.Second; last < want-50*time.Millisecond || last > want+50*time.Millisecond {
		t.Fatalf("the 100th refused at 50 served a second is told %s, want about %s", last, want)
	}
	if other := g.turn("b"); other != time.Second {
		t.Fatalf("another InfraEnv's first turn is %s, behind the first's queue; want 1s", other)
	}
	// Turns end at two minutes, and the queue does not run further
	// ahead: two minutes on, turns are short again.
	for range 100_000 {
		last = g.turn("a")
	}
	if last != maxRetryAfter {
		t.Fatalf("turn after 100,000 refusals is %s, want the cap %s", last, maxRetryAfter)
	}
	now = now.Add(maxRetryAfter + time.Second)
	if retry := g.turn("a"); retry != time.Second {
		t.Fatalf("two minutes after a flood of refusals, a turn is %s; want 1s", retry)
	}
	// Four InfraEnvs waiting share the slots: each one's turns come 40 ms
	// apart (the four slots free up every 10 ms), the 100th four seconds
	// out.
	now = now.Add(maxRetryAfter + time.Second)
	for range 100 {
		for _, ie := range []string{"w", "x", "y", "z"} {
			last = g.turn(ie)
		}
	}
	if want := 4 * time.Second; last < want-100*time.Millisecond || last > want+100*time.Millisecond {
		t.Fatalf("the 100th turn of four InfraEnvs waiting is %s, want about %s", last, want)
	}
	// A gate of no slots is no gate.
	if leave, _ := newGate(0, time.Now).enter(ctx, "a"); leave == nil {
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
