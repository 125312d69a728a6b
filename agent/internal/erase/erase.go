package erase

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// Progress receives the bytes done of the total as an erase goes.
type Progress func(done, total int64)

// Methods this agent carries out. NVMe sanitize, the NVMe format with a
// cryptographic erase and the ATA security erase are decided by
// internal/sanitize but not sent (docs/security.md): no device the lab can
// emulate has them, and a command never run against a device is not sent
// to a customer's drives. Supported masks them, so such disks get the next
// method their device offers.
var executable = map[sanitize.Method]bool{
	sanitize.Skip:               true,
	sanitize.WipeMetadata:       true,
	sanitize.WriteZeroes:        true,
	sanitize.NVMeFormatUserData: true,
	sanitize.Overwrite:          true,
}

// Sent lists the methods of the erase level this agent sends, in
// internal/sanitize's order.
func Sent() []sanitize.Method {
	var out []sanitize.Method
	for _, m := range sanitize.Methods() {
		if executable[m] && m.ErasesEveryBlock() {
			out = append(out, m)
		}
	}
	return out
}

// Supported is dev without the capabilities whose commands this agent does
// not send, so that the decision is one the agent can carry out.
func Supported(dev sanitize.Device) sanitize.Device {
	dev.NVMeSanitizeCrypto, dev.NVMeSanitizeBlock = false, false
	dev.NVMeFormatCrypto = false
	dev.ATASecurityErase, dev.ATAEnhancedErase = false, false
	return dev
}

const (
	chunk       = 4 << 20  // overwrite step, the unit of progress and cancellation
	syncEvery   = 1 << 30  // overwrite flushes this often, so dirty pages never pile up
	edge        = 1 << 20  // first and last MiB of a disk or partition
	sampleSize  = 64 << 10 // one verification read
	sampleCount = 256
)

// Run carries out plan on t and verifies it. A disk it cannot verify is an
// error: the caller keeps the host quarantined.
func Run(ctx context.Context, t Target, plan sanitize.Plan, progress Progress) (agentwire.DiskSanitization, error) {
	ev := agentwire.DiskSanitization{Disk: t.Path, Method: string(plan.Method), Why: plan.Why, Verification: string(plan.Verify)}
	if plan.Method == sanitize.Unerasable {
		return ev, fmt.Errorf("disk %s: %s", t.Path, plan.Why)
	}
	if !executable[plan.Method] {
		return ev, fmt.Errorf("disk %s: method %s is not one this agent carries out", t.Path, plan.Method)
	}
	if plan.Method == sanitize.Skip {
		return ev, nil
	}
	if progress == nil {
		progress = func(int64, int64) {}
	}
	f, err := openExclusive(t.Path)
	if err != nil {
		return ev, err
	}
	defer f.Close()
	start := time.Now()
	var regions []Extent
	var check changeCheck
	switch plan.Method {
	case sanitize.WipeMetadata:
		regions = metadataRegions(t)
		err = zeroRegions(ctx, f, regions, progress)
	case sanitize.WriteZeroes:
		regions = []Extent{{0, t.Size}}
		err = zeroOut(ctx, f, t.Size, progress)
	case sanitize.Overwrite:
		regions = []Extent{{0, t.Size}}
		err = zeroRegions(ctx, f, regions, progress)
	case sanitize.NVMeFormatUserData:
		regions = []Extent{{0, t.Size}}
		check, err = prepareChangeCheck(f, t.Size)
		if err == nil {
			err = formatNVM(t.driveOrKernel(), f, t.Size, sesUserData, progress)
		}
	}
	for _, r := range regions {
		ev.Bytes += r.Length
	}
	if err == nil {
		err = f.Sync()
	}
	ev.DurationSeconds = time.Since(start).Seconds()
	if err != nil {
		return ev, fmt.Errorf("disk %s: %s: %w", t.Path, plan.Method, err)
	}
	// The kernel forgets the partitions it knew; a file has none.
	_ = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
	var checked string
	switch plan.Verify {
	case sanitize.ReadsChanged:
		checked, err = check.verify(f, t.Size)
	default:
		checked, err = verifyZero(t.Path, t.Size, regions)
	}
	if err != nil {
		return ev, fmt.Errorf("disk %s: verify %s: %w", t.Path, plan.Method, err)
	}
	ev.Checked = checked
	return ev, nil
}

