// Package serve runs a component's network servers as one: each serves on
// its own goroutine of an errgroup; the first that fails stops the others,
// and the end of the context stops them all, at once (HTTP servers finish
// their requests within a grace period, then are closed). Start methods of the image service, the agent API and the
// PXE service share it instead of each wiring goroutines and channels.
package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Task is one server: Serve blocks until Stop makes it return, or it fails.
type Task struct {
	Name  string
	Serve func() error
	Stop  func(ctx context.Context)
}

// HTTP serves srv on l; Stop is a graceful shutdown, and closes l also
// when Serve never ran.
func HTTP(name string, srv *http.Server, l net.Listener) Task {
	return Task{
		Name:  name,
		Serve: func() error { return srv.Serve(l) },
		Stop: func(ctx context.Context) {
			if srv.Shutdown(ctx) != nil {
				// The grace period ended with requests still running
				// (a long download): cut them.
				_ = srv.Close()
			}
			_ = l.Close()
		},
	}
}

// StopAll releases tasks that were set up (their sockets open) but will not
// be run, as when a later listen fails.
func StopAll(tasks []Task) {
	for _, t := range tasks {
		t.Stop(context.Background())
	}
}

// Run serves every task until ctx ends (nil) or one fails (its error, named;
// the others are stopped first). A task that returns without being stopped
// has failed too.
func Run(ctx context.Context, grace time.Duration, tasks ...Task) error {
	g, gctx := errgroup.WithContext(ctx)
	var stopping atomic.Bool
	for _, t := range tasks {
		g.Go(func() error {
			err := t.Serve()
			if stopping.Load() {
				return nil
			}
			if err == nil || errors.Is(err, http.ErrServerClosed) {
				err = errors.New("stopped unexpectedly")
			}
			return fmt.Errorf("%s: %w", t.Name, err)
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		stopping.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		// All at once: each gets the whole grace period.
		var stops sync.WaitGroup
		for _, t := range tasks {
			stops.Go(func() { t.Stop(sctx) })
		}
		stops.Wait()
		return nil
	})
	return g.Wait()
}
