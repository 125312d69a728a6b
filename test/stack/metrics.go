package stack

import (
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric reads a series from controller-runtime's registry, which the
// stack's in-process components report to: a counter's or a gauge's value,
// a histogram's sample count (and its sum), 0 for a series not reported
// yet. The series is the one whose labels include labels.
func Metric(t testing.TB, name string, labels map[string]string) (value, sum float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), 0
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), 0
			}
		}
	}
	return 0, 0
}
