package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/testenv"
)

// buildAgentboot compiles this command and the agent, next to each other as
// make build puts them, once per test binary.
var buildAgentboot = sync.OnceValues(func() (string, error) {
	dir, err := testenv.ProcessTempDir("agentboot-bin-")
	if err != nil {
		return "", err
	}
	for _, b := range []struct{ out, pkg string }{{"agentboot", "."}, {"agent", "../agent"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return filepath.Join(dir, "agentboot"), nil
})

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := testenv.FreePorts(n)
	require.NoError(t, err)
	return ports
}

// devRun is one `agentboot dev` process under test.
type devRun struct {
	cmd    *exec.Cmd
	output *syncBuffer
	ready  chan struct{}
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type devSetup struct {
	stateDir string
	ports    []int // etcd, etcd peer, apiserver, metrics, probes, image HTTPS, image HTTP
}

func newDevSetup(t *testing.T) devSetup {
	return devSetup{stateDir: t.TempDir(), ports: freePorts(t, 7)}
}

func (d devSetup) args(extra ...string) []string {
	return append([]string{"dev",
		"--state-dir", d.stateDir,
		"--bin-dir", filepath.Join(testenv.RepoRoot(), "bin", "testbin"),
		"--advertise-address", "198.18.0.1",
		"--etcd-port", strconv.Itoa(d.ports[0]),
		"--etcd-peer-port", strconv.Itoa(d.ports[1]),
		"--apiserver-port", strconv.Itoa(d.ports[2]),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", d.ports[3]),
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", d.ports[4]),
		"--https-addr", fmt.Sprintf("127.0.0.1:%d", d.ports[5]),
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", d.ports[6]),
		"--image-cache-dir", filepath.Join(d.stateDir, "cache"),
		"--os-image-stream", filepath.Join(testenv.RepoRoot(), "dist", "dev-image", "stream.json"),
	}, extra...)
}

func startDev(t *testing.T, args []string) *devRun {
	t.Helper()
	bin, err := buildAgentboot()
	require.NoError(t, err)
	r := &devRun{output: &syncBuffer{}, ready: make(chan struct{}), done: make(chan error, 1)}
	r.cmd = exec.Command(bin, args...)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	require.NoError(t, r.cmd.Start())
	pw.Close()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			fmt.Fprintln(r.output, sc.Text())
			// The last line of the "agentboot dev is up" message: the
			// kubeconfig path is read by then.
			if strings.Contains(sc.Text(), "Ctrl-C stops everything") {
				once.Do(func() { close(r.ready) })
			}
		}
	}()
	// done only once all the output is in r.output: Wait returns when the
	// process exits, possibly before the last lines were copied.
	go func() {
		err := r.cmd.Wait()
		<-copied
		r.done <- err
	}()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
		}
	})
	return r
}

func (r *devRun) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-r.ready:
	case err := <-r.done:
		t.Fatalf("agentboot dev exited early (%v):\n%s", err, r.output.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("agentboot dev not up after 2 minutes:\n%s", r.output.String())
	}
}

// interrupt sends Ctrl-C and waits for a clean exit.
func (r *devRun) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, r.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-r.done:
		require.NoError(t, err, r.output.String())
	case <-time.After(time.Minute):
		t.Fatalf("agentboot dev did not stop within a minute of Ctrl-C:\n%s", r.output.String())
	}
}

