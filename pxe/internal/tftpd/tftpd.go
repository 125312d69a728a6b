package tftpd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentboot/agentboot/internal/clip"
)

// Config of the server.
type Config struct {
	// Dir holds the files (/usr/lib/ipxe from Debian's ipxe package).
	Dir string
	// Files are the names served from Dir; others go to Source, or get an
	// error packet when there is none.
	Files []string
	// Timeout is how long a block waits for its acknowledgement before it
	// is sent again (2 s; a client's timeout option overrides it), and
	// Retries how often (5) before the transfer ends.
	Timeout time.Duration
	Retries int
	// SinglePort serves every transfer from the listening socket instead of
	// a new socket (and port) per transfer, for firewalls that pass only
	// port 69 and for listeners handed over from another network namespace.
	SinglePort bool
	// MaxBlockSize caps the negotiated blksize: the boot network's MTU less
	// the IP, UDP and TFTP headers, so no block is fragmented. 0 caps it at
	// 1468 (a 1500-byte MTU).
	MaxBlockSize int
	// MaxTransfers caps concurrent transfers (1024), and
	// MaxTransfersPerClient those of one client address (64); requests
	// beyond them are dropped, so the client asks again later.
	MaxTransfers, MaxTransfersPerClient int
	// Source serves names that are not among Files, or nil. It runs in a
	// goroutine of its own (it may fetch over the network), gets the name
	// as requested without a leading slash and the client's address, and
	// returns the whole content. An error wrapping ErrNotFound answers
	// "file not found"; any other error answers with its message. The
	// context ends when the server shuts down.
	Source func(ctx context.Context, name string, client netip.Addr) ([]byte, error)
	// MaxSourceBytes bounds the Source content live transfers hold, each
	// distinct content (the same slice shared by many transfers) counted
	// once (2 GiB); a request past it is dropped and the client asks
	// again.
	MaxSourceBytes int64
	Log            logr.Logger
	Registerer     prometheus.Registerer
	// Completed, if set, counts transfers sent whole.
	Completed prometheus.Counter
	// Finished, if set, is told of each transfer that ended (result ok:
	// sent whole), for the client's boot trace.
	Finished func(client netip.Addr, file, result string, bytes int64)
}

// maxWindow caps the negotiated windowsize: 64 blocks of 1468 bytes fit a
// socket's default send buffer, and the loop sends a window with one
// system call.
const maxWindow = 64

// ErrNotFound is what a Source returns for a name it does not have.
var ErrNotFound = errors.New("file not found")

// Server is a TFTP server.
type Server struct {
	cfg     Config
	allowed map[string]bool
	m       metrics

	// The binaries are small (tens of KiB to a few MiB) and sent block by
	// block: serving them from memory saves a read per block.
	mu    sync.Mutex
	cache map[string]cached

	// stop ends Serve's loop: see Serve and Shutdown.
	stopMu   sync.Mutex
	stopping bool
	wake     func()
	done     chan struct{}
}

// cached is a file's content as of its size and modification time, checked
// at most once a second: an upgraded ipxe package is picked up within a
// second, and a busy server does not stat the file for every transfer.
type cached struct {
	data, netascii []byte
	size           int64
	modTime        time.Time
	checked        time.Time
}

// recheck is how long a file's cached content is served without a stat.
const recheck = time.Second

// metrics count transfers by outcome, bytes and dropped packets.
type metrics struct {
	transfers *prometheus.CounterVec
	bytes     prometheus.Counter
	dropped   *prometheus.CounterVec
	resent    prometheus.Counter
	active    prometheus.Gauge
}

// Transfer outcomes, the result label of agentboot_tftp_requests_total.
const (
	resultOK       = "ok"
	resultNotFound = "not-found"
	resultRefused  = "refused" // write requests, unsupported modes
	resultAborted  = "aborted" // the client sent an error or went away
	resultTimeout  = "timeout"
	resultError    = "error" // the server could not read the file or open a socket
)

