// Package tftpd serves the iPXE binaries over TFTP, read only, by name from
// an allowlist: no paths, no directory listing, no uploads.
package tftpd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// Config of the server.
type Config struct {
	// Dir holds the files (/usr/lib/ipxe from Debian's ipxe package).
	Dir string
	// Files are the names that may be fetched; others get an error packet.
	Files []string
	// Timeout per round trip; a transfer whose client stops answering ends.
	Timeout time.Duration
	// SinglePort serves every transfer from the listening socket instead of
	// a new socket (and port) per transfer, for firewalls that pass only
	// port 69 and for listeners handed over from another network namespace.
	SinglePort bool
	// MaxBlockSize caps the negotiated blksize: the boot network's MTU less
	// the IP, UDP and TFTP headers, so no block is fragmented. 0 leaves
	// pin/tftp's own cap (the receiving interface's MTU less 28) with
	// per-transfer sockets and 512 in single-port mode.
	MaxBlockSize int
	Log          logr.Logger
	Registerer   prometheus.Registerer
}

// Server is a TFTP server.
type Server struct {
	cfg       Config
	allowed   map[string]bool
	srv       *tftp.Server
	transfers *prometheus.CounterVec
	bytes     prometheus.Counter

	// The binaries are small (tens of KiB to a few MiB) and sent block by
	// block: serving them from memory saves a read per block.
	mu    sync.Mutex
	cache map[string]cached
}

// cached is a file's content as of its size and modification time; an
// upgraded ipxe package is picked up at the next transfer.
type cached struct {
	data    []byte
	size    int64
	modTime time.Time
}

// New checks the configuration.
func New(cfg Config) (*Server, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
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
	s.transfers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_tftp_requests_total", Help: "TFTP read requests, by outcome."}, []string{"result"})
	s.bytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "agentboot_tftp_bytes_sent_total", Help: "Bytes sent over TFTP."})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.transfers, s.bytes)
	}
	s.srv = tftp.NewServer(s.read, nil)
	s.srv.SetTimeout(cfg.Timeout)
	s.srv.SetRetries(5)
	if cfg.SinglePort {
		s.srv.EnableSinglePort()
		// portConn (see Serve) leaves pin/tftp no interface to derive a
		// cap from: MaxBlockSize is the cap.
		s.srv.SetBlockSizeNegotiation(false)
	}
	if cfg.MaxBlockSize != 0 {
		if cfg.MaxBlockSize <= 512 || cfg.MaxBlockSize > 65464 {
			return nil, fmt.Errorf("TFTP: maximum block size %d is outside 513–65464", cfg.MaxBlockSize)
		}
		s.srv.SetBlockSize(cfg.MaxBlockSize)
	}
	return s, nil
}

// ErrNotAllowed is the answer to a name outside the allowlist.
var ErrNotAllowed = errors.New("file not found")

// Allowed reports whether a requested name may be served, and the plain name
// to serve. Clients may ask with a leading slash.
func (s *Server) Allowed(requested string) (string, bool) {
	name := strings.TrimPrefix(requested, "/")
	return name, s.allowed[name]
}

// read answers one read request.
func (s *Server) read(requested string, rf io.ReaderFrom) error {
	name, ok := s.Allowed(requested)
	if !ok {
		s.transfers.WithLabelValues("not-found").Inc()
		s.cfg.Log.V(1).Info("TFTP request refused", "file", sanitize(requested))
		return ErrNotAllowed
	}
	data, err := s.content(name)
	if err != nil {
		s.transfers.WithLabelValues("error").Inc()
		s.cfg.Log.Error(err, "TFTP: reading a served file")
		return ErrNotAllowed
	}
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		ot.SetSize(int64(len(data))) // answers tsize
	}
	n, err := rf.ReadFrom(bytes.NewReader(data))
	s.bytes.Add(float64(n))
	if err != nil {
		s.transfers.WithLabelValues("aborted").Inc()
		return err
	}
	s.transfers.WithLabelValues("ok").Inc()
	return nil
}

// content returns name's current content, from memory unless the file
// changed.
func (s *Server) content(name string) ([]byte, error) {
	path := filepath.Join(s.cfg.Dir, name)
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	c, ok := s.cache[name]
	s.mu.Unlock()
	if ok && c.size == st.Size() && c.modTime.Equal(st.ModTime()) {
		return c.data, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.cache[name] = cached{data: data, size: int64(len(data)), modTime: st.ModTime()}
	s.mu.Unlock()
	return data, nil
}

// sanitize keeps logged names printable and short.
func sanitize(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// Serve serves on conn until Shutdown.
func (s *Server) Serve(conn net.PacketConn) error {
	if u, ok := conn.(*net.UDPConn); ok && s.cfg.SinglePort {
		pc, err := newPortConn(u)
		if err != nil {
			return fmt.Errorf("TFTP: %w", err)
		}
		conn = pc
	}
	return s.srv.Serve(conn)
}

// Shutdown stops the server.
func (s *Server) Shutdown() { s.srv.Shutdown() }
