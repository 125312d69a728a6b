// Package install writes an OS disk image to the installation disk, as
// coreos-installer does: it streams the image (raw, gzip or xz) to the disk while
// hashing it, refuses to finish on a checksum mismatch (and wipes the start of
// the disk so a half-written image never boots), and puts the Ignition config
// at ignition/config.ign on the partition labelled "boot", where CoreOS (and
// the dev OS image) read it on first boot. It writes to the target disk only.
package install

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/agentboot/agentboot/agent/internal/blockdev"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// Worker install stages, in order (api.md), as the agent reports them.
const (
	StageStarting   = "Starting installation"
	StageInstalling = "Installing"
	StageWriting    = "Writing image to disk"
	StageRebooting  = "Rebooting"
	StageFailed     = "Failed"
)

// Options are what an installation needs besides the step.
type Options struct {
	// HTTP fetches the image; http.DefaultClient when nil. Its Timeout
	// must be zero (or longer than any download): a disk image of several
	// GiB over a slow link takes as long as it takes. StallTimeout is what
	// ends a download that stopped.
	HTTP *http.Client
	// StallTimeout ends the download when no byte arrived for this long
	// (DefaultStallTimeout when zero).
	StallTimeout time.Duration
	// Progress receives each stage and the percentage done.
	Progress func(stage string, percentage int, info string)
	// Mounts is the mount table checked for the target (/proc/mounts).
	Mounts string
	// PlaceIgnition writes the config onto the installed disk; nil uses
	// the boot partition (which needs root: it mounts it).
	PlaceIgnition func(disk string, config []byte) error
}

// DefaultStallTimeout is how long a download may go without a byte before
// the installation fails. There is no limit on the whole download.
const DefaultStallTimeout = 2 * time.Minute

