package devcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// process is one child of the control plane, logging into its own file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid once done is closed
}

func startProcess(name, binary, logDir string, args []string) (*process, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a Ctrl-C in the terminal reaches only us, and
		// we stop the children in order (apiserver before etcd).
		Setpgid: true,
		// If we die without stopping them (kill -9), the kernel stops them.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the whole process group to terminate and kills it after grace.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// failure describes an unexpected exit with the end of the process's log,
// which is where etcd and kube-apiserver say why.
func (p *process) failure() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 15))
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "  (no log: " + err.Error() + ")"
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	var b bytes.Buffer
	for _, l := range all {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// errMissingBinary is returned when `make testbin` has not run.
var errMissingBinary = errors.New("control-plane binary missing")
