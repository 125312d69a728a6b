package hostapi

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentboot/agentboot/internal/gate"
)

// One host's requests arrive concurrently; the limiter is shared by them
// (go test -race notices an unguarded write), allows the burst and no more,
// and forgets keys idle for ten minutes.
func TestLimiterConcurrent(t *testing.T) {
	now := time.Unix(1_700_000_000-1_700_000_000%64+1, 0) // not a cleanup second
	s := &Server{o: Options{Now: func() time.Time { return now }}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.allow("host/ns/a", 2, 20) {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if allowed != 20 {
		t.Fatalf("allowed %d of 50 at once, want the burst of 20", allowed)
	}
	now = now.Add(11*time.Minute - time.Duration(now.Add(11*time.Minute).Unix()%64)*time.Second) // a cleanup second
	s.allow("host/ns/b", 2, 20)
	if _, ok := s.limiters.Load("host/ns/a"); ok {
		t.Fatal("a key idle for over ten minutes is kept")
	}
}

// A refusal is a 429 naming the cause, with Retry-After in whole seconds,
// rounded up.
func TestBusyAnswer(t *testing.T) {
	w := httptest.NewRecorder()
	busy(w, &gate.Refused{RetryAfter: 1500 * time.Millisecond})
	if w.Code != 429 || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("busy: %d, Retry-After %q; want 429, 2", w.Code, w.Header().Get("Retry-After"))
	}
	if body := w.Body.String(); !strings.Contains(body, `"code":"Busy"`) {
		t.Fatalf("busy body %s names no code Busy", body)
	}
}