// processesUsing lists the PIDs whose command line mentions dir.
func processesUsing(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func kubectl(t *testing.T, kubeconfig string, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "bin", "testbin", "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestDevKeepsStateAndStopsCleanly(t *testing.T) {
	d := newDevSetup(t)
	kubeconfig := filepath.Join(d.stateDir, "kubeconfig")

	run := startDev(t, d.args())
	run.waitReady(t)
	require.Contains(t, run.output.String(), kubeconfig, "the kubeconfig path is printed")
	out, err := kubectl(t, kubeconfig, "", "get", "crd", "infraenvs.agent-install.openshift.io", "agents.agent-install.openshift.io", "nmstateconfigs.agent-install.openshift.io", "baremetalhosts.metal3.io", "-o", "name")
	require.NoError(t, err, out)
	require.Equal(t, 4, strings.Count(out, "customresourcedefinition"))
	out, err = kubectl(t, kubeconfig, "", "create", "namespace", "kept")
	require.NoError(t, err, out)
	require.NotEmpty(t, processesUsing(d.stateDir))

	run.interrupt(t)
	require.Empty(t, processesUsing(d.stateDir), "no orphan etcd or kube-apiserver")
	for _, p := range d.ports {
		require.NoError(t, checkFree(p), "port %d freed", p)
	}

	// A second run keeps the state.
	run = startDev(t, d.args())
	run.waitReady(t)
	out, err = kubectl(t, kubeconfig, "", "get", "namespace", "kept", "-o", "name")
	require.NoError(t, err, out)
	run.interrupt(t)

	// --fresh starts clean.
	run = startDev(t, d.args("--fresh"))
	run.waitReady(t)
	out, err = kubectl(t, kubeconfig, "", "get", "namespace", "kept")
	require.Error(t, err)
	require.Contains(t, out, "NotFound")
	run.interrupt(t)
	require.Empty(t, processesUsing(d.stateDir))
}

func TestDevStopsChildrenWhenKilled(t *testing.T) {
	d := newDevSetup(t)
	run := startDev(t, d.args())
	run.waitReady(t)
	require.NotEmpty(t, processesUsing(d.stateDir))
	require.NoError(t, run.cmd.Process.Signal(syscall.SIGKILL))
	<-run.done
	require.Eventually(t, func() bool { return len(processesUsing(d.stateDir)) == 0 }, 30*time.Second, 200*time.Millisecond,
		"the kernel stops etcd and kube-apiserver when agentboot dies")
}

func checkFree(port int) error {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	return l.Close()
}

func TestDevExplainsProblems(t *testing.T) {
	t.Run("port taken", func(t *testing.T) {
		d := newDevSetup(t)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", d.ports[2]))
		require.NoError(t, err)
		defer l.Close()
		run := startDev(t, d.args())
		err = <-run.done
		require.Error(t, err)
		out := run.output.String()
		require.Contains(t, out, fmt.Sprintf("port 127.0.0.1:%d (dev kube-apiserver) is already in use", d.ports[2]))
		require.Contains(t, out, "--apiserver-port")
		require.Empty(t, processesUsing(d.stateDir), "nothing left running")
	})
	t.Run("binary missing", func(t *testing.T) {
		d := newDevSetup(t)
		args := d.args()
		for i := range args {
			if args[i] == "--bin-dir" {
				args[i+1] = t.TempDir()
			}
		}
		run := startDev(t, args)
		err := <-run.done
		require.Error(t, err)
		require.Contains(t, run.output.String(), "etcd not found at")
		require.Contains(t, run.output.String(), "run `make testbin`")
	})
	t.Run("preflight: a port taken", func(t *testing.T) {
		d := newDevSetup(t)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", d.ports[5]))
		require.NoError(t, err)
		defer l.Close()
		run := startDev(t, append(d.args(), "--preflight"))
		require.Error(t, <-run.done)
		require.Contains(t, run.output.String(), fmt.Sprintf("port 127.0.0.1:%d (image service HTTPS) is already in use", d.ports[5]))
		require.Contains(t, run.output.String(), "--https-addr")
		require.NoDirExists(t, filepath.Join(d.stateDir, "etcd"), "preflight starts nothing")
	})
	t.Run("preflight: all free", func(t *testing.T) {
		d := newDevSetup(t)
		run := startDev(t, append(d.args(), "--preflight", "--agent-api-addr", fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])))
		require.NoError(t, <-run.done, run.output.String())
	})
	t.Run("bad advertise address", func(t *testing.T) {
		d := newDevSetup(t)
		run := startDev(t, append(d.args(), "--advertise-address", "not-an-ip"))
		err := <-run.done
		require.Error(t, err)
		require.Contains(t, run.output.String(), `--advertise-address "not-an-ip" is not an IP address`)
	})
}
