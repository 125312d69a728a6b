package tftpd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Why one event loop. A TFTP transfer is lock-step: one block, one
// acknowledgement. With a goroutine per transfer (pin/tftp, which agentboot
// used before), each block costs a read that finds nothing, a park and a
// wake-up through Go's netpoller, and under load the scheduler's hand-offs
// cost as much as the I/O: 22 µs of server CPU per block against dnsmasq's
// 16, and eight concurrent transfers of undionly.kpxe ran at 0.85 of
// dnsmasq's rate (make bench-pxe). Like dnsmasq, the loop waits once for
// every socket, reads each ready socket once, and then sends every answer,
// so one wake-up serves many transfers. It waits on its own epoll set
// through Go's netpoller, so it never blocks a thread or holds up the
// garbage collector. Each transfer's socket is connected to its client:
// the kernel drops strangers' packets (the transfer ID check of RFC 1350),
// skips a route lookup per block and reports a client that went away. In
// single-port mode everything runs on the listening socket, read and
// written many packets per system call (recvmmsg, sendmmsg).

const (
	batchSize  = maxWindow // packets per recvmmsg or sendmmsg: a whole window
	packetSize = 2048      // receive buffer per packet: requests are at most 512 bytes
)

// loop owns the sockets and transfers of one Serve call; only its
// goroutine touches them.
type loop struct {
	s   *Server
	cfg Config

	listen int // a duplicate of the listening socket
	ep     int // epoll set of the listening, wake-up and transfer sockets
	epf    *os.File
	epRC   syscall.RawConn
	events []unix.EpollEvent

	wakeMu sync.Mutex
	wakeFD int // eventfd written by Shutdown; -1 once closed

	byFD   map[int32]*xfer
	byPeer map[netip.AddrPort]*xfer
	perIP  map[netip.Addr]int

	// Requests waiting for the Source, by client; their results arrive on
	// fetched, and the wake-up event says so.
	fetching map[netip.AddrPort]*pending
	fetched  chan *pending
	// sourcing counts Source calls running, abandoned ones included.
	sourcing int
	// sourceHeld is the Source content live transfers hold, each
	// distinct content counted once (by its first byte's address).
	sourceHeld  int64
	sourceRefs  map[*byte]int
	ctx         context.Context
	cancelFetch context.CancelFunc

	tick        time.Duration // how often deadlines are checked
	nextScan    time.Time
	deadlineSet time.Time

	rx    rxBatch
	buf   []byte // a transfer socket's datagram
	queue []*xfer
	tx    txBatch
	etx   txBatch // an error answer, sent at once
}

// pending is a request whose content the Source is getting.
type pending struct {
	r       request
	peer    netip.AddrPort
	dst     netip.Addr
	name    string
	started time.Time
	data    []byte
	err     error
	// abandoned: the client asked for something else meanwhile.
	abandoned bool
}

// xfer is a transfer and where it runs.
type xfer struct {
	*transfer
	fd      int // its connected socket; -1 in single-port mode
	peer    netip.AddrPort
	peerSA  unix.RawSockaddrInet4
	control []byte // IP_PKTINFO naming the address to answer from, single-port mode
	file    string
	// requested is the name as the client sent it: a request repeated
	// before the transfer is underway names it again.
	requested string
	started   time.Time
	sentB     int64

	pending  sendRange // to send at the end of this loop iteration
	queued   bool
	finished bool
	// fromSource: data is held under holdSource.
	fromSource bool
}

