package kvmguest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestBounded(t *testing.T) {
	broken := errors.New("KVM_RUN: internal error")
	// A guest that does not end is given up on by its bound, and then
	// told to stop: its thread must not go on spinning (or waiting).
	spin := func(ended chan struct{}) func(*atomic.Bool) error {
		return func(stop *atomic.Bool) error {
			defer close(ended)
			for !stop.Load() {
			}
			return nil
		}
	}
	// A vCPU that never runs is a thread blocked in the kernel: only the
	// signal bounded sends when it gives up wakes it (nanosleep, like
	// KVM_RUN, returns EINTR), and then it sees the stop flag.
	stall := func(ended chan struct{}) func(*atomic.Bool) error {
		return func(stop *atomic.Bool) error {
			defer close(ended)
			for !stop.Load() {
				_ = unix.Nanosleep(&unix.Timespec{Sec: 3600}, nil)
			}
			return nil
		}
	}
	// Each case's other bound is out of reach, so that the bound named is
	// the one that decides however loaded the machine is.
	for name, tc := range map[string]struct {
		f         func(chan struct{}) func(*atomic.Bool) error
		cpu, wall time.Duration
		want      string
	}{
		"guest ends": {func(e chan struct{}) func(*atomic.Bool) error {
			close(e)
			return func(*atomic.Bool) error { return nil }
		}, time.Hour, time.Hour, ""},
		"guest fails": {func(e chan struct{}) func(*atomic.Bool) error {
			close(e)
			return func(*atomic.Bool) error { return broken }
		}, time.Hour, time.Hour, broken.Error()},
		"vCPU spins":      {spin, 200 * time.Millisecond, time.Hour, "did not end after"},
		"vCPU never runs": {stall, time.Hour, time.Second, "did not end within 1s"},
	} {
		t.Run(name, func(t *testing.T) {
			ended := make(chan struct{})
			err := bounded(tc.f(ended), tc.cpu, tc.wall)
			if tc.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.want)
			}
			select {
			case <-ended:
			case <-time.After(time.Minute):
				t.Fatal("the guest's thread was left running after its bound")
			}
		})
	}
}
