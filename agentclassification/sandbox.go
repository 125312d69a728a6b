package agentclassification

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/itchyny/gojq"
	"golang.org/x/sys/unix"
)

// A query is a program its author wrote, run on every Agent of the
// namespace: one can allocate without bound ("x" * 1e10, [range(1e9)]).
// Queries therefore run in a worker process of their own, whose address
// space the kernel caps (RLIMIT_AS): a query that allocates past it kills
// the worker, never the manager; the query fails on that Agent and a new
// worker takes the next one.

// Matcher runs a classification's query on an Agent's inventory.
type Matcher interface {
	// Match says whether query gives true on inventory (its JSON).
	Match(ctx context.Context, query string, inventory []byte) (bool, error)
}

// InProcess runs queries in the calling process, bounded in time only.
type InProcess struct{ Timeout time.Duration }

// Match compiles and runs query.
func (m InProcess) Match(ctx context.Context, query string, inventory []byte) (bool, error) {
	code, err := Compile(query)
	if err != nil {
		return false, err
	}
	var v any
	if err := json.Unmarshal(inventory, &v); err != nil {
		return false, err
	}
	return Match(ctx, code, v, m.Timeout)
}

// DefaultWorkerMemory is the address space a query worker may use beyond
// what it uses once started: with the manager's own (about 425 MiB with
// 10,000 hosts), inside the manager container's 1 GiB limit, which the
// kernel enforces on both processes together.
const DefaultWorkerMemory = 128 << 20

type request struct {
	Query     string          `json:"query"`
	Inventory json.RawMessage `json:"inventory"`
}

type response struct {
	Match bool   `json:"match"`
	Error string `json:"error,omitempty"`
}

// Sandbox runs queries in a worker process (Command), one at a time.
type Sandbox struct {
	// Command makes the worker's command (agentboot classify-worker).
	Command func() *exec.Cmd
	// Timeout bounds one query (DefaultTimeout); the worker that has not
	// answered a second after it is killed.
	Timeout time.Duration
	// Memory is the worker's cap, for messages (DefaultWorkerMemory).
	Memory int64

	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	exited chan struct{}
	stderr *firstLine
}

// firstLine keeps the first line a worker writes on stderr (the Go
// runtime's "fatal error: runtime: out of memory"), not the goroutine
// dump after it.
type firstLine struct {
	mu  sync.Mutex
	buf []byte
}

func (f *firstLine) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if room := 512 - len(f.buf); room > 0 {
		f.buf = append(f.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (f *firstLine) first() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	line, _, _ := strings.Cut(string(f.buf), "\n")
	return strings.TrimSpace(line)
}

// Match runs query in the worker, starting one when none runs.
func (s *Sandbox) Match(ctx context.Context, query string, inventory []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	if s.cmd == nil {
		if err := s.start(); err != nil {
			return false, fmt.Errorf("start the query worker: %w", err)
		}
	}
	line, err := json.Marshal(request{Query: query, Inventory: inventory})
	if err != nil {
		return false, err
	}
	if _, err := s.in.Write(append(line, '\n')); err != nil {
		return false, s.lost("it could not be sent the query")
	}
	answer := make(chan []byte, 1)
	go func(out *bufio.Reader) {
		// An answer is a line of at most the reader's 64 KiB: a longer
		// one (a query's error made huge) ends the worker.
		b, err := out.ReadSlice('\n')
		if err != nil {
			b = nil
		}
		answer <- bytes.Clone(b)
	}(s.out)
	select {
	case b := <-answer:
		if b == nil {
			memory := s.Memory
			if memory <= 0 {
				memory = DefaultWorkerMemory
			}
			why := fmt.Sprintf("the query used more memory than the query worker may (%d MiB), or the worker failed", memory>>20)
			stderr := s.stderr
			err := s.lost(why) // waits for the worker: its stderr is all there
			if line := stderr.first(); line != "" {
				err = fmt.Errorf("%w: %s", err, line)
			}
			return false, err
		}
		var r response
		if err := json.Unmarshal(b, &r); err != nil {
			return false, s.lost("its answer was malformed")
		}
		if r.Error != "" {
			return false, errors.New(r.Error)
		}
		return r.Match, nil
	case <-time.After(s.Timeout + time.Second):
		return false, s.lost(fmt.Sprintf("the query ran longer than %s", s.Timeout))
	case <-ctx.Done():
		_ = s.lost("")
		return false, ctx.Err()
	}
}

// lost kills the worker (the next query starts another) and says why.
func (s *Sandbox) lost(why string) error {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
	return errors.New(why)
}

func (s *Sandbox) start() error {
	cmd := s.Command()
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	// A query past the cap ends the worker with the Go runtime's "out of
	// memory" and a dump of its goroutines: the first line goes into the
	// query's error, the rest nowhere.
	stderr := &firstLine{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.in, s.out, s.exited, s.stderr = cmd, in, bufio.NewReaderSize(out, 64<<10), exited, stderr
	return nil
}

// clip shortens s to at most n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// addressSpace is the process's virtual size (VmSize), in bytes.
func addressSpace() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmSize:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("VmSize %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmSize in /proc/self/status")
}

// Close stops the worker.
func (s *Sandbox) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.lost("")
}

// Worker is the query worker's main: it caps its own address space at
// what it uses once started plus memory bytes (the executable and the Go
// runtime's own reservations are not the queries'), then answers one
// request a line from in on out until in ends. Compiled queries are kept
// for the next Agents.
func Worker(in io.Reader, out io.Writer, memory int64, timeout time.Duration) error {
	used, err := addressSpace()
	if err != nil {
		return err
	}
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_AS, &cur); err != nil {
		return err
	}
	limit := min(uint64(used+memory), cur.Max)
	if err := unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		return fmt.Errorf("cap the address space: %w", err)
	}
	codes := map[string]*gojq.Code{}
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var req request
		var resp response
		if err := json.Unmarshal(line, &req); err != nil {
			resp.Error = "malformed request: " + err.Error()
		} else {
			resp.Match, err = func() (bool, error) {
				code := codes[req.Query]
				if code == nil {
					c, err := Compile(req.Query)
					if err != nil {
						return false, err
					}
					if len(codes) >= 256 {
						clear(codes)
					}
					code, codes[req.Query] = c, c
				}
				var v any
				if err := json.Unmarshal(req.Inventory, &v); err != nil {
					return false, err
				}
				return Match(context.Background(), code, v, timeout)
			}()
			if err != nil {
				// A query can make its error as large as its memory.
				resp.Error = clip(err.Error(), 1024)
			}
		}
		if err := enc.Encode(resp); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
}
