// Package stats is the benchmarks' arithmetic on measured durations.
package stats

import (
	"slices"
	"time"
)

// Percentile is the p-th percentile of ds (p 100: the largest), the
// nearest rank; 0 when there is none. ds is not changed.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