// Disarm zeroes t's signatures and partition tables (the regions of the
// metadata level) before a long erase of it starts, and asks the kernel to
// forget its partitions. Done first on every disk of a host, it leaves a
// host that loses power in the middle of the long part with no partition
// table or boot code to boot the previous tenant's OS from (backup
// superblocks inside old file systems stay until the erase reaches them);
// the firmware goes on to its next boot device. A skipped or unerasable disk is left
// alone. Disarm is no evidence: the erase and its check are.
func Disarm(ctx context.Context, t Target, plan sanitize.Plan) error {
	if !plan.Method.ErasesEveryBlock() {
		return nil
	}
	f, err := openExclusive(t.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := zeroRegions(ctx, f, metadataRegions(t), func(int64, int64) {}); err != nil {
		return fmt.Errorf("disk %s: wipe signatures and partition tables: %w", t.Path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("disk %s: wipe signatures and partition tables: %w", t.Path, err)
	}
	_ = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
	return nil
}

// openExclusive opens the disk for writing. On Linux O_EXCL on a block
// device fails with EBUSY while something claimed the whole disk (a file
// system mounted from it, device-mapper or RAID on it); partitions held by
// something are found by the probe (mount table, holders in sysfs).
// Writes go straight to the device (O_DIRECT): through the page cache an
// overwrite ran 19 times slower than dd oflag=direct in the lab's
// benchmark (make bench-sanitize). A file on a file system without O_DIRECT (tmpfs:
// tests) is written through its cache.
func openExclusive(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	flags := os.O_RDWR | unix.O_DIRECT
	if st.Mode()&os.ModeDevice != 0 {
		flags |= unix.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0)
	if errors.Is(err, unix.EINVAL) && st.Mode().IsRegular() {
		f, err = os.OpenFile(path, flags&^unix.O_DIRECT, 0)
	}
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("disk %s is in use (the kernel refused an exclusive open): not erased", path)
	}
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	return f, nil
}

// writeAt writes b at off. A write O_DIRECT refuses (a file system that
// asks for more alignment than a region has) is done, and the rest with
// it, through the page cache.
func writeAt(f *os.File, b []byte, off int64) error {
	_, err := f.WriteAt(b, off)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	flags, ferr := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if ferr != nil || flags&unix.O_DIRECT == 0 {
		return err
	}
	if _, ferr := unix.FcntlInt(f.Fd(), unix.F_SETFL, flags&^unix.O_DIRECT); ferr != nil {
		return err
	}
	_, err = f.WriteAt(b, off)
	return err
}

// metadataRegions are where partition tables and signatures live: the first
// and last MiB of the disk (MBR, GPT and its backup, RAID superblocks at the
// end) and of each partition (file system, LVM and RAID signatures).
func metadataRegions(t Target) []Extent {
	var out []Extent
	add := func(x Extent) {
		if x.Length <= 2*edge {
			out = append(out, x)
			return
		}
		out = append(out, Extent{x.Offset, edge}, Extent{x.Offset + x.Length - edge, edge})
	}
	add(Extent{0, t.Size})
	for _, p := range t.Partitions {
		add(p)
	}
	return out
}

func zeroRegions(ctx context.Context, f *os.File, regions []Extent, progress Progress) error {
	var total, done, unsynced int64
	for _, r := range regions {
		total += r.Length
	}
	zeros := alignedBuffer(chunk)
	for _, r := range regions {
		for off := r.Offset; off < r.Offset+r.Length; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(int64(chunk), r.Offset+r.Length-off)
			if err := writeAt(f, zeros[:n], off); err != nil {
				return err
			}
			off += n
			done += n
			unsynced += n
			if unsynced >= syncEvery {
				if err := f.Sync(); err != nil {
					return err
				}
				unsynced = 0
			}
			progress(done, total)
		}
	}
	return nil
}

// blkZeroOut is BLKZEROOUT, _IO(0x12, 127): the kernel zeroes a range with
// the device's Write Zeroes (or by writing zeros where it has none).
const blkZeroOut = 0x127f

