package baremetalhost

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// One address at a time; different addresses in parallel; nothing kept once
// every holder is done.
func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	var inside atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := k.lock("bmc-a")
			if n := inside.Add(1); n != 1 {
				t.Errorf("%d holders of one address at once", n)
			}
			for range 100 {
				runtime.Gosched() // let the others try to get in
			}
			inside.Add(-1)
			unlock()
		}()
	}
	wg.Wait()

	unlockA := k.lock("bmc-a")
	done := make(chan struct{})
	go func() {
		k.lock("bmc-b")()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("another address waited for bmc-a's holder")
	}
	unlockA()

	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.locks) != 0 {
		t.Fatalf("entries kept after every holder left: %v", k.locks)
	}
}
