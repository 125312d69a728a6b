package install

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ulikunitz/xz"

	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/test/testenv"
)

type fixture struct {
	image    []byte
	served   []byte // what the server sends (image, or gzip of it)
	disk     string
	mounts   string
	requests atomic.Int32
	srv      *httptest.Server
	stages   []string
	placed   []byte
}

func newFixture(t *testing.T, compression string) *fixture {
	f := &fixture{image: make([]byte, 3<<20+123)}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range f.image {
		f.image[i] = byte(r.UintN(256))
	}
	f.served = f.image
	var b bytes.Buffer
	switch compression {
	case "gzip":
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(f.image)
		require.NoError(t, zw.Close())
		f.served = b.Bytes()
	case "xz":
		xw, err := xz.NewWriter(&b)
		require.NoError(t, err)
		_, _ = xw.Write(f.image)
		require.NoError(t, xw.Close())
		f.served = b.Bytes()
	}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		if r.URL.Path != "/disk.raw" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "disk.raw", time.Time{}, bytes.NewReader(f.served))
	}))
	t.Cleanup(f.srv.Close)
	dir := t.TempDir()
	// The "disk" already holds something: the install must replace it.
	f.disk = filepath.Join(dir, "sdz")
	require.NoError(t, os.WriteFile(f.disk, bytes.Repeat([]byte{0xaa}, 8<<20), 0o644))
	f.mounts = filepath.Join(dir, "mounts")
	require.NoError(t, os.WriteFile(f.mounts, []byte("/dev/sr0 /run/media/iso iso9660 ro 0 0\n/dev/sdz10 /data ext4 rw 0 0\n"), 0o644))
	return f
}

func (f *fixture) step() agentwire.InstallStep {
	sum := sha256.Sum256(f.served)
	return agentwire.InstallStep{DiskPath: f.disk, ImageURL: f.srv.URL + "/disk.raw", ImageSHA256: hex.EncodeToString(sum[:]), Ignition: `{"ignition":{"version":"3.4.0"}}`}
}

func (f *fixture) options() Options {
	return Options{
		Mounts:   f.mounts,
		Progress: func(stage string, pct int, _ string) { f.stages = append(f.stages, stage) },
		PlaceIgnition: func(disk string, config []byte) error {
			if disk != f.disk {
				return os.ErrInvalid
			}
			f.placed = config
			return nil
		},
	}
}

func TestInstallWritesVerifiesAndReports(t *testing.T) {
	for _, compression := range []string{"raw", "gzip", "xz"} {
		t.Run(compression, func(t *testing.T) {
			f := newFixture(t, compression)
			require.NoError(t, Run(context.Background(), f.step(), f.options()))
			got, err := os.ReadFile(f.disk)
			require.NoError(t, err)
			require.Equal(t, f.image, got[:len(f.image)], "the disk holds the image")
			require.Equal(t, bytes.Repeat([]byte{0xaa}, len(got)-len(f.image)), got[len(f.image):], "nothing past the image is touched")
			require.Equal(t, `{"ignition":{"version":"3.4.0"}}`, string(f.placed))
			// Stages in the documented order, with the write reported as it goes.
			require.Equal(t, StageStarting, f.stages[0])
			require.Equal(t, StageRebooting, f.stages[len(f.stages)-1])
			require.Contains(t, f.stages, StageWriting)
			order := map[string]int{StageStarting: 0, StageInstalling: 1, StageWriting: 2, StageRebooting: 4}
			last := 0
			for _, s := range f.stages {
				require.GreaterOrEqual(t, order[s], last, "stages %q", f.stages)
				last = order[s]
			}
		})
	}
}

