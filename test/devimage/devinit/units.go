package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/internal/cmdwords"
)

// procTable hands each child's exit status to whoever started it. PID 1 reaps
// every process, so exec.Cmd.Wait cannot be used.
type procTable struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
	early   map[int]unix.WaitStatus // exits seen before start registered
}

func newProcTable() *procTable {
	return &procTable{waiting: map[int]chan unix.WaitStatus{}, early: map[int]unix.WaitStatus{}}
}

func (t *procTable) exited(pid int, ws unix.WaitStatus) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ch, ok := t.waiting[pid]; ok {
		ch <- ws
		delete(t.waiting, pid)
		return
	}
	t.early[pid] = ws
}

// start runs cmd and returns a channel that delivers its exit status.
func (t *procTable) start(cmd *exec.Cmd) (<-chan unix.WaitStatus, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	if ws, ok := t.early[cmd.Process.Pid]; ok {
		delete(t.early, cmd.Process.Pid)
		ch <- ws
		return ch, nil
	}
	t.waiting[cmd.Process.Pid] = ch
	return ch, nil
}

// run starts cmd and waits for it, returning an error for a non-zero exit.
func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	ch, err := processes.start(cmd)
	if err != nil {
		return err
	}
	if ws := <-ch; ws.ExitStatus() != 0 {
		return fmt.Errorf("%s exited with status %d", name, ws.ExitStatus())
	}
	return nil
}

// unit is the part of a systemd service unit the dev OS honours.
type unit struct {
	name    string
	exec    []string
	env     []string
	restart bool
}

var (
	servicesMu sync.Mutex
	services   = map[string]*os.Process{}
	stopping   bool
)

// parseUnit reads ExecStart, Environment and Restart from a unit file.
func parseUnit(name, contents string) (unit, error) {
	u := unit{name: name}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(contents))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			continue
		}
		if section != "Service" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "ExecStart":
			v = strings.TrimLeft(strings.TrimSpace(v), "-@+!:")
			u.exec = cmdwords.Split(v)
			for i := range u.exec {
				u.exec[i] = strings.Trim(u.exec[i], `"`)
			}
		case "Environment":
			for _, kv := range cmdwords.Split(strings.TrimSpace(v)) {
				u.env = append(u.env, strings.Trim(kv, `"`))
			}
		case "Restart":
			u.restart = strings.TrimSpace(v) != "no"
		}
	}
	if len(u.exec) == 0 {
		return u, fmt.Errorf("unit %s has no ExecStart", name)
	}
	return u, nil
}

// supervise runs a unit's command, restarting it like Restart=always.
func supervise(u unit) {
	for {
		logf("starting %s: %s", u.name, strings.Join(u.exec, " "))
		cmd := exec.Command(u.exec[0], u.exec[1:]...)
		cmd.Env = append(os.Environ(), u.env...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		ch, err := processes.start(cmd)
		if err != nil {
			logf("%s: %v", u.name, err)
		} else {
			servicesMu.Lock()
			services[u.name] = cmd.Process
			servicesMu.Unlock()
			ws := <-ch
			servicesMu.Lock()
			delete(services, u.name)
			servicesMu.Unlock()
			logf("%s exited with status %d", u.name, ws.ExitStatus())
		}
		servicesMu.Lock()
		done := stopping || !u.restart
		servicesMu.Unlock()
		if done {
			return
		}
		time.Sleep(5 * time.Second)
	}
}

// stopServices terminates every unit before reboot or poweroff: SIGTERM,
// then a wait until each has exited (a service's last report, say the
// agent's, is not cut off by a fixed pause that a slow guest outlasts), and
// SIGKILL for what is left after 30 s.
func stopServices() {
	servicesMu.Lock()
	stopping = true
	for _, p := range services {
		_ = syscall.Kill(-p.Pid, syscall.SIGTERM)
	}
	servicesMu.Unlock()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		servicesMu.Lock()
		left := len(services)
		servicesMu.Unlock()
		if left == 0 {
			return
		}
	}
	servicesMu.Lock()
	defer servicesMu.Unlock()
	for name, p := range services {
		logf("%s did not stop within 30s: killed", name)
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
}