func newLoop(s *Server, conn net.PacketConn) (_ *loop, err error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("serve on a UDP socket, not a %T", conn)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	l := &loop{s: s, cfg: s.cfg, listen: -1, ep: -1, wakeFD: -1, events: make([]unix.EpollEvent, batchSize),
		byFD: map[int32]*xfer{}, byPeer: map[netip.AddrPort]*xfer{}, perIP: map[netip.Addr]int{},
		fetching: map[netip.AddrPort]*pending{}, fetched: make(chan *pending, max(s.cfg.MaxTransfers, 1)), sourceRefs: map[*byte]int{},
		buf: make([]byte, packetSize)}
	l.ctx, l.cancelFetch = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	var dupErr error
	if err := rc.Control(func(fd uintptr) { l.listen, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, fmt.Errorf("duplicate the listening socket: %w", dupErr)
	}
	if sa, err := unix.Getsockname(l.listen); err != nil {
		return nil, err
	} else if _, ok := sa.(*unix.SockaddrInet4); !ok {
		return nil, errors.New("the listening socket must be IPv4 (udp4)")
	}
	// The address each request was sent to: transfers answer from it.
	if err := unix.SetsockoptInt(l.listen, unix.IPPROTO_IP, unix.IP_PKTINFO, 1); err != nil {
		return nil, fmt.Errorf("IP_PKTINFO: %w", err)
	}
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if l.wakeFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	for _, fd := range []int{l.listen, l.wakeFD} {
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return nil, fmt.Errorf("epoll: %w", err)
		}
	}
	// A non-blocking epoll descriptor is pollable: Go's netpoller wakes
	// the loop when the set has events.
	if err := unix.SetNonblock(l.ep, true); err != nil {
		return nil, err
	}
	l.epf = os.NewFile(uintptr(l.ep), "tftp-epoll")
	if err := l.epf.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("wait on epoll through the netpoller: %w", err)
	}
	if l.epRC, err = l.epf.SyscallConn(); err != nil {
		return nil, err
	}
	l.tick = min(max(l.cfg.Timeout/4, 10*time.Millisecond), 250*time.Millisecond)
	l.rx.init()
	l.tx.init(batchSize)
	l.etx.init(1)
	return l, nil
}

// wakeUp makes the loop look at Shutdown and at finished fetches.
func (l *loop) wakeUp() {
	l.wakeMu.Lock()
	defer l.wakeMu.Unlock()
	if l.wakeFD >= 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(l.wakeFD, one[:])
	}
}

func (l *loop) run() error {
	defer l.close()
	for {
		n, err := l.wait()
		if err != nil {
			return err
		}
		now := time.Now()
		stop := false
		for _, ev := range l.events[:n] {
			switch ev.Fd {
			case int32(l.wakeFD):
				var count [8]byte
				_, _ = unix.Read(l.wakeFD, count[:])
				stop = l.s.isStopping()
				if !stop {
					l.takeFetched(now)
				}
			case int32(l.listen):
				l.readListener(now)
			default:
				if x := l.byFD[ev.Fd]; x != nil {
					l.readTransfer(x, now)
				}
			}
		}
		if stop {
			for _, x := range l.byPeer {
				l.finish(x, resultAborted, "server shutting down")
			}
			return nil
		}
		if len(l.byPeer) > 0 && !now.Before(l.nextScan) {
			l.expire(now)
		}
		l.flush()
	}
}

// wait returns the number of ready sockets in l.events, 0 when it is time
// to check deadlines.
func (l *loop) wait() (int, error) {
	var deadline time.Time
	if len(l.byPeer) > 0 {
		deadline = l.nextScan
	}
	if !deadline.Equal(l.deadlineSet) {
		if err := l.epf.SetReadDeadline(deadline); err != nil {
			return 0, err
		}
		l.deadlineSet = deadline
	}
	var n int
	var werr error
	err := l.epRC.Read(func(fd uintptr) bool {
		for {
			n, werr = rawEpollPoll(int(fd), l.events)
			if werr != unix.EINTR {
				return werr != nil || n > 0
			}
		}
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, nil
	}
	if err == nil {
		err = werr
	}
	if err != nil {
		return 0, fmt.Errorf("wait for packets: %w", err)
	}
	return n, nil
}

// readListener reads what arrived on the listening socket: requests and,
// in single-port mode, acknowledgements.
func (l *loop) readListener(now time.Time) {
	n := l.rx.recv(l.listen)
	for i := range n {
		p, peer, dst, ok := l.rx.packet(i)
		if !ok {
			l.s.m.dropped.WithLabelValues("malformed").Inc()
			continue
		}
		if len(p) >= 2 {
			switch op := binary.BigEndian.Uint16(p); op {
			case opRRQ, opWRQ:
				l.request(p, peer, dst, now)
				continue
			case opACK, opERROR, opDATA, opOACK:
				if x := l.byPeer[peer]; x != nil && x.fd < 0 {
					l.transferPacket(x, p, now)
				} else {
					// A late acknowledgement of a finished transfer, or a
					// packet sent to port 69 instead of its transfer's.
					l.s.m.dropped.WithLabelValues("no-transfer").Inc()
				}
				continue
			}
		}
		l.s.m.dropped.WithLabelValues("malformed").Inc()
	}
}

// readTransfer reads one datagram from a transfer's socket; the next wait
// reports the socket again if more are queued.
func (l *loop) readTransfer(x *xfer, now time.Time) {
	n, err := rawRead(x.fd, l.buf)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
	case clientGone(err):
		l.finish(x, resultAborted, "") // e.g. the client's port is closed: it gave up
	case err != nil:
		l.s.cfg.Log.Error(err, "TFTP: read from a transfer's socket", "client", x.peer.String())
		l.finish(x, resultError, "")
	default:
		l.transferPacket(x, l.buf[:n], now)
	}
}

