package tftpd

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// receive plays a lock-step or windowed client against tr: it acknowledges
// the last block of every window and returns what it got.
func receive(t *testing.T, tr *transfer, first sendRange) []byte {
	t.Helper()
	var got []byte
	var hdr [4]byte
	next, now := first, t0
	for i := 0; ; i++ {
		require.Less(t, i, 1_000_000, "transfer never ends")
		require.False(t, next.empty(), "nothing to send before the last block was acknowledged")
		var ack uint16
		if next.oack {
			ack = 0
		} else {
			for k := next.from; k <= next.to; k++ {
				payload := tr.block(k, &hdr)
				require.Equal(t, uint16(opDATA), binary.BigEndian.Uint16(hdr[:]))
				require.Equal(t, uint16(k), binary.BigEndian.Uint16(hdr[2:]), "wire number of block %d", k)
				require.LessOrEqual(t, len(payload), tr.blksize)
				got = append(got, payload...)
				ack = uint16(k)
			}
		}
		var done bool
		next, done = tr.ack(ack, now)
		if done {
			return got
		}
	}
}

func content(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

func TestTransferSendsEveryByte(t *testing.T) {
	for name, tc := range map[string]struct {
		size, blksize, window int
		oack                  bool
	}{
		"lock-step":                          {size: 74213, blksize: 1468, window: 1},
		"size a multiple of the block size":  {size: 4 * 512, blksize: 512, window: 1},
		"empty file":                         {size: 0, blksize: 512, window: 1},
		"with an OACK first":                 {size: 10_000, blksize: 1468, window: 1, oack: true},
		"windows of 4":                       {size: 10_000, blksize: 512, window: 4, oack: true},
		"window larger than the file":        {size: 1000, blksize: 512, window: 64, oack: true},
		"block numbers wrap past 65535":      {size: 70_000 * 8, blksize: 8, window: 1, oack: true},
		"windows across the wrap":            {size: 66_000 * 8, blksize: 8, window: 7, oack: true},
		"a window ending on a multiple size": {size: 8 * 512, blksize: 512, window: 4},
	} {
		t.Run(name, func(t *testing.T) {
			data := content(tc.size)
			var oack []byte
			if tc.oack {
				oack = []byte{0, opOACK}
			}
			tr := newTransfer(data, tc.blksize, tc.window, time.Second, 5, oack)
			first := tr.begin(t0)
			require.Equal(t, tc.oack, first.oack, "the OACK comes first when options were accepted")
			require.True(t, bytes.Equal(data, receive(t, tr, first)), "content")
		})
	}
}

func TestTransferIgnoresDuplicateAndEarlyAcks(t *testing.T) {
	tr := newTransfer(content(5000), 512, 1, time.Second, 5, []byte{0, opOACK})
	require.Equal(t, sendRange{oack: true}, tr.begin(t0))
	next, done := tr.ack(1, t0)
	require.True(t, next.empty() && !done, "ACK 1 before the OACK is acknowledged")
	next, _ = tr.ack(0, t0)
	require.Equal(t, sendRange{from: 1, to: 1}, next)
	next, _ = tr.ack(0, t0)
	require.True(t, next.empty(), "a repeated ACK 0 sends nothing (Sorcerer's Apprentice)")
	next, _ = tr.ack(2, t0)
	require.True(t, next.empty(), "an ACK of a block not sent yet sends nothing")
	next, _ = tr.ack(1, t0)
	require.Equal(t, sendRange{from: 2, to: 2}, next)
	next, _ = tr.ack(1, t0)
	require.True(t, next.empty(), "a duplicate ACK sends nothing")
}

func TestTransferWindowRestartsAfterTheLastGoodBlock(t *testing.T) {
	tr := newTransfer(content(20*512), 512, 4, time.Second, 5, nil)
	require.Equal(t, sendRange{from: 1, to: 4}, tr.begin(t0))
	// The client lost block 3 and acknowledges the last block it got in
	// order (RFC 7440): the next window starts after it.
	next, _ := tr.ack(2, t0)
	require.Equal(t, sendRange{from: 3, to: 6}, next)
	next, _ = tr.ack(6, t0)
	require.Equal(t, sendRange{from: 7, to: 10}, next)
}

func TestTransferTimeouts(t *testing.T) {
	tr := newTransfer(content(3000), 512, 2, time.Second, 3, nil)
	require.Equal(t, sendRange{from: 1, to: 2}, tr.begin(t0))
	resend, failed := tr.expire(t0.Add(999 * time.Millisecond))
	require.True(t, resend.empty() && !failed, "nothing before the timeout")
	now := t0.Add(time.Second)
	for try := 1; try <= 3; try++ {
		resend, failed = tr.expire(now)
		require.False(t, failed, "try %d", try)
		require.Equal(t, sendRange{from: 1, to: 2}, resend, "the unacknowledged window again, try %d", try)
		now = now.Add(time.Second)
	}
	_, failed = tr.expire(now)
	require.True(t, failed, "out of retries")

	// Progress restores the retries.
	tr = newTransfer(content(3000), 512, 1, time.Second, 1, []byte{0, opOACK})
	tr.begin(t0)
	resend, _ = tr.expire(t0.Add(time.Second))
	require.Equal(t, sendRange{oack: true}, resend, "the OACK again")
	tr.ack(0, t0.Add(1500*time.Millisecond))
	resend, failed = tr.expire(t0.Add(2500 * time.Millisecond))
	require.Equal(t, sendRange{from: 1, to: 1}, resend)
	require.False(t, failed, "the ACK restored the retry")
}

// FuzzTransferAcks drives a transfer with arbitrary acknowledgements and
// timeouts: it never panics, never asks for a block outside the file or
// one more than a window past the last acknowledged, and ends only once
// every block is acknowledged.
func FuzzTransferAcks(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 2, 0xff, 0xff, 0, 3}, uint16(3000), uint8(2))
	f.Add([]byte{0, 5, 0, 0, 0, 0}, uint16(0), uint8(1))
	f.Fuzz(func(t *testing.T, acks []byte, size uint16, window uint8) {
		w := int(window%8) + 1
		tr := newTransfer(content(int(size)), 16, w, time.Second, 3, []byte{0, opOACK})
		check := func(r sendRange) {
			if r.empty() || r.oack {
				return
			}
			if r.from < 1 || r.to > tr.nblocks || r.from > tr.acked+1 || r.to > tr.acked+w {
				t.Fatalf("asked to send %+v with %d acknowledged of %d, window %d", r, tr.acked, tr.nblocks, w)
			}
		}
		now := t0
		check(tr.begin(now))
		for i := 0; i+1 < len(acks); i += 2 {
			if acks[i] == 0xff {
				now = now.Add(time.Second)
				r, failed := tr.expire(now)
				if failed {
					return
				}
				check(r)
				continue
			}
			before := tr.acked
			r, done := tr.ack(binary.BigEndian.Uint16(acks[i:]), now)
			if tr.acked < before {
				t.Fatalf("acknowledged went back from %d to %d", before, tr.acked)
			}
			if done {
				if tr.acked != tr.nblocks {
					t.Fatalf("done at %d of %d", tr.acked, tr.nblocks)
				}
				return
			}
			check(r)
		}
	})
}
