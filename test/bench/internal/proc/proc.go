// Package proc runs the benchmarks' server processes: each with its output
// in a log file, killed with the benchmark if it dies, and measured by its
// resident memory.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a running process.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // its stdout and stderr
}

// Start runs args[0] with args[1:], its output in dir/name.log.
func Start(name, dir string, args ...string) (*Proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &Proc{Name: name, Cmd: cmd, Log: logPath}, nil
}

// Stop interrupts the process and kills it if it has not exited 10 s
// later.
func (p *Proc) Stop() {
	_ = p.Cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-done
	}
}

// RSS is the process's resident set in bytes.
func (p *Proc) RSS() int64 { return RSS(p.Cmd.Process.Pid) }

// RSS is process pid's resident set in bytes (0 when it is gone).
func RSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Peak samples the process's resident memory every 20 ms from now until
// the returned function is called, which gives it as it was then and its
// peak since.
func (p *Proc) Peak() func() (before, peak int64) {
	before := p.RSS()
	stop := make(chan struct{})
	got := make(chan int64, 1)
	go func() {
		m := before
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				got <- max(m, p.RSS())
				return
			case <-t.C:
				m = max(m, p.RSS())
			}
		}
	}()
	return func() (int64, int64) { close(stop); return before, <-got }
}
