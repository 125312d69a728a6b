package gate

import (
	"context"
	"testing"
	"time"
)

// The gate serves as many requests at once as it has slots, one InfraEnv
// at most half of them; lets one wait for a slot freed within its wait;
// and refuses the rest with turns of their InfraEnv's own, spread at the
// rate requests are served, never queued more than two minutes ahead.
func TestGate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := New(4, 2, 250*time.Millisecond, func() time.Time { return now })
	g.wait = time.Hour // a waiter is let in by a slot freed, not by the timer
	ctx := context.Background()

	a1, _ := g.Enter(ctx, "a")
	a2, _ := g.Enter(ctx, "a")
	if a1 == nil || a2 == nil {
		t.Fatal("refused with slots free")
	}
	if leave, refused := g.Enter(ctx, "a"); leave != nil || refused == nil || refused.RetryAfter != time.Second || !refused.Share {
		t.Fatalf("a third request of an InfraEnv holding half the slots: admitted %v, refused %+v; want refused at once for its share, retry 1s", leave != nil, refused)
	}
	b1, _ := g.Enter(ctx, "b")
	b2, _ := g.Enter(ctx, "b")
	if b1 == nil || b2 == nil {
		t.Fatal("another InfraEnv refused the half left to it")
	}
	in := make(chan func())
	go func() {
		leave, _ := g.Enter(ctx, "c")
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
	if leave, refused := g.Enter(ctx, "c"); leave != nil || refused == nil || refused.RetryAfter != time.Second || refused.Share {
		t.Fatalf("full gate: admitted %v, refused %+v; want refused for the full gate, retry 1s", leave != nil, refused)
	}

	// Requests hold a slot 40 ms each: an InfraEnv's share of two serves
	// 50 a second. Its refused get turns 20 ms apart, the 100th two
	// seconds out; another InfraEnv's first turn is not behind them.
	a2()
	b1()
	b2()
	c1()
	for range 100 {
		leave, _ := g.Enter(ctx, "a")
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
	if last != MaxRetryAfter {
		t.Fatalf("turn after 100,000 refusals is %s, want the cap %s", last, MaxRetryAfter)
	}
	now = now.Add(MaxRetryAfter + time.Second)
	if retry := g.turn("a"); retry != time.Second {
		t.Fatalf("two minutes after a flood of refusals, a turn is %s; want 1s", retry)
	}
	// Four InfraEnvs waiting share the slots: each one's turns come 40 ms
	// apart (the four slots free up every 10 ms), the 100th four seconds
	// out.
	now = now.Add(MaxRetryAfter + time.Second)
	for range 100 {
		for _, ie := range []string{"w", "x", "y", "z"} {
			last = g.turn(ie)
		}
	}
	if want := 4 * time.Second; last < want-100*time.Millisecond || last > want+100*time.Millisecond {
		t.Fatalf("the 100th turn of four InfraEnvs waiting is %s, want about %s", last, want)
	}
	// A gate of no slots is no gate.
	if leave, _ := New(0, 0, time.Second, time.Now).Enter(ctx, "a"); leave == nil {
		t.Fatal("no gate refused")
	}
}
