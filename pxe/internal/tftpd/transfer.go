package tftpd

import (
	"encoding/binary"
	"time"
)

// transfer is one read transfer's protocol state: what the client
// acknowledged, what was sent, when to send again. It does no I/O; the
// server's loop sends what its methods return.
//
// Blocks are numbered from 1; block k holds data[(k-1)*blksize:] up to
// blksize bytes, and the last block is shorter than blksize (empty when
// the size is a multiple of it). On the wire the number is k modulo 65536,
// so files of more than 65535 blocks wrap to 0 as common clients expect.
type transfer struct {
	data    []byte
	blksize int
	window  int // blocks sent per acknowledgement (RFC 7440); 1 is lock-step
	timeout time.Duration
	// probe is the wait before the client acknowledged anything: the
	// client's timeout option applies once it proved it is there, so a
	// request from a forged source holds its transfer for no longer than
	// the server's own retries.
	probe   time.Duration
	retries int
	oack    []byte // the option acknowledgement, nil when none was sent

	nblocks  int
	answered bool // the client acknowledged something
	acked    int  // blocks acknowledged; -1 while the OACK is unacknowledged
	sent     int  // highest block sent
	tries    int  // resends since the client last made progress
	deadline time.Time
}

// sendRange is what to send next: the OACK, or blocks from to to
// (inclusive); nothing when neither.
type sendRange struct {
	oack     bool
	from, to int
}

func (r sendRange) empty() bool { return !r.oack && r.from > r.to }

func newTransfer(data []byte, blksize, window int, timeout time.Duration, retries int, oack []byte) *transfer {
	t := &transfer{data: data, blksize: blksize, window: window, timeout: timeout, probe: timeout, retries: retries, oack: oack,
		nblocks: len(data)/blksize + 1}
	if oack != nil {
		t.acked = -1
	}
	return t
}

// begin is the first answer to the request: the OACK, or the first window.
func (t *transfer) begin(now time.Time) sendRange {
	t.deadline = now.Add(t.wait())
	if t.acked < 0 {
		return sendRange{oack: true}
	}
	return t.nextWindow()
}

// wait is how long to wait for an acknowledgement.
func (t *transfer) wait() time.Duration {
	if t.answered {
		return t.timeout
	}
	return min(t.timeout, t.probe)
}

// underway tells whether the client acknowledged a block after the first
// window: any request it sent again before our first answer reached it
// has arrived by then, so a new request from it means it started over.
func (t *transfer) underway() bool { return t.acked > t.window }

// nextWindow is the window after the last acknowledged block.
func (t *transfer) nextWindow() sendRange {
	r := sendRange{from: t.acked + 1, to: min(t.acked+t.window, t.nblocks)}
	t.sent = max(t.sent, r.to)
	return r
}

// ack takes an acknowledgement of wire block n: the next window to send,
// or done when the last block is acknowledged. An acknowledgement of a
// block already acknowledged is ignored, not answered with a resend,
// which would double every later block (the Sorcerer's Apprentice bug,
// RFC 1123 4.2.3.1); so is one of a block not sent yet.
func (t *transfer) ack(n uint16, now time.Time) (next sendRange, done bool) {
	if t.acked < 0 {
		if n != 0 {
			return sendRange{from: 1}, false
		}
		t.acked = 0
	} else {
		k := t.acked + int(n-uint16(t.acked))
		if k == t.acked || k > t.sent {
			return sendRange{from: 1}, false
		}
		t.acked = k
	}
	t.answered = true
	if t.acked == t.nblocks {
		return sendRange{from: 1}, true
	}
	t.tries = 0
	t.deadline = now.Add(t.timeout)
	return t.nextWindow(), false
}

// expire resends what is unacknowledged once the deadline passed, and
// reports failure after the last retry.
func (t *transfer) expire(now time.Time) (resend sendRange, failed bool) {
	if now.Before(t.deadline) {
		return sendRange{from: 1}, false
	}
	if t.tries >= t.retries {
		return sendRange{from: 1}, true
	}
	t.tries++
	t.deadline = now.Add(t.wait())
	if t.acked < 0 {
		return sendRange{oack: true}, false
	}
	return t.nextWindow(), false
}

// block returns block k's header and payload.
func (t *transfer) block(k int, header *[4]byte) []byte {
	binary.BigEndian.PutUint16(header[0:], opDATA)
	binary.BigEndian.PutUint16(header[2:], uint16(k))
	start := min((k-1)*t.blksize, len(t.data))
	return t.data[start:min(start+t.blksize, len(t.data))]
}

// size is the number of bytes in blocks from to to.
func (t *transfer) size(from, to int) int {
	start := min((from-1)*t.blksize, len(t.data))
	return min(to*t.blksize, len(t.data)) - start
}