// request starts a transfer, or answers why not.
func (l *loop) request(p []byte, peer netip.AddrPort, dst netip.Addr, now time.Time) {
	log := l.s.cfg.Log
	if !clientAddress(peer) {
		l.s.m.dropped.WithLabelValues("bad-source").Inc()
		return
	}
	r, err := parseRequest(p)
	if err != nil {
		l.s.m.dropped.WithLabelValues("malformed").Inc()
		log.V(1).Info("TFTP: malformed request", "client", peer.String(), "err", err.Error())
		return
	}
	if f := l.fetching[peer]; f != nil {
		if f.r.filename == r.filename {
			// Its content is on the way.
			l.s.m.dropped.WithLabelValues("duplicate-request").Inc()
			return
		}
		// The client started over asking for another file: the content
		// on the way is not an answer to it.
		f.abandoned = true
		delete(l.fetching, peer)
	}
	if x := l.byPeer[peer]; x != nil {
		if !x.underway() && x.requested == r.filename {
			// The client asked again before our first answer reached
			// it; the acknowledgement of that answer, on the transfer's
			// socket, may have been read first.
			l.s.m.dropped.WithLabelValues("duplicate-request").Inc()
			return
		}
		// The client started over (firmware reset, say) from the same
		// port. No error packet: the client would take it for the answer
		// to its new request.
		l.finish(x, resultAborted, "")
	}
	refuse := func(result string, code uint16, msg string) {
		l.s.m.transfers.WithLabelValues(result).Inc()
		log.V(1).Info("TFTP request refused", "client", peer.String(), "file", logName(r.filename), "why", msg)
		l.sendError(peer, dst, code, msg)
	}
	if r.write {
		refuse(resultRefused, errAccess, "read-only server")
		return
	}
	name, static := l.s.Allowed(r.filename)
	if !static && l.cfg.Source == nil {
		refuse(resultNotFound, errNotFound, "file not found")
		return
	}
	if r.mode != "octet" && r.mode != "netascii" {
		refuse(resultRefused, errIllegalOp, "transfer mode "+sanitize(r.mode)+" not supported: use octet")
		return
	}
	if len(l.byPeer)+l.sourcing >= l.cfg.MaxTransfers {
		l.s.m.dropped.WithLabelValues("busy").Inc()
		return
	}
	if l.perIP[peer.Addr()] >= l.cfg.MaxTransfersPerClient {
		l.s.m.dropped.WithLabelValues("client-busy").Inc()
		return
	}
	if !static && r.mode != "octet" {
		// Proxied files are large and shared: no per-request copy.
		refuse(resultRefused, errIllegalOp, "transfer mode "+sanitize(r.mode)+" not supported for this file: use octet")
		return
	}
	l.perIP[peer.Addr()]++
	if !static {
		l.startFetch(&pending{r: r, peer: peer, dst: dst, name: name, started: now})
		return
	}
	data, err := l.s.content(name, r.mode == "netascii", now)
	if err != nil {
		l.unclaim(peer.Addr())
		log.Error(err, "TFTP: reading a served file")
		l.s.m.transfers.WithLabelValues(resultError).Inc()
		l.sendError(peer, dst, errUndefined, "cannot read "+name)
		return
	}
	l.start(r, peer, dst, name, data, now, false)
}

// unclaim gives back a client's claim on a transfer.
func (l *loop) unclaim(a netip.Addr) {
	if l.perIP[a]--; l.perIP[a] <= 0 {
		delete(l.perIP, a)
	}
}

