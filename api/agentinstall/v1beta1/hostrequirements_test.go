package v1beta1

import (
	"math"
	"testing"
)

// A tenant writes these numbers: no value may overflow into a negative (or
// tiny) requirement.
func TestHostRequirementBytes(t *testing.T) {
	var none *HostRequirements
	for _, tc := range []struct {
		h         *HostRequirements
		disk, mem int64
	}{
		{none, 0, 0},
		{&HostRequirements{}, 0, 0},
		{&HostRequirements{MinDiskSizeGB: 120, MinMemoryMiB: 16384}, 120_000_000_000, 16 << 30},
		{&HostRequirements{MinDiskSizeGB: math.MaxInt64, MinMemoryMiB: math.MaxInt64}, math.MaxInt64 / 1_000_000_000 * 1_000_000_000, math.MaxInt64 >> 20 << 20},
		{&HostRequirements{MinDiskSizeGB: 9_223_372_037, MinMemoryMiB: 1 << 44}, math.MaxInt64 / 1_000_000_000 * 1_000_000_000, math.MaxInt64 >> 20 << 20},
	} {
		if got := tc.h.MinDiskSizeBytes(); got != tc.disk || got < 0 {
			t.Errorf("%+v: MinDiskSizeBytes = %d, want %d", tc.h, got, tc.disk)
		}
		if got := tc.h.MinMemoryBytes(); got != tc.mem || got < 0 {
			t.Errorf("%+v: MinMemoryBytes = %d, want %d", tc.h, got, tc.mem)
		}
	}
}
