package agent

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/sanitize"
)

// Before the long erase of the first disk starts, every disk's signatures
// and partition tables are gone: power lost during it leaves nothing to
// boot, on the disks not reached yet too.
func TestSanitizeDisarmsEveryDiskFirst(t *testing.T) {
	const size = 24 << 20
	var paths []string
	var data [][]byte
	for _, name := range []string{"a.img", "b.img", "kept.img"} {
		b := make([]byte, size)
		_, err := rand.Read(b)
		require.NoError(t, err)
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		paths, data = append(paths, p), append(data, b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	out, err := sanitizeDisks(ctx, sanitize.Erase, "", paths, paths[2:], log, func(i int, _ string, done, _ int64, _ float64) {
		if i == 0 && done >= 8<<20 {
			cancel() // the power cut, during the first disk's erase
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, out, 3)
	read := func(i int) []byte {
		b, err := os.ReadFile(paths[i])
		require.NoError(t, err)
		return b
	}
	zero := make([]byte, 1<<20)
	a, b := read(0), read(1)
	require.Equal(t, zero, a[size-1<<20:], "the first disk's last MiB (backup GPT), ahead of its erase")
	require.Equal(t, zero, b[:1<<20], "the second disk's first MiB, never reached by its erase")
	require.Equal(t, zero, b[size-1<<20:], "the second disk's last MiB")
	require.Equal(t, data[1][1<<20:size-1<<20], b[1<<20:size-1<<20], "the second disk was not erased: the cut came first")
	require.Equal(t, data[2], read(2), "a disk to keep is not touched")
	require.Equal(t, "skip", out[2].Method)
}

// The whole erase's progress weighs each disk by its bytes: a small disk
// done first is a small part of it, and a disk spared is none.
func TestSanitizeProgressWeighsBytes(t *testing.T) {
	var paths []string
	for _, mib := range []int{8, 24, 4} {
		p := filepath.Join(t.TempDir(), "disk.img")
		require.NoError(t, os.WriteFile(p, make([]byte, mib<<20), 0o644))
		paths = append(paths, p)
	}
	endOf := map[int]float64{}
	var calls int
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, err := sanitizeDisks(context.Background(), sanitize.Erase, "", paths, paths[2:], log, func(i int, _ string, done, total int64, overall float64) {
		calls++
		require.NotEqual(t, 2, i, "the spared disk reports no progress")
		if done == total {
			endOf[i] = overall
		}
	})
	require.NoError(t, err)
	require.Positive(t, calls)
	require.InDelta(t, 0.25, endOf[0], 1e-9, "8 of 32 MiB")
	require.InDelta(t, 1, endOf[1], 1e-9)
}

// `agent sanitize --method` takes a method this agent sends, at level
// erase, and says which ones those are otherwise.
func TestSanitizeMethodChecked(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, make([]byte, 1<<20), 0o644))
	for name, tc := range map[string]struct {
		level  sanitize.Level
		method sanitize.Method
		err    string
	}{
		"not sent":        {sanitize.Erase, sanitize.NVMeSanitizeCrypto, "method nvme-sanitize-crypto: decided but not sent by this agent (docs/security.md); it sends write-zeroes, nvme-format-user-data, overwrite"},
		"not an erase":    {sanitize.Erase, sanitize.WipeMetadata, `method "wipe-metadata": want a method of the erase level (write-zeroes, nvme-format-user-data, overwrite), at level erase`},
		"unknown":         {sanitize.Erase, "shred", `method "shred": want a method of the erase level`},
		"at metadata":     {sanitize.Metadata, sanitize.Overwrite, `method "overwrite": want a method of the erase level`},
		"one it can send": {sanitize.Erase, sanitize.Overwrite, ""},
	} {
		t.Run(name, func(t *testing.T) {
			ev, err := Sanitize(context.Background(), tc.level, tc.method, []string{disk}, nil, log)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.Empty(t, ev, "nothing was touched")
				return
			}
			require.NoError(t, err)
			require.Equal(t, "overwrite", ev[0].Method)
		})
	}
}
