package erase

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// An erase whose result the standards leave open (a format's user-data
// erase may leave zeros, ones, the maker's pattern or noise) is checked by
// changeCheck: random data the agent writes just before (canaries) must
// not read back anywhere, blocks of the previous tenant's data it read just
// before (witnesses) must not read back as they were, and when the erased
// canaries read as one repeated byte, every witness must read as that byte
// too, and so must blocks at random places chosen only after the erase,
// which the drive cannot have been asked about before.
type changeCheck struct {
	canaries, witnesses []canary
	// align is the unit of O_DIRECT reads and writes: the logical block.
	align int64
}

// canary is data at offset: written by the agent, or read from the disk.
type canary struct {
	offset int64
	data   []byte
}

// checkUnit is the size at which blocks are compared: the smallest logical
// block, so that a drive that skipped any block is caught.
const checkUnit = 512

// prepareChangeCheck reads the witnesses and writes the canaries on the
// size-byte disk open as f (with O_DIRECT), and flushes the canaries to
// the device. Canaries go to the first and last MiB and to sampleCount
// blocks of sampleSize spread over the disk (evenly, then at random);
// witnesses are as many blocks elsewhere, chosen the same way.
func prepareChangeCheck(f *os.File, size int64) (changeCheck, error) {
	c := changeCheck{align: logicalBlock(f, size)}
	head := Extent{0, min(edge, size)}
	at := []Extent{head}
	if tail := min(edge, size-head.Length); tail > 0 {
		at = append(at, Extent{size - tail, tail})
	}
	at = c.spread(at, size, false)
	n := len(at)
	at = c.spread(at, size, true)
	buf := alignedBuffer(edge)
	for _, x := range at[n:] {
		b := buf[:x.Length]
		if got, err := f.ReadAt(b, x.Offset); got != len(b) {
			return c, fmt.Errorf("read %d bytes at %d before the erase: got %d: %w", x.Length, x.Offset, got, err)
		}
		c.witnesses = append(c.witnesses, canary{x.Offset, bytes.Clone(b)})
	}
	for _, x := range at[:n] {
		b := buf[:x.Length]
		_, _ = rand.Read(b)
		if err := writeAt(f, b, x.Offset); err != nil {
			return c, fmt.Errorf("write random data to check the erase by, %d bytes at %d: %w", x.Length, x.Offset, err)
		}
		c.canaries = append(c.canaries, canary{x.Offset, bytes.Clone(b)})
	}
	if err := f.Sync(); err != nil {
		return c, fmt.Errorf("flush the random data to check the erase by: %w", err)
	}
	return c, nil
}