func TestInstallFailures(t *testing.T) {
	t.Run("checksum", func(t *testing.T) {
		f := newFixture(t, "raw")
		step := f.step()
		step.ImageSHA256 = strings.Repeat("0", 64)
		err := Run(context.Background(), step, f.options())
		require.ErrorContains(t, err, "image sha256 is "+step.ImageSHA256[:0])
		require.ErrorContains(t, err, "the disk was wiped")
		got, _ := os.ReadFile(f.disk)
		require.Equal(t, make([]byte, 1<<20), got[:1<<20], "a bad image must not stay bootable")
		require.Nil(t, f.placed)
	})
	t.Run("in use", func(t *testing.T) {
		f := newFixture(t, "raw")
		require.NoError(t, os.WriteFile(f.mounts, []byte(f.disk+"1 /var ext4 rw 0 0\n"), 0o644))
		err := Run(context.Background(), f.step(), f.options())
		require.ErrorContains(t, err, "is in use: "+f.disk+"1 is mounted on /var")
		require.Zero(t, f.requests.Load(), "nothing is fetched for a disk in use")
		got, _ := os.ReadFile(f.disk)
		require.Equal(t, byte(0xaa), got[0])
	})
	t.Run("in use by link", func(t *testing.T) {
		f := newFixture(t, "raw")
		link := filepath.Join(t.TempDir(), "virtio-disk0")
		require.NoError(t, os.Symlink(f.disk, link))
		require.NoError(t, os.WriteFile(f.mounts, []byte(f.disk+"2 /var ext4 rw 0 0\n"), 0o644))
		step := f.step()
		step.DiskPath = link
		require.ErrorContains(t, Run(context.Background(), step, f.options()), "is in use: "+f.disk+"2 is mounted on /var")
		require.Zero(t, f.requests.Load())
	})
	t.Run("missing image", func(t *testing.T) {
		f := newFixture(t, "raw")
		step := f.step()
		step.ImageURL = f.srv.URL + "/nope"
		require.ErrorContains(t, Run(context.Background(), step, f.options()), "fetch the image: 404")
	})
	t.Run("bad step", func(t *testing.T) {
		f := newFixture(t, "raw")
		for name, change := range map[string]func(*agentwire.InstallStep){
			"64 hex digits": func(s *agentwire.InstallStep) { s.ImageSHA256 = "abc" },
			"not hex":       func(s *agentwire.InstallStep) { s.ImageSHA256 = strings.Repeat("z", 64) },
			"no Ignition":   func(s *agentwire.InstallStep) { s.Ignition = "" },
			"needs a disk":  func(s *agentwire.InstallStep) { s.DiskPath = "" },
		} {
			step := f.step()
			change(&step)
			require.ErrorContains(t, Run(context.Background(), step, f.options()), name)
		}
		require.Zero(t, f.requests.Load())
	})
}

func TestFindBootOnTheDevDiskImage(t *testing.T) {
	iso, err := testenv.DevImage()
	require.NoError(t, err)
	f, err := os.Open(filepath.Join(filepath.Dir(iso), "agentboot-dev-metal.x86_64.raw"))
	require.NoError(t, err)
	defer f.Close()
	p, err := FindBoot(f)
	require.NoError(t, err)
	require.Equal(t, Partition{Number: 1, Start: 1 << 20, FSType: "vfat", Label: "boot"}, p)

	_, err = FindBoot(bytes.NewReader(make([]byte, 4096)))
	require.ErrorContains(t, err, "no partition table")
}

// Void zeroes the start of a disk the service called the installation off
// for, so firmware cannot boot what was written; the rest is left alone.
func TestVoid(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "disk")
	data := bytes.Repeat([]byte{0xAB}, 3<<20)
	require.NoError(t, os.WriteFile(disk, data, 0o600))
	require.NoError(t, Void(disk))
	got, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Len(t, got, len(data))
	require.Equal(t, make([]byte, 1<<20), got[:1<<20], "the first MiB is zeroed")
	require.Equal(t, data[1<<20:], got[1<<20:])
	require.ErrorContains(t, Void(filepath.Join(t.TempDir(), "missing")), "open ")
}

// A download is limited by silence, not by its length: a slow image that
// keeps coming installs, one that stops fails saying so and leaves no
// bootable half image.
func TestInstallDownloadStalls(t *testing.T) {
	const stall = 300 * time.Millisecond
	trickle := func(f *fixture, stopAfter int) {
		f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(f.served)))
			chunk := len(f.served)/8 + 1
			for i := 0; i < len(f.served); i += chunk {
				if i/chunk == stopAfter {
					<-r.Context().Done()
					return
				}
				_, _ = w.Write(f.served[i:min(i+chunk, len(f.served))])
				w.(http.Flusher).Flush()
				time.Sleep(stall / 3)
			}
		})
	}
	t.Run("slow but steady", func(t *testing.T) {
		f := newFixture(t, "raw")
		trickle(f, -1)
		o := f.options()
		o.StallTimeout = stall
		start := time.Now()
		require.NoError(t, Run(context.Background(), f.step(), o))
		require.Greater(t, time.Since(start), 2*stall, "the download took longer than the stall limit")
		got, err := os.ReadFile(f.disk)
		require.NoError(t, err)
		require.Equal(t, f.image, got[:len(f.image)])
	})
	t.Run("stopped", func(t *testing.T) {
		f := newFixture(t, "raw")
		trickle(f, 3)
		o := f.options()
		o.StallTimeout = stall
		err := Run(context.Background(), f.step(), o)
		require.ErrorContains(t, err, "write the image to "+f.disk)
		require.ErrorContains(t, err, "no data from the image server for 300ms")
		got, _ := os.ReadFile(f.disk)
		require.Equal(t, make([]byte, 1<<20), got[:1<<20], "a half-written image must not stay bootable")
		require.Nil(t, f.placed)
	})
}
