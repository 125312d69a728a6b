package osimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/testenv"
)

func devISO(t *testing.T) (string, string) {
	t.Helper()
	p, err := testenv.DevImage()
	require.NoError(t, err)
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return p, hex.EncodeToString(h.Sum(nil))
}

func startCatalog(t *testing.T, cfg Config) *Catalog {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	cfg.Log = testr.New(t)
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	}
	c, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Start(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

func waitState(t *testing.T, c *Catalog, k Key, want State) Status {
	t.Helper()
	var st Status
	require.Eventually(t, func() bool {
		st = c.Status(k)
		return st.State == want
	}, 60*time.Second, 20*time.Millisecond, "image %s never reached state %d (last: %+v)", k, want, st)
	return st
}

func TestLocalImageAndCacheReuse(t *testing.T) {
	iso, sum := devISO(t)
	cache := t.TempDir()
	c := startCatalog(t, Config{CacheDir: cache, Images: []Entry{{Version: "1.0", CPUArchitecture: "x86_64", URL: "file://" + iso, SHA256: sum}}})
	k, err := c.Resolve("x86_64", "")
	require.NoError(t, err)
	st := waitState(t, c, k, Ready)
	require.Equal(t, sum, st.Image.SHA256)
	require.Equal(t, sum[:16], st.Image.ID)
	require.Positive(t, st.Image.Layout.Rootfs.Length)

	// A second catalog on the same cache uses the file it finds.
	entries, _ := os.ReadDir(filepath.Join(cache, "images"))
	require.Len(t, entries, 1)
	before, err := os.Stat(st.Image.Path)
	require.NoError(t, err)
	c2 := startCatalog(t, Config{CacheDir: cache, Images: []Entry{{Version: "1.0", CPUArchitecture: "x86_64", URL: "file://" + iso}}})
	st2 := waitState(t, c2, k, Ready)
	after, err := os.Stat(st2.Image.Path)
	require.NoError(t, err)
	require.Equal(t, before.ModTime(), after.ModTime(), "not downloaded again")

	// The minimal ISO is made once and drops the root filesystem.
	min, err := st.Image.Minimal()
	require.NoError(t, err)
	require.Zero(t, min.Layout.Rootfs.Length)
	require.Equal(t, st.Image.Layout.VolumeID, min.Layout.VolumeID)
	require.Equal(t, st.Image.Layout.Kargs.Default, min.Layout.Kargs.Default)
	require.NotEqual(t, st.Image.ID, min.ID)
	again, err := st.Image.Minimal()
	require.NoError(t, err)
	require.Same(t, min, again)
	// The second catalog made or waited for the same one; neither
	// clobbered the other's.
	min2, err := st2.Image.Minimal()
	require.NoError(t, err)
	require.Equal(t, min.SHA256, min2.SHA256)
	got, err := os.ReadDir(filepath.Dir(st.Image.Path))
	require.NoError(t, err)
	for _, e := range got {
		if e.Name() != ".minimal.lock" {
			require.False(t, strings.HasPrefix(e.Name(), "."), "temporary file %s left behind", e.Name())
		}
	}
}

// A process that starts again over the cache it had (a restarted
// container's emptyDir) checks each image against the digest recorded with
// it: one changed in place, at the same size, is downloaded or made again,
// never served.
func TestCachedImageIsVerifiedAgain(t *testing.T) {
	iso, sum := devISO(t)
	cache := t.TempDir()
	cfg := Config{CacheDir: cache, Images: []Entry{{Version: "1.0", CPUArchitecture: "x86_64", URL: "file://" + iso}}}
	c := startCatalog(t, cfg)
	k, err := c.Resolve("x86_64", "")
	require.NoError(t, err)
	st := waitState(t, c, k, Ready)
	min, err := st.Image.Minimal()
	require.NoError(t, err)
	flip := func(p string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		b := make([]byte, 1)
		_, err = f.ReadAt(b, 40000)
		require.NoError(t, err)
		b[0] ^= 0xff
		_, err = f.WriteAt(b, 40000)
		require.NoError(t, err)
	}
	flip(st.Image.Path)
	flip(min.Path)
	digest := func(p string) string {
		t.Helper()
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		s := sha256.Sum256(raw)
		return hex.EncodeToString(s[:])
	}
	require.NotEqual(t, sum, digest(st.Image.Path))

	again := startCatalog(t, cfg)
	st2 := waitState(t, again, k, Ready)
	require.Equal(t, sum, st2.Image.SHA256)
	require.Equal(t, sum, digest(st2.Image.Path), "the changed image was downloaded again")
	min2, err := st2.Image.Minimal()
	require.NoError(t, err)
	// xorriso stamps the time it made one: a minimal ISO made again has a
	// digest of its own, which its file must have.
	require.Equal(t, min2.SHA256, digest(min2.Path), "the changed minimal ISO was made again")
}

func TestStreamMetadata(t *testing.T) {
	iso, sum := devISO(t)
	stream := filepath.Join(filepath.Dir(iso), "stream.json")
	c := startCatalog(t, Config{Streams: []string{stream}})
	var k Key
	require.Eventually(t, func() bool {
		var err error
		k, err = c.Resolve("x86_64", "")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.True(t, strings.HasPrefix(k.Version, "dev-"))
	st := waitState(t, c, k, Ready)
	require.Equal(t, sum, st.Image.SHA256, "the stream's digest was checked")
	// The stream's metal raw image is the disk image, checked too.
	var disk Status
	require.Eventually(t, func() bool { disk = c.DiskStatus(k); return disk.State == Ready }, 60*time.Second, 20*time.Millisecond, "%+v", disk)
	raw, err := os.ReadFile(disk.Image.Path)
	require.NoError(t, err)
	want := sha256.Sum256(raw)
	require.Equal(t, hex.EncodeToString(want[:]), disk.Image.SHA256)
	require.Equal(t, []byte{0x55, 0xaa}, raw[510:512], "an MBR disk")
	require.Nil(t, disk.Image.Layout)
	// arm64 is the same architecture as aarch64, whose own live ISO the
	// stream lists (and whose digest was checked).
	arm, err := c.Resolve("arm64", "")
	require.NoError(t, err)
	require.Equal(t, "aarch64", arm.Arch)
	require.True(t, strings.HasPrefix(arm.Version, "dev-"), arm.Version)
	armISO, err := testenv.DevImageFor("aarch64")
	require.NoError(t, err)
	raw, err = os.ReadFile(armISO)
	require.NoError(t, err)
	want = sha256.Sum256(raw)
	require.Equal(t, hex.EncodeToString(want[:]), waitState(t, c, arm, Ready).Image.SHA256)
	// An architecture the stream lacks is refused, naming what exists.
	_, err = c.Resolve("ppc64le", "")
	require.ErrorIs(t, err, ErrUnknownImage)
	require.ErrorContains(t, err, "aarch64/"+arm.Version)
	require.ErrorContains(t, err, "x86_64/"+k.Version)
}

func TestDiskImages(t *testing.T) {
	iso, sum := devISO(t)
	disk := filepath.Join(t.TempDir(), "disk.raw.gz")
	require.NoError(t, os.WriteFile(disk, []byte("disk image bytes"), 0o644))
	diskSum := sha256.Sum256([]byte("disk image bytes"))
	c := startCatalog(t, Config{Images: []Entry{
		{Version: "1.0", CPUArchitecture: "x86_64", URL: "file://" + iso, SHA256: sum, DiskURL: disk, DiskSHA256: hex.EncodeToString(diskSum[:])},
		{Version: "2.0", CPUArchitecture: "x86_64", URL: "file://" + iso, SHA256: sum},
		{Version: "3.0", CPUArchitecture: "x86_64", URL: "file://" + iso, SHA256: sum, DiskURL: "file://" + disk, DiskSHA256: strings.Repeat("0", 64)},
	}})
	st := c.DiskStatus(Key{"x86_64", "1.0"})
	require.Eventually(t, func() bool { st = c.DiskStatus(Key{"x86_64", "1.0"}); return st.State == Ready }, 60*time.Second, 20*time.Millisecond)
	got, err := os.ReadFile(st.Image.Path)
	require.NoError(t, err)
	require.Equal(t, "disk image bytes", string(got))
	// The ISO is still a live ISO, with a minimal ISO.
	iso1 := waitState(t, c, Key{"x86_64", "1.0"}, Ready)
	require.NotNil(t, iso1.Image.Layout)

	none := c.DiskStatus(Key{"x86_64", "2.0"})
	require.Equal(t, Failed, none.State)
	require.ErrorIs(t, none.Err, ErrNoDiskImage)
	require.ErrorContains(t, none.Err, "x86_64/2.0")

	var bad Status
	require.Eventually(t, func() bool { bad = c.DiskStatus(Key{"x86_64", "3.0"}); return bad.State == Failed && bad.Err != nil }, 60*time.Second, 20*time.Millisecond)
	require.ErrorContains(t, bad.Err, "does not match")

	require.ErrorIs(t, c.DiskStatus(Key{"x86_64", "9"}).Err, ErrUnknownImage)
	_, err = New(Config{CacheDir: t.TempDir(), Images: []Entry{{Version: "1", URL: iso, DiskSHA256: sum}}})
	require.ErrorContains(t, err, "diskSHA256 without diskURL")
}

func TestResolve(t *testing.T) {
	c, err := New(Config{CacheDir: t.TempDir(), Images: []Entry{
		{Version: "4.9", CPUArchitecture: "x86_64", URL: "http://x/a.iso"},
		{Version: "4.10", CPUArchitecture: "x86_64", URL: "http://x/b.iso"},
		{Version: "4.10", CPUArchitecture: "arm64", URL: "http://x/c.iso"},
	}})
	require.NoError(t, err)
	k, err := c.Resolve("x86_64", "")
	require.NoError(t, err)
	require.Equal(t, Key{"x86_64", "4.10"}, k, "newest by numeric order")
	k, err = c.Resolve("arm64", "4.10")
	require.NoError(t, err)
	require.Equal(t, Key{"aarch64", "4.10"}, k)
	_, err = c.Resolve("x86_64", "4.11")
	require.ErrorIs(t, err, ErrUnknownImage)
	require.ErrorContains(t, err, "available: 4.9, 4.10")

	_, err = New(Config{CacheDir: t.TempDir(), Images: []Entry{{Version: "1", CPUArchitecture: "sparc", URL: "x"}}})
	require.ErrorContains(t, err, "unknown cpuArchitecture")
}

// A server that fails, then serves the wrong bytes, then the right ones:
// the catalog reports each failure and recovers by itself.
func TestDownloadFailuresAreRetried(t *testing.T) {
	iso, sum := devISO(t)
	var mode atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case 0:
			http.Error(w, "upstream down", http.StatusBadGateway)
		case 1:
			_, _ = w.Write([]byte("not the ISO"))
		case 2: // dies half way
			w.Header().Set("Content-Length", "1000000")
			_, _ = w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		default:
			http.ServeFile(w, r, iso)
		}
	}))
	defer srv.Close()
	c := startCatalog(t, Config{Images: []Entry{{Version: "1", CPUArchitecture: "x86_64", URL: srv.URL + "/live.iso?token=secret", SHA256: sum}}})
	k := Key{"x86_64", "1"}
	st := waitState(t, c, k, Failed)
	require.ErrorContains(t, st.Err, "502")
	require.NotContains(t, st.Err.Error(), "secret", "query strings are redacted")
	srv.CloseClientConnections()
	mode.Store(1)
	require.Eventually(t, func() bool {
		st = c.Status(k)
		return st.State == Failed && strings.Contains(st.Err.Error(), "does not match")
	}, 30*time.Second, 10*time.Millisecond)
	mode.Store(2)
	require.Eventually(t, func() bool {
		st = c.Status(k)
		return st.State == Failed && strings.Contains(st.Err.Error(), "failed after 1000 bytes")
	}, 30*time.Second, 10*time.Millisecond)
	require.NotContains(t, st.Err.Error(), "secret")
	mode.Store(3)
	st = waitState(t, c, k, Ready)
	require.Equal(t, sum, st.Image.SHA256)
}

func TestSubscribeSeesReady(t *testing.T) {
	iso, _ := devISO(t)
	c, err := New(Config{CacheDir: t.TempDir(), Log: testr.New(t), Images: []Entry{{Version: "1", CPUArchitecture: "x86_64", URL: iso}}})
	require.NoError(t, err)
	ch := c.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Start(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done // it logs to t until it returns
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case k := <-ch:
			if c.Status(k).State == Ready {
				require.Equal(t, Key{"x86_64", "1"}, k)
				return
			}
		case <-deadline:
			t.Fatal("no notification of the ready image")
		}
	}
}