// startFetch asks the Source for f's content in a goroutine; takeFetched
// starts the transfer.
func (l *loop) startFetch(f *pending) {
	l.fetching[f.peer] = f
	l.sourcing++
	go func() {
		f.data, f.err = l.cfg.Source(l.ctx, f.name, f.peer.Addr())
		// Never blocks while the loop runs: at most MaxTransfers Source
		// calls run; after shutdown nobody reads.
		select {
		case l.fetched <- f:
			l.wakeUp()
		case <-l.ctx.Done():
		}
	}()
}

// takeFetched starts the transfers whose content arrived, or tells their
// clients why not.
func (l *loop) takeFetched(now time.Time) {
	for {
		var f *pending
		select {
		case f = <-l.fetched:
		default:
			return
		}
		l.sourcing--
		if l.fetching[f.peer] == f {
			delete(l.fetching, f.peer)
		}
		if f.abandoned {
			l.unclaim(f.peer.Addr())
			continue
		}
		if f.err != nil {
			l.unclaim(f.peer.Addr())
			code, result, msg := uint16(errUndefined), resultError, sanitize(f.err.Error())
			if errors.Is(f.err, ErrNotFound) {
				code, result, msg = errNotFound, resultNotFound, "file not found"
			}
			l.s.m.transfers.WithLabelValues(result).Inc()
			l.s.cfg.Log.V(1).Info("TFTP request refused", "client", f.peer.String(), "file", logName(f.name), "why", f.err.Error(),
				"waited", now.Sub(f.started).String())
			l.sendError(f.peer, f.dst, code, msg)
			continue
		}
		if !l.holdSource(f.data) {
			l.unclaim(f.peer.Addr())
			l.s.m.dropped.WithLabelValues("source-memory").Inc()
			l.s.cfg.Log.V(1).Info("TFTP request dropped: transfers hold as much fetched content as allowed", "client", f.peer.String(), "file", logName(f.name))
			continue
		}
		l.start(f.r, f.peer, f.dst, f.name, f.data, now, true)
	}
}

// holdSource counts data as held by one more transfer, unless that would
// take distinct Source content held past MaxSourceBytes; the client then
// asks again later.
func (l *loop) holdSource(data []byte) bool {
	if len(data) == 0 {
		return true
	}
	key := unsafe.SliceData(data)
	if l.sourceRefs[key] == 0 {
		if l.sourceHeld+int64(len(data)) > l.cfg.MaxSourceBytes {
			return false
		}
		l.sourceHeld += int64(len(data))
	}
	l.sourceRefs[key]++
	return true
}

// releaseSource undoes holdSource when a transfer of data ends.
func (l *loop) releaseSource(data []byte) {
	if len(data) == 0 {
		return
	}
	key := unsafe.SliceData(data)
	if l.sourceRefs[key]--; l.sourceRefs[key] <= 0 {
		delete(l.sourceRefs, key)
		l.sourceHeld -= int64(len(data))
	}
}

// maxSourceTimeout caps the timeout option of transfers from the Source:
// their content is large and held while the transfer lasts, so a client
// that stops acknowledging must not hold it for 5 × 255 s.
const maxSourceTimeout = 10

// start begins the transfer of data to peer; the client's claim is counted.
// fromSource marks content from the Source.
func (l *loop) start(r request, peer netip.AddrPort, dst netip.Addr, name string, data []byte, now time.Time, fromSource bool) {
	log := l.s.cfg.Log
	var err error
	neg := negotiate(r, l.cfg.MaxBlockSize, maxWindow)
	if fromSource && neg.timeoutSeconds > maxSourceTimeout {
		neg.timeoutSeconds = 0 // not acknowledged: the server's own applies
	}
	timeout := l.cfg.Timeout
	if neg.timeoutSeconds > 0 {
		timeout = time.Duration(neg.timeoutSeconds) * time.Second
	}
	oack := appendOACK(nil, r, neg, len(data))
	if len(oack) == 0 {
		oack = nil
	}
	x := &xfer{transfer: newTransfer(data, neg.blksize, neg.windowsize, timeout, l.cfg.Retries, oack),
		fd: -1, peer: peer, peerSA: rawSockaddr(peer), file: logName(name), requested: r.filename, started: now, fromSource: fromSource}
	x.probe = l.cfg.Timeout
	if l.cfg.SinglePort {
		x.control = pktinfo(dst)
	} else if x.fd, err = l.openTransferSocket(dst, peer); err != nil {
		l.unclaim(peer.Addr())
		if fromSource {
			l.releaseSource(data)
		}
		log.Error(err, "TFTP: open a transfer's socket", "client", peer.String())
		l.s.m.transfers.WithLabelValues(resultError).Inc()
		l.sendError(peer, dst, errUndefined, "server error")
		return
	} else {
		l.byFD[int32(x.fd)] = x
	}
	l.byPeer[peer] = x
	l.s.m.active.Inc()
	if l.nextScan.Before(now) {
		l.nextScan = now.Add(l.tick)
	}
	l.queueSend(x, x.begin(now))
}

