package osimage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/stream-metadata-go/stream"
)

// streamArches are the architectures read from stream metadata.
var streamArches = []string{"x86_64", "aarch64"}

// watchStreams reads every stream now and again every StreamRefresh, adding
// their live ISOs to the catalog; a stream that cannot be read is retried
// with backoff.
func (c *Catalog) watchStreams(ctx context.Context) {
	pending := append([]string(nil), c.cfg.Streams...)
	delay := c.cfg.RetryMin
	for {
		var failed []string
		for _, s := range pending {
			entries, err := c.readStream(ctx, s)
			if err != nil {
				c.cfg.Log.Error(err, "reading OS image stream; retrying", "stream", redactURL(s))
				failed = append(failed, s)
				continue
			}
			for _, e := range entries {
				if err := c.add(e); err != nil {
					c.cfg.Log.Error(err, "stream entry ignored", "stream", redactURL(s))
				}
			}
		}
		select {
		case c.wake <- struct{}{}:
		default:
		}
		wait := c.cfg.StreamRefresh
		pending = c.cfg.Streams
		if len(failed) > 0 {
			wait, pending = delay, failed
			delay = min(delay*2, c.cfg.RetryMax)
		} else {
			delay = c.cfg.RetryMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// readStream returns the metal live ISOs a stream describes, each with its
// metal disk image when the stream has one.
func (c *Catalog) readStream(ctx context.Context, src string) ([]Entry, error) {
	body, _, err := c.open(ctx, src)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	raw, err := io.ReadAll(io.LimitReader(body, 16<<20))
	if err != nil {
		return nil, err
	}
	var s stream.Stream
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("stream %s: %w", redactURL(src), err)
	}
	var out []Entry
	for _, arch := range streamArches {
		a, ok := s.Architectures[arch]
		if !ok {
			continue
		}
		metal, ok := a.Artifacts["metal"]
		if !ok {
			continue
		}
		iso, ok := metal.Formats["iso"]
		if !ok || iso.Disk == nil || iso.Disk.Location == "" {
			continue
		}
		e := Entry{
			Version:         metal.Release,
			CPUArchitecture: arch,
			URL:             resolveRef(src, iso.Disk.Location),
			SHA256:          strings.ToLower(iso.Disk.Sha256),
		}
		// The disk image hosts install: the smallest download first.
		for _, f := range []string{"raw.xz", "raw.gz", "raw"} {
			if raw, ok := metal.Formats[f]; ok && raw.Disk != nil && raw.Disk.Location != "" {
				e.DiskURL, e.DiskSHA256 = resolveRef(src, raw.Disk.Location), strings.ToLower(raw.Disk.Sha256)
				break
			}
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("stream %s has no metal live ISO for %s", redactURL(src), strings.Join(streamArches, " or "))
	}
	return out, nil
}

// resolveRef resolves a location relative to the stream's own URL or path.
func resolveRef(base, ref string) string {
	if u, err := url.Parse(ref); err == nil && u.IsAbs() || strings.HasPrefix(ref, "/") {
		return ref
	}
	if b, err := url.Parse(base); err == nil && b.Scheme != "" {
		r, _ := url.Parse(ref)
		if b.Scheme == "file" {
			b.Path = path.Join(path.Dir(b.Path), ref)
			return b.String()
		}
		return b.ResolveReference(r).String()
	}
	return filepath.Join(filepath.Dir(base), ref)
}