// spread adds to taken sampleCount blocks of sampleSize over a size-byte
// disk, evenly spaced for half of them (shifted by half a step between
// them when shift is set) and at random for the rest, leaving out those
// that overlap a block already taken.
func (c changeCheck) spread(taken []Extent, size int64, shift bool) []Extent {
	if size <= sampleSize {
		return taken
	}
	var blocks []Extent
	for i := range sampleCount {
		var pos int64
		if i%2 == 0 {
			step := (size - sampleSize) / sampleCount
			pos = step * int64(i)
			if shift {
				pos += step / 2
			}
		} else {
			var b [8]byte
			_, _ = rand.Read(b[:])
			pos = int64(binary.LittleEndian.Uint64(b[:]) % uint64(size-sampleSize))
		}
		blocks = append(blocks, Extent{pos / c.align * c.align, sampleSize})
	}
	slices.SortFunc(blocks, func(a, b Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	for _, x := range blocks {
		if !slices.ContainsFunc(taken, func(y Extent) bool { return x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length }) {
			taken = append(taken, x)
		}
	}
	return taken
}

// verify reads the canaries and witnesses back through f, the descriptor
// the erase went through (a path could name another device by now), and
// fails at the first block that still holds what it held before.
func (c changeCheck) verify(f *os.File, size int64) (string, error) {
	if len(c.canaries) == 0 {
		return "", errors.New("internal error: no random data was written to check the erase by")
	}
	buf := alignedBuffer(edge)
	read := func(x Extent) ([]byte, error) {
		b := buf[:x.Length]
		if x.Offset < 0 || x.Offset+x.Length > size || x.Offset%c.align != 0 || x.Length%c.align != 0 {
			return nil, fmt.Errorf("internal error: check read %d+%d on a %d-byte disk", x.Offset, x.Length, size)
		}
		if n, err := f.ReadAt(b, x.Offset); n != len(b) {
			return nil, fmt.Errorf("read %d bytes at %d: got %d: %w", x.Length, x.Offset, n, err)
		}
		return b, nil
	}
	// What the erased canaries read as: one repeated byte, or noise.
	pattern, uniform := -1, true
	for _, x := range c.canaries {
		b, err := read(Extent{x.offset, int64(len(x.data))})
		if err != nil {
			return "", err
		}
		for i := 0; i < len(b); i += checkUnit {
			if bytes.Equal(b[i:i+checkUnit], x.data[i:i+checkUnit]) {
				return "", fmt.Errorf("the %d bytes at %d still hold the random data written there just before the erase", checkUnit, x.offset+int64(i))
			}
		}
		if pattern < 0 {
			pattern = int(b[0])
		}
		uniform = uniform && repeats(b, byte(pattern))
	}
	held := 0
	for _, x := range c.witnesses {
		b, err := read(Extent{x.offset, int64(len(x.data))})
		if err != nil {
			return "", err
		}
		for i := 0; i < len(b); i += checkUnit {
			before, after := x.data[i:i+checkUnit], b[i:i+checkUnit]
			if !repeats(before, before[0]) {
				held++
				if bytes.Equal(after, before) {
					return "", fmt.Errorf("the %d bytes at %d read back as they did before the erase", checkUnit, x.offset+int64(i))
				}
			}
			if uniform && !repeats(after, byte(pattern)) {
				return "", fmt.Errorf("the %d bytes at %d do not read as 0x%02x, as every erased block the agent wrote before does", checkUnit, x.offset+int64(i), pattern)
			}
		}
	}
	result := "the erased blocks read as noise, so the others were checked for change only"
	if uniform {
		fresh, err := c.readFresh(f, size, byte(pattern), read)
		if err != nil {
			return "", err
		}
		result = fmt.Sprintf("every block read, and %d %d KiB blocks at random places chosen after the erase, reads as 0x%02x", fresh, sampleSize>>10, pattern)
	}
	return fmt.Sprintf("random data written just before the erase to %d places (the first and last MiB, sampled %d KiB blocks) no longer reads back in any %d-byte block, "+
		"and none of %d blocks of %d bytes that held data at %d other sampled places reads back as before; %s (%s)",
		len(c.canaries), sampleSize>>10, checkUnit, held, checkUnit, len(c.witnesses), result, howRead(f)), nil
}

// readFresh reads sampleCount/2 blocks at random places chosen now and
// requires each to read as v; it returns how many it read.
func (c changeCheck) readFresh(f *os.File, size int64, v byte, read func(Extent) ([]byte, error)) (int, error) {
	if size <= sampleSize {
		return 0, nil
	}
	n := 0
	for range sampleCount / 2 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		pos := int64(binary.LittleEndian.Uint64(b[:])%uint64(size-sampleSize)) / c.align * c.align
		got, err := read(Extent{pos, sampleSize})
		if err != nil {
			return n, err
		}
		for i := 0; i < len(got); i += checkUnit {
			if !repeats(got[i:i+checkUnit], v) {
				return n, fmt.Errorf("the %d bytes at %d do not read as 0x%02x, as every erased block the agent wrote before does", checkUnit, pos+int64(i), v)
			}
		}
		n++
	}
	return n, nil
}

// repeats reports whether b is made of the byte v alone: its first byte
// is v, and each byte equals the one before it.
func repeats(b []byte, v byte) bool {
	return len(b) == 0 || b[0] == v && bytes.Equal(b[1:], b[:len(b)-1])
}

// logicalBlock is the device's logical block size (BLKSSZGET), which
// O_DIRECT I/O must be aligned to; for a file, 4096 unless the size is
// not a multiple of it.
func logicalBlock(f *os.File, size int64) int64 {
	if n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && n >= 512 {
		return int64(n)
	}
	if size%4096 != 0 {
		return 512
	}
	return 4096
}

// deviceSize is the size of the device (BLKGETSIZE64) or file open as f.
func deviceSize(f *os.File) (int64, error) {
	var n uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); errno == 0 {
		return int64(n), nil
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// howRead says whether reads through f reach the device or the page cache.
func howRead(f *os.File) string {
	if flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err == nil && flags&unix.O_DIRECT != 0 {
		return "read with O_DIRECT"
	}
	return "read through the page cache: O_DIRECT was refused"
}

// formatNVM formats the namespace open as f with secure erase setting ses,
// reporting progress every formatPoll: the drive's own estimate where it
// keeps one (the Format Progress Indicator), otherwise none, which still
// tells the service the host is alive. A drive without the indicator is
// sent nothing while it formats: a command some firmware holds until the
// format is done would, past the kernel's timeout, make the kernel reset
// the controller and so abort the format. The poll waits as long as the
// format may take, for the same reason.
func formatNVM(d Drive, f *os.File, size int64, ses uint32, progress Progress) error {
	timeout := formatTimeout(size)
	_, indicator := d.FormatProgress(f, 0)
	progress(0, size)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(formatPoll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				frac := 0.0
				if indicator {
					frac, _ = d.FormatProgress(f, timeout)
				}
				progress(int64(frac*float64(size)), size)
			}
		}
	}()
	start := time.Now()
	err := d.FormatNVM(f, ses, timeout)
	close(stop)
	<-done
	if err != nil && time.Since(start) >= timeout {
		return fmt.Errorf("no answer within %s, so the kernel gave up on it (and reset the controller): %w", timeout, err)
	}
	if err != nil {
		return err
	}
	progress(size, size)
	after, err := deviceSize(f)
	if err != nil {
		return fmt.Errorf("size after the format: %w", err)
	}
	if after != size {
		return fmt.Errorf("the namespace is %d bytes after the format, %d before", after, size)
	}
	return nil
}

// formatPoll is how often a running format's progress is reported: twice
// as often as the agent passes reports on (every 10 s), so that none is
// more than 10 s apart.
var formatPoll = 5 * time.Second

// formatTimeout is how long the kernel waits for a format before it gives
// up on the drive. The standard sets no bound: a drive that erases by
// writing every block takes as long as writing it, and 20 MiB/s is slower
// than any NVMe drive writes.
func formatTimeout(size int64) time.Duration {
	return max(10*time.Minute, time.Duration(size/(20<<20))*time.Second)
}

func (t Target) driveOrKernel() Drive { return Options{Drive: t.drive}.drive() }
