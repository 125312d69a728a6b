package kvmguest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	spin := func() error {
		for {
			select {
			case <-release:
				return nil
			default:
			}
		}
	}
	stalled := func() error { <-release; return nil }
	broken := errors.New("KVM_RUN: internal error")

	for name, tc := range map[string]struct {
		f    func() error
		want string
	}{
		"guest ends":      {func() error { return nil }, ""},
		"guest fails":     {func() error { return broken }, broken.Error()},
		"vCPU spins":      {spin, "did not end after"},
		"vCPU never runs": {stalled, "did not end within 1s"},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := bounded(tc.f, 200*time.Millisecond, time.Second)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			// A spinning vCPU is judged by its CPU time, well before the wall limit.
			if name == "vCPU spins" {
				require.Less(t, time.Since(start), time.Second)
			}
		})
	}
}