// openTransferSocket opens a transfer's socket on the address the request
// was sent to, connected to the client.
func (l *loop) openTransferSocket(src netip.Addr, peer netip.AddrPort) (int, error) {
	fd, err := rawSocket()
	if err != nil {
		return -1, err
	}
	if !src.IsValid() {
		src = netip.IPv4Unspecified()
	}
	local, remote := rawSockaddr(netip.AddrPortFrom(src, 0)), rawSockaddr(peer)
	if err = rawBind(fd, &local); err == nil {
		err = rawConnect(fd, &remote)
	}
	if err == nil {
		err = rawEpollAdd(l.ep, fd)
	}
	if err != nil {
		rawClose(fd)
		return -1, err
	}
	return fd, nil
}

// transferPacket takes a packet from a transfer's client.
func (l *loop) transferPacket(x *xfer, p []byte, now time.Time) {
	if len(p) < 4 {
		l.s.m.dropped.WithLabelValues("malformed").Inc()
		return
	}
	switch binary.BigEndian.Uint16(p) {
	case opACK:
		next, done := x.ack(binary.BigEndian.Uint16(p[2:]), now)
		if done {
			l.finish(x, resultOK, "")
		} else if !next.empty() {
			l.queueSend(x, next)
		}
	case opERROR:
		// RFC 2347: code 8 means the client refused our options.
		l.s.cfg.Log.V(1).Info("TFTP client ended the transfer", "client", x.peer.String(), "file", x.file,
			"code", binary.BigEndian.Uint16(p[2:]), "message", sanitize(strings.TrimRight(string(p[4:]), "\x00")))
		l.finish(x, resultAborted, "")
	default:
		l.s.m.dropped.WithLabelValues("unexpected").Inc()
	}
}

// expire resends what timed out and ends transfers out of retries.
func (l *loop) expire(now time.Time) {
	for _, x := range l.byPeer {
		resend, failed := x.expire(now)
		switch {
		case failed:
			l.finish(x, resultTimeout, "timeout")
		case resend.oack:
			l.s.m.resent.Inc()
			l.queueSend(x, resend)
		case !resend.empty():
			l.s.m.resent.Add(float64(resend.to - resend.from + 1))
			l.queueSend(x, resend)
		}
	}
	l.nextScan = now.Add(l.tick)
}

// finish ends a transfer, telling the client why when msg is set.
func (l *loop) finish(x *xfer, result, msg string) {
	if x.finished {
		return
	}
	x.finished = true
	if msg != "" {
		if x.fd >= 0 {
			_, _ = rawWrite(x.fd, appendError(nil, errUndefined, msg))
		} else {
			sa := x.peerSA
			l.sendErrorTo(&sa, x.control, errUndefined, msg)
		}
	}
	if x.fd >= 0 {
		delete(l.byFD, int32(x.fd))
		rawClose(x.fd) // also leaves the epoll set
	}
	delete(l.byPeer, x.peer)
	l.unclaim(x.peer.Addr())
	if x.fromSource {
		l.releaseSource(x.data)
	}
	l.s.m.active.Dec()
	l.s.m.transfers.WithLabelValues(result).Inc()
	if result == resultOK && l.s.cfg.Completed != nil {
		l.s.cfg.Completed.Inc()
	}
	if l.s.cfg.Finished != nil {
		l.s.cfg.Finished(x.peer.Addr(), x.file, result, x.sentB)
	}
	l.s.cfg.Log.V(1).Info("TFTP transfer ended", "client", x.peer.String(), "file", x.file, "result", result,
		"blksize", x.blksize, "windowsize", x.window, "bytes", x.sentB, "duration", time.Since(x.started).String())
}

