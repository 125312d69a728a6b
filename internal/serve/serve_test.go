package serve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func httpTask(t *testing.T, name string) (Task, string) {
	l := listen(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(name)) }), ReadHeaderTimeout: time.Second}
	return HTTP(name, srv, l), "http://" + l.Addr().String()
}

func serving(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func waitServing(t *testing.T, url string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); !serving(url); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered", url)
		}
	}
}

// The end of the context stops every server, and that is no error.
func TestRunStopsAllWithTheContext(t *testing.T) {
	a, urlA := httpTask(t, "a")
	b, urlB := httpTask(t, "b")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, time.Second, a, b) }()
	waitServing(t, urlA)
	waitServing(t, urlB)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after the context ended", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if serving(urlA) || serving(urlB) {
		t.Fatal("a server still answers after Run returned")
	}
}

// A request still running when the grace period ends is cut, and Run
// returns.
func TestRunCutsWhatOutlastsTheGracePeriod(t *testing.T) {
	l := listen(t)
	started, cut := make(chan struct{}), make(chan struct{})
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // a download that never ends by itself
		close(cut)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, 200*time.Millisecond, HTTP("slow", srv, l)) }()
	go func() {
		if resp, err := http.Get("http://" + l.Addr().String()); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run waited for a request past the grace period")
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the request outlived Run: its connection was not closed")
	}
}

// One server failing stops the others and is reported by name; one that
// returns by itself has failed too.
func TestRunStopsAllWhenOneFails(t *testing.T) {
	for _, tc := range []struct {
		serve func() error
		want  string
	}{
		{func() error { return errors.New("socket gone") }, "dhcp: socket gone"},
		{func() error { return nil }, "dhcp: stopped unexpectedly"},
	} {
		a, urlA := httpTask(t, "a")
		failing := Task{Name: "dhcp", Serve: func() error {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for deadline := time.Now().Add(10 * time.Second); !serving(urlA) && time.Now().Before(deadline); <-tick.C {
			}
			return tc.serve()
		}, Stop: func(context.Context) {}}
		err := Run(context.Background(), time.Second, a, failing)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("Run = %v, want %q", err, tc.want)
		}
		if serving(urlA) {
			t.Fatal("the HTTP server still answers after another task failed")
		}
	}
}
