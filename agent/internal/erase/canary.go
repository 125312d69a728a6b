package erase

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"time"
)

// canary is random data written at offset just before an erase whose
// result the standards leave open (zeros, ones, the maker's pattern,
// noise): afterwards no logical block of it may read back as written.
type canary struct {
	offset int64
	data   []byte
}

// checkUnit is the block size at which a canary is compared: the smallest
// logical block, so that a drive that skipped any block is caught.
const checkUnit = 512

// plantCanaries writes random data to the first and last MiB of the
// size-byte disk open as f and to sampleCount blocks of sampleSize spread
// over it (evenly, then at random offsets a drive cannot predict), flushes
// it to the device, and returns what it wrote.
func plantCanaries(f *os.File, size int64) ([]canary, error) {
	// O_DIRECT writes are aligned to the logical block size: a disk whose
	// size is not a multiple of 4096 has 512-byte blocks.
	align := int64(4096)
	if size%4096 != 0 {
		align = 512
	}
	// The first and last MiB always; samples that overlap them or an
	// earlier sample are left out, so that no canary writes over another.
	head := Extent{0, min(edge, size)}
	at := []Extent{head}
	if tail := min(edge, size-head.Length); tail > 0 {
		at = append(at, Extent{size - tail, tail})
	}
	var samples []Extent
	if size > sampleSize {
		for i := range sampleCount {
			var pos int64
			if i%2 == 0 {
				pos = (size - sampleSize) / sampleCount * int64(i)
			} else {
				var b [8]byte
				_, _ = rand.Read(b[:])
				pos = int64(binary.LittleEndian.Uint64(b[:]) % uint64(size-sampleSize))
			}
			samples = append(samples, Extent{pos / align * align, sampleSize})
		}
	}
	slices.SortFunc(samples, func(a, b Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	overlaps := func(x Extent) bool {
		return slices.ContainsFunc(at, func(y Extent) bool { return x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length })
	}
	for _, x := range samples {
		if !overlaps(x) {
			at = append(at, x)
		}
	}
	var out []canary
	buf := alignedBuffer(edge)
	for _, x := range at {
		b := buf[:x.Length]
		_, _ = rand.Read(b)
		if err := writeAt(f, b, x.Offset); err != nil {
			return nil, fmt.Errorf("write random data to check the erase by, %d bytes at %d: %w", x.Length, x.Offset, err)
		}
		out = append(out, canary{x.Offset, bytes.Clone(b)})
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("flush the random data to check the erase by: %w", err)
	}
	return out, nil
}

// verifyChanged reads every canary back from the device and fails at the
// first logical block that still holds what was written there.
func verifyChanged(path string, canaries []canary) (string, error) {
	if len(canaries) == 0 {
		return "", fmt.Errorf("internal error: no random data was written to check the erase by")
	}
	f, how, err := openForCheck(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := alignedBuffer(edge)
	var read, zeros int64
	for _, c := range canaries {
		b := buf[:len(c.data)]
		if n, err := f.ReadAt(b, c.offset); n != len(b) {
			return "", fmt.Errorf("read %d bytes at %d: got %d: %w", len(b), c.offset, n, err)
		}
		for i := 0; i < len(b); i += checkUnit {
			unit := b[i:min(i+checkUnit, len(b))]
			if bytes.Equal(unit, c.data[i:i+len(unit)]) {
				return "", fmt.Errorf("the %d bytes at %d still hold the random data written there just before the erase", len(unit), c.offset+int64(i))
			}
			if !slices.ContainsFunc(unit, func(c byte) bool { return c != 0 }) {
				zeros += int64(len(unit))
			}
		}
		read += int64(len(b))
	}
	return fmt.Sprintf("random data written just before the erase to %d places (the first and last MiB, sampled %d KiB blocks) no longer reads back in any %d-byte block; %d%% of it reads as zeros (%s)",
		len(canaries), sampleSize>>10, checkUnit, 100*zeros/max(read, 1), how), nil
}

// formatTimeout is how long the kernel waits for a format before it gives
// up on the drive. The standard sets no bound: a drive that erases by
// writing every block takes as long as writing it, and 20 MiB/s is slower
// than any NVMe drive writes.
func formatTimeout(size int64) time.Duration {
	return max(10*time.Minute, time.Duration(size/(20<<20))*time.Second)
}

func (t Target) driveOrKernel() Drive { return Options{Drive: t.drive}.drive() }