// Run installs step.ImageURL onto step.DiskPath.
func Run(ctx context.Context, step agentwire.InstallStep, o Options) error {
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	if o.Progress == nil {
		o.Progress = func(string, int, string) {}
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.Mounts == "" {
		o.Mounts = "/proc/mounts"
	}
	if o.PlaceIgnition == nil {
		o.PlaceIgnition = PlaceOnBootPartition
	}
	if err := check(step, o.Mounts); err != nil {
		return err
	}
	o.Progress(StageStarting, 0, "installing to "+step.DiskPath)
	o.Progress(StageInstalling, 5, "")
	if err := write(ctx, step, o); err != nil {
		return err
	}
	o.Progress(StageWriting, 90, "writing the Ignition config")
	if err := o.PlaceIgnition(step.DiskPath, []byte(step.Ignition)); err != nil {
		return fmt.Errorf("place the Ignition config on %s: %w", step.DiskPath, err)
	}
	o.Progress(StageRebooting, 100, "")
	return nil
}

// check refuses steps that cannot be right before touching anything.
func check(step agentwire.InstallStep, mounts string) error {
	if step.DiskPath == "" || step.ImageURL == "" {
		return errors.New("the install step needs a disk and an image URL")
	}
	if len(step.ImageSHA256) != 64 {
		return fmt.Errorf("the install step's image sha256 %q is not 64 hex digits", step.ImageSHA256)
	}
	if _, err := hex.DecodeString(step.ImageSHA256); err != nil {
		return fmt.Errorf("the install step's image sha256 %q is not hex", step.ImageSHA256)
	}
	if step.Ignition == "" {
		return errors.New("the install step has no Ignition config")
	}
	// A disk with a mounted partition is in use (the live media, a data
	// disk): never write over it. The disk may be named by a
	// /dev/disk/by-id link; the mount table names the device.
	disk := step.DiskPath
	if real, err := filepath.EvalSymlinks(disk); err == nil {
		disk = real
	}
	mounted, err := blockdev.Mounted(mounts, disk)
	if err != nil {
		return err
	}
	if mounted != "" {
		return fmt.Errorf("%s is in use: %s", step.DiskPath, mounted)
	}
	return nil
}

// write streams the image to the disk, hashing what was downloaded.
func write(ctx context.Context, step agentwire.InstallStep, o Options) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := fmt.Errorf("no data from the image server for %s", o.StallTimeout)
	watchdog := time.AfterFunc(o.StallTimeout, func() { cancel(stalled) })
	defer watchdog.Stop()
	defer func() {
		// A read ended by the watchdog says "context canceled"; say why.
		if err != nil && errors.Is(context.Cause(ctx), stalled) {
			err = fmt.Errorf("%w (%w)", err, stalled)
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, step.ImageURL, nil)
	if err != nil {
		return fmt.Errorf("image URL: %w", err)
	}
	resp, err := o.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("fetch the image: %w", err)
	}
	defer resp.Body.Close()
	body := &stallReader{r: resp.Body, watchdog: watchdog, limit: o.StallTimeout}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch the image: %s", resp.Status)
	}
	disk, err := os.OpenFile(step.DiskPath, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open the installation disk: %w", err)
	}
	defer func() {
		if cerr := disk.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", step.DiskPath, cerr)
		}
	}()
	hash := sha256.New()
	counted := &progressReader{r: io.TeeReader(body, hash), total: resp.ContentLength, report: o.Progress}
	buffered := bufio.NewReaderSize(counted, 1<<20)
	var src io.Reader = buffered
	magic, _ := buffered.Peek(6)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(buffered)
		if err != nil {
			return fmt.Errorf("image: %w", err)
		}
		src = zr
	case bytes.Equal(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		// CoreOS publishes its metal images as raw.xz.
		xr, err := xz.NewReader(buffered)
		if err != nil {
			return fmt.Errorf("image: %w", err)
		}
		src = xr
	}
	if _, err := io.CopyBuffer(disk, src, make([]byte, 1<<20)); err != nil {
		wipe(disk)
		return fmt.Errorf("write the image to %s: %w", step.DiskPath, err)
	}
	// Drain what gzip did not need, so the hash covers the whole download.
	if _, err := io.Copy(io.Discard, buffered); err != nil {
		wipe(disk)
		return fmt.Errorf("read the image: %w", err)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); !strings.EqualFold(got, step.ImageSHA256) {
		wipe(disk)
		return fmt.Errorf("image sha256 is %s, want %s: the disk was wiped", got, step.ImageSHA256)
	}
	if err := disk.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", step.DiskPath, err)
	}
	return nil
}

// Void wipes the start of disk after an installation the service called
// off: the disk must not boot what was written.
func Void(path string) error {
	disk, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer disk.Close()
	wipe(disk)
	return nil
}

// wipe zeroes the first MiB, so a disk with a bad image does not boot it.
func wipe(disk *os.File) {
	_, _ = disk.WriteAt(make([]byte, 1<<20), 0)
	_ = disk.Sync()
}

// progressReader reports "Writing image to disk" every 5%.
type progressReader struct {
	r      io.Reader
	n      int64
	total  int64
	last   int
	report func(string, int, string)
}

// stallReader runs the watchdog only while it waits for the server: a slow
// disk write between reads is not the image server's stall.
type stallReader struct {
	r        io.Reader
	watchdog *time.Timer
	limit    time.Duration
}

func (s *stallReader) Read(b []byte) (int, error) {
	s.watchdog.Reset(s.limit)
	n, err := s.r.Read(b)
	s.watchdog.Stop()
	return n, err
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.total > 0 {
		// The write is 5% to 90% of the installation.
		pct := 5 + int(85*p.n/p.total)
		if pct >= p.last+5 || (err == io.EOF && pct != p.last) {
			p.last = pct
			p.report(StageWriting, pct, fmt.Sprintf("%d of %d MiB", p.n>>20, p.total>>20))
		}
	}
	return n, err
}