// zeroOut zeroes the whole device with BLKZEROOUT, 256 MiB at a time. The
// kernel also drops the page cache of each range.
func zeroOut(ctx context.Context, f *os.File, size int64, progress Progress) error {
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(int64(chunk)*64, size-off)
		rng := [2]uint64{uint64(off), uint64(n)}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), blkZeroOut, uintptr(unsafe.Pointer(&rng))); errno != 0 {
			return fmt.Errorf("zero %d bytes at %d: %w", n, off, errno)
		}
		off += n
		progress(off, size)
	}
	return nil
}

// verifyZero reads back the first and last MiB of each region and
// sampleCount blocks of sampleSize spread over them (evenly, then at random
// offsets a pattern-aware firmware cannot predict), and fails at the first
// byte that is not zero. It reads the device, not the page cache the erase
// wrote through: its own descriptor with O_DIRECT.
func verifyZero(path string, size int64, regions []Extent) (string, error) {
	f, how, err := openForCheck(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// O_DIRECT reads must be aligned to the logical block size: 4096
	// unless something on the disk is aligned to 512 bytes only.
	align := int64(4096)
	for _, r := range append(regions, Extent{0, size}) {
		if r.Offset%4096 != 0 || r.Length%4096 != 0 {
			align = 512
		}
	}
	var reads []Extent
	for _, r := range regions {
		if r.Length == 0 {
			continue
		}
		head := min(edge, r.Length)
		reads = append(reads, Extent{r.Offset, head})
		if tail := min(edge, r.Length-head); tail > 0 {
			reads = append(reads, Extent{r.Offset + r.Length - tail, tail})
		}
	}
	sampled := 0
	var span int64
	for _, r := range regions {
		span += r.Length
	}
	if span > 2*edge {
		for i := 0; i < sampleCount; i++ {
			var pos int64
			if i%2 == 0 {
				pos = span / sampleCount * int64(i)
			} else {
				var b [8]byte
				_, _ = rand.Read(b[:])
				pos = int64(binary.LittleEndian.Uint64(b[:]) % uint64(span))
			}
			reads = append(reads, at(regions, pos/align*align, sampleSize))
			sampled++
		}
	}
	buf := alignedBuffer(edge)
	zeros := make([]byte, edge)
	for _, r := range reads {
		if r.Length <= 0 || r.Offset < 0 || r.Offset+r.Length > size || r.Offset%align != 0 || r.Length%align != 0 {
			return "", fmt.Errorf("internal error: check read %d+%d on a %d-byte disk", r.Offset, r.Length, size)
		}
		b := buf[:r.Length]
		if n, err := f.ReadAt(b, r.Offset); n != len(b) {
			return "", fmt.Errorf("read %d bytes at %d: got %d: %w", r.Length, r.Offset, n, err)
		}
		if !bytes.Equal(b, zeros[:r.Length]) {
			first := firstNonZero(b)
			return "", fmt.Errorf("byte %d reads %#02x, not zero", r.Offset+int64(first), b[first])
		}
	}
	return fmt.Sprintf("%d sampled %d KiB blocks and the first and last MiB of %d regions read back as zeros (%s)", sampled, sampleSize>>10, len(regions), how), nil
}

// openForCheck opens path to read what is on the media. A file system
// without O_DIRECT (tmpfs: tests, or a disk image) is read through its
// cache, and the evidence says so; a block device always takes O_DIRECT.
func openForCheck(path string) (*os.File, string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err == nil {
		return f, "read with O_DIRECT", nil
	}
	st, serr := os.Stat(path)
	if !errors.Is(err, unix.EINVAL) || serr != nil || !st.Mode().IsRegular() {
		return nil, "", fmt.Errorf("open %s to check it: %w", path, err)
	}
	f, err = os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("open %s to check it: %w", path, err)
	}
	return f, "read through the page cache: the file system has no O_DIRECT", nil
}

// alignedBuffer is n bytes starting at a 4096-byte boundary, as O_DIRECT
// needs.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n]
}

// at is the extent of length n at position pos of the regions laid end to
// end, cut at its region's end.
func at(regions []Extent, pos, n int64) Extent {
	for _, r := range regions {
		if pos < r.Length {
			return Extent{r.Offset + pos, min(n, r.Length-pos)}
		}
		pos -= r.Length
	}
	return Extent{}
}

func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return 0
}