// New checks the configuration.
func New(cfg Config) (*Server, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Retries == 0 {
		cfg.Retries = 5
	}
	if cfg.MaxTransfers == 0 {
		cfg.MaxTransfers = 1024
	}
	if cfg.MaxTransfersPerClient == 0 {
		cfg.MaxTransfersPerClient = 64
	}
	if cfg.MaxSourceBytes == 0 {
		cfg.MaxSourceBytes = 2 << 30
	}
	if cfg.MaxBlockSize == 0 {
		cfg.MaxBlockSize = 1468
	}
	if cfg.MaxBlockSize <= 512 || cfg.MaxBlockSize > 65464 {
		return nil, fmt.Errorf("TFTP: maximum block size %d is outside 513–65464", cfg.MaxBlockSize)
	}
	if cfg.Timeout < 0 || cfg.Retries < 0 || cfg.MaxTransfers < 0 || cfg.MaxTransfersPerClient < 0 {
		return nil, errors.New("TFTP: timeout, retries and transfer limits must not be negative")
	}
	s := &Server{cfg: cfg, allowed: map[string]bool{}, cache: map[string]cached{}}
	for _, f := range cfg.Files {
		if f == "" {
			continue
		}
		if f != filepath.Base(f) || strings.HasPrefix(f, ".") {
			return nil, fmt.Errorf("TFTP: %q is not a plain file name", f)
		}
		if _, err := os.Stat(filepath.Join(cfg.Dir, f)); err != nil {
			return nil, fmt.Errorf("TFTP: %w (install Debian's ipxe package or set the TFTP directory)", err)
		}
		s.allowed[f] = true
	}
	s.m = metrics{
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_tftp_requests_total", Help: "TFTP requests, by outcome."}, []string{"result"}),
		bytes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "agentboot_tftp_bytes_sent_total", Help: "Bytes of file content sent over TFTP, resends included."}),
		dropped:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_tftp_dropped_total", Help: "TFTP packets dropped unanswered, by reason."}, []string{"reason"}),
		resent:    prometheus.NewCounter(prometheus.CounterOpts{Name: "agentboot_tftp_resent_total", Help: "TFTP packets sent again after a timeout."}),
		active:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "agentboot_tftp_transfers", Help: "TFTP transfers in progress."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.m.transfers, s.m.bytes, s.m.dropped, s.m.resent, s.m.active)
	}
	return s, nil
}

// Allowed reports whether a requested name is one of Files, and the plain
// name to serve. Clients may ask with a leading slash.
func (s *Server) Allowed(requested string) (string, bool) {
	name := strings.TrimPrefix(requested, "/")
	return name, s.allowed[name]
}

// content returns name's current content, from memory unless the file
// changed, in netascii form when asked.
func (s *Server) content(name string, netascii bool, now time.Time) ([]byte, error) {
	s.mu.Lock()
	c, ok := s.cache[name]
	s.mu.Unlock()
	if !ok || now.Sub(c.checked) >= recheck {
		path := filepath.Join(s.cfg.Dir, name)
		st, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !ok || c.size != st.Size() || !c.modTime.Equal(st.ModTime()) {
			data, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			c = cached{data: data, size: int64(len(data)), modTime: st.ModTime()}
		}
		c.checked = now
	}
	if netascii && c.netascii == nil {
		c.netascii = toNetascii(c.data)
	}
	s.mu.Lock()
	s.cache[name] = c
	s.mu.Unlock()
	if netascii {
		return c.netascii, nil
	}
	return c.data, nil
}

// logName is a requested name for the log: without its query, which may
// carry a credential (the image service's tokens), printable and short.
func logName(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s = s[:i] + "?…"
	}
	return sanitize(s)
}

// sanitize keeps logged names printable and short.
func sanitize(s string) string {
	return clip.Text(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s), 64)
}

// Serve serves on conn, a UDP socket, until Shutdown; conn stays open and
// is the caller's to close.
func (s *Server) Serve(conn net.PacketConn) error {
	s.stopMu.Lock()
	if s.stopping {
		s.stopMu.Unlock()
		return nil
	}
	l, err := newLoop(s, conn)
	if err != nil {
		s.stopMu.Unlock()
		return fmt.Errorf("TFTP: %w", err)
	}
	s.wake, s.done = l.wakeUp, make(chan struct{})
	s.stopMu.Unlock()
	defer close(s.done)
	return l.run()
}

// isStopping tells whether Shutdown was called.
func (s *Server) isStopping() bool {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	return s.stopping
}

// Shutdown ends Serve: transfers in progress get an error packet. It
// returns once Serve's sockets are closed.
func (s *Server) Shutdown() {
	s.stopMu.Lock()
	s.stopping = true
	wake, done := s.wake, s.done
	s.stopMu.Unlock()
	if wake != nil {
		wake()
		<-done
	}
}