func (l *loop) queueSend(x *xfer, r sendRange) {
	x.pending = r // a later window replaces one not sent yet
	if !x.queued {
		x.queued = true
		l.queue = append(l.queue, x)
	}
}

// flush sends what this iteration queued: per transfer on its own socket,
// or all at once on the listening socket in single-port mode.
func (l *loop) flush() {
	for _, x := range l.queue {
		x.queued = false
		if x.finished {
			continue
		}
		r := x.pending
		if r.oack {
			l.room(x)
			l.tx.add(x, x.oack, nil)
		} else {
			for k := r.from; k <= r.to; k++ {
				l.room(x)
				hdr := l.tx.header()
				l.tx.add(x, hdr[:], x.block(k, hdr))
			}
			n := int64(x.size(r.from, r.to))
			x.sentB += n
			l.s.m.bytes.Add(float64(n))
		}
		if x.fd >= 0 {
			l.send(x.fd, x)
		}
	}
	if l.tx.n > 0 {
		l.send(l.listen, nil)
	}
	l.queue = l.queue[:0]
}

// room makes room in the batch for a packet of x. A transfer on its own
// socket sends a window at most, which fits one batch; on the listening
// socket the batch is sent whenever it is full.
func (l *loop) room(x *xfer) {
	if x.fd < 0 && l.tx.full() {
		l.send(l.listen, nil)
	}
}

// send sends the batch on fd; x is the transfer fd belongs to, nil for
// the listening socket. A full socket buffer drops the rest: the
// transfer's timeout sends it again.
func (l *loop) send(fd int, x *xfer) { l.sendBatch(&l.tx, fd, x) }

func (l *loop) sendBatch(b *txBatch, fd int, x *xfer) {
	defer b.reset()
	for off := 0; off < b.n; {
		n, err := b.send(fd, off)
		switch {
		case err == nil && n > 0:
			off += n
			continue
		case err == nil:
			return
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
		case clientGone(err) && x != nil:
			l.finish(x, resultAborted, "")
		case x != nil:
			l.s.cfg.Log.Error(err, "TFTP: send", "client", x.peer.String())
			l.finish(x, resultError, "")
		default:
			// One unreachable client must not hold up the others.
			l.s.cfg.Log.V(1).Info("TFTP: send", "err", err.Error())
			off++
			continue
		}
		return
	}
}

// sendError answers a client from the listening socket.
func (l *loop) sendError(peer netip.AddrPort, src netip.Addr, code uint16, msg string) {
	sa := rawSockaddr(peer)
	l.sendErrorTo(&sa, pktinfo(src), code, msg)
}

// sendErrorTo answers from the listening socket, from the address control
// names (none: the kernel's choice).
func (l *loop) sendErrorTo(sa *unix.RawSockaddrInet4, control []byte, code uint16, msg string) {
	l.etx.addTo(sa, control, appendError(nil, code, msg), nil)
	l.sendBatch(&l.etx, l.listen, nil)
}

// clientGone tells whether a socket error says the client cannot be
// reached any more: its port closed (ICMP port unreachable), or no route
// or neighbour answers for it (a forged source address, say). That ends
// its transfer as aborted; it is no fault of the server's.
func clientGone(err error) bool {
	switch err {
	case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN:
		return true
	}
	return false
}

func (l *loop) close() {
	l.cancelFetch()
	for _, x := range l.byPeer {
		if x.fd >= 0 {
			unix.Close(x.fd)
		}
	}
	l.wakeMu.Lock()
	if l.wakeFD >= 0 {
		unix.Close(l.wakeFD)
		l.wakeFD = -1
	}
	l.wakeMu.Unlock()
	if l.epf != nil {
		l.epf.Close()
	} else if l.ep >= 0 {
		unix.Close(l.ep)
	}
	if l.listen >= 0 {
		unix.Close(l.listen)
	}
}

func rawSockaddr(ap netip.AddrPort) unix.RawSockaddrInet4 {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
	return sa
}

// pktinfo is the control message that sends from src, nil when src is not
// an address to send from (the kernel then picks one).
func pktinfo(src netip.Addr) []byte {
	if !src.IsValid() || !src.Is4() || src.IsUnspecified() || src.IsMulticast() || src == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil
	}
	b := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	info := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	info.Spec_dst = src.As4()
	return b
}

// rxBatch receives many datagrams with one recvmmsg.
type rxBatch struct {
	msgs    []unix.Mmsghdr
	iovs    []unix.Iovec
	bufs    [][]byte
	names   []unix.RawSockaddrInet4
	control [][]byte
}

func (b *rxBatch) init() {
	b.msgs = make([]unix.Mmsghdr, batchSize)
	b.iovs = make([]unix.Iovec, batchSize)
	b.bufs = make([][]byte, batchSize)
	b.names = make([]unix.RawSockaddrInet4, batchSize)
	b.control = make([][]byte, batchSize)
	for i := range b.msgs {
		b.bufs[i] = make([]byte, packetSize)
		b.control[i] = make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(packetSize)
		h := &b.msgs[i].Hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
	}
}

// recv reads up to batchSize datagrams, none when there are none.
func (b *rxBatch) recv(fd int) int {
	for i := range b.msgs {
		h := &b.msgs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Control = &b.control[i][0]
		h.SetControllen(len(b.control[i]))
		h.Flags = 0
	}
	for {
		n, err := rawRecvmmsg(fd, b.msgs)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0
		}
		return n
	}
}

// packet returns datagram i, its sender and the address it was sent to;
// not ok when it was truncated or not from an IPv4 sender.
func (b *rxBatch) packet(i int) (p []byte, from netip.AddrPort, dst netip.Addr, ok bool) {
	m := &b.msgs[i]
	if m.Hdr.Flags&unix.MSG_TRUNC != 0 || b.names[i].Family != unix.AF_INET {
		return nil, from, dst, false
	}
	sa := &b.names[i]
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	from = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	if cmsgs, err := unix.ParseSocketControlMessage(b.control[i][:m.Hdr.Controllen]); err == nil {
		for _, c := range cmsgs {
			if c.Header.Level == unix.IPPROTO_IP && c.Header.Type == unix.IP_PKTINFO && len(c.Data) >= unix.SizeofInet4Pktinfo {
				// The local address the datagram was for: its destination,
				// or for a broadcast the address of the interface it came in on.
				dst = netip.AddrFrom4((*unix.Inet4Pktinfo)(unsafe.Pointer(&c.Data[0])).Spec_dst)
			}
		}
	}
	return b.bufs[i][:m.Len], from, dst, true
}

// txBatch sends many datagrams with one sendmmsg: each a header or packet
// and, for data, the block's bytes straight from the file's content.
type txBatch struct {
	msgs    []unix.Mmsghdr
	iovs    [][2]unix.Iovec
	headers [][4]byte
	n       int
}

func (b *txBatch) init(size int) {
	b.msgs = make([]unix.Mmsghdr, size)
	b.iovs = make([][2]unix.Iovec, size)
	b.headers = make([][4]byte, size)
}

func (b *txBatch) full() bool { return b.n == len(b.msgs) }

func (b *txBatch) reset() { b.n = 0 }

// header is storage for the next message's DATA header.
func (b *txBatch) header() *[4]byte { return &b.headers[b.n] }

// add queues a packet for x: head, then body (may be empty).
func (b *txBatch) add(x *xfer, head, body []byte) {
	if x.fd >= 0 {
		b.addTo(nil, nil, head, body)
	} else {
		b.addTo(&x.peerSA, x.control, head, body)
	}
}

func (b *txBatch) addTo(to *unix.RawSockaddrInet4, control, head, body []byte) {
	m := &b.msgs[b.n]
	m.Hdr = unix.Msghdr{}
	if to != nil {
		m.Hdr.Name = (*byte)(unsafe.Pointer(to))
		m.Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	if len(control) > 0 {
		m.Hdr.Control = &control[0]
		m.Hdr.SetControllen(len(control))
	}
	iov := &b.iovs[b.n]
	iov[0].Base = &head[0]
	iov[0].SetLen(len(head))
	m.Hdr.Iov = &iov[0]
	m.Hdr.SetIovlen(1)
	if len(body) > 0 {
		iov[1].Base = &body[0]
		iov[1].SetLen(len(body))
		m.Hdr.SetIovlen(2)
	}
	b.n++
}

// send sends the queued messages from off on; it returns how many left.
func (b *txBatch) send(fd, off int) (int, error) {
	return rawSendmmsg(fd, b.msgs[off:b.n])
}
