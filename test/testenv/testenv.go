// Package testenv starts a real kube-apiserver and etcd (the binaries `make
// testbin` builds) with agentboot's CRDs installed, for tests. It fails, never
// skips, when the binaries are missing.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/agentboot/agentboot/internal/scheme"
)

// Env is a running control plane.
type Env struct {
	env        *envtest.Environment
	Config     *rest.Config
	Client     client.Client
	Kubeconfig string // path of an admin kubeconfig for kubectl
	BinDir     string
	dir        string
}

// RepoRoot is the top of the agentboot checkout.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Options choose which CRDs a test control plane starts with.
type Options struct {
	// HyperShift adds the test-only HyperShift CRDs from test/crds and the
	// upstream CRDs of HyperShift, Cluster API, cluster-api-provider-agent
	// and hive from test/crds/upstream.
	HyperShift bool
	// NoCRDs starts without any CRDs, for tests that install them.
	NoCRDs bool
}

// Start boots the control plane with the CRDs from deploy/crds, unless
// opts say otherwise.
func Start(opts Options) (*Env, error) {
	root := RepoRoot()
	bin := os.Getenv("KUBEBUILDER_ASSETS")
	if bin == "" {
		bin = filepath.Join(root, "bin", "testbin")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s missing in %s: run `make testbin` (make test does it first)", b, bin)
		}
	}
	var crds []string
	if !opts.NoCRDs {
		crds = append(crds, filepath.Join(root, "deploy", "crds"))
	}
	if opts.HyperShift {
		crds = append(crds, filepath.Join(root, "test", "crds"), filepath.Join(root, "test", "crds", "upstream"))
	}
	s, err := scheme.New()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: len(crds) > 0,
		BinaryAssetsDirectory: bin,
		Scheme:                s,
		// envtest's 20 s for etcd and kube-apiserver to answer and 10 s for
		// the CRDs (HyperShift's are large) to be established are deadlines
		// for a quiet machine; make test runs four test binaries on two
		// cores. Both wait on the real answer, so a healthy start is no
		// slower; only a start that never comes fails later.
		ControlPlaneStartTimeout: controlPlaneStartTimeout(),
		CRDInstallOptions:        envtest.CRDInstallOptions{MaxTime: 2 * time.Minute},
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	e := &Env{env: env, Config: cfg, BinDir: bin}
	if err := e.setup(); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return e, nil
}

// controlPlaneStartTimeout is envtest's KUBEBUILDER_CONTROLPLANE_START_TIMEOUT
// when set, else 2 minutes.
func controlPlaneStartTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT")); err == nil {
		return d
	}
	return 2 * time.Minute
}

// StartT is Start for one test: it fails t when the control plane cannot
// start and stops it when t ends.
func StartT(t testing.TB, opts Options) *Env {
	t.Helper()
	e, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	return e
}

// ProcessTempDir is a directory for what this test process builds once and
// keeps to its end (binaries): <tmp>/<prefix><pid>. Those of earlier
// processes that are gone are removed first, so that nothing piles up in
// /tmp run after run, whether a run ended or was killed.
func ProcessTempDir(prefix string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), prefix))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // that process still runs
		}
		_ = os.RemoveAll(dir)
	}
	dir := filepath.Join(os.TempDir(), prefix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// The path is predictable: on a shared /tmp, use it only if it is
	// this user's own directory, not someone's planted one or a link.
	st, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || st.Mode().Perm() != 0o700 || !ok || int(sys.Uid) != os.Getuid() {
		return "", fmt.Errorf("%s is not a directory of this user's with mode 0700: remove it", dir)
	}
	return dir, nil
}

// EtcdURL is the control plane's etcd client URL (plain HTTP on loopback),
// which also serves etcd's metrics at /metrics.
func (e *Env) EtcdURL() string { return e.env.ControlPlane.Etcd.URL.String() }

func (e *Env) setup() error {
	c, err := client.New(e.Config, client.Options{Scheme: e.env.Scheme})
	if err != nil {
		return err
	}
	e.Client = c
	user, err := e.env.AddUser(envtest.User{Name: "test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	e.dir, err = os.MkdirTemp("", "agentboot-testenv-")
	if err != nil {
		return err
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	return os.WriteFile(e.Kubeconfig, kc, 0o600)
}

// UserKubeconfig writes a kubeconfig for a user of the control plane with
// no rights but what the test gives it (RBAC), and returns its path.
func (e *Env) UserKubeconfig(name string, groups ...string) (string, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(e.dir, "kubeconfig-"+name)
	return path, os.WriteFile(path, kc, 0o600)
}

// Stop shuts the control plane down and removes its files.
func (e *Env) Stop() error {
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
	return e.env.Stop()
}

// Kubectl runs the kubectl that `make testbin` built against the control
// plane, with stdin as its input, and returns stdout; a non-zero exit is an
// error carrying stderr.
func (e *Env) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	out, _, err := e.KubectlWithStderr(ctx, stdin, args...)
	return out, err
}

// KubectlWithStderr is Kubectl that also returns stderr, where kubectl prints
// warnings.
func (e *Env) KubectlWithStderr(ctx context.Context, stdin string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.BinDir, "kubectl"), append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), errb.String(), nil
}

// DevImage returns the path of the dev OS live ISO that `make dev-image`
// builds, failing with the fix when it is missing.
func DevImage() (string, error) { return DevImageFor("x86_64") }

// DevStream returns the path of the dev OS image's stream metadata, which
// lists its live ISO and disk image for every architecture built.
func DevStream() (string, error) {
	iso, err := DevImage()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(iso), "stream.json"), nil
}

// DevImageFor returns the path of the dev OS live ISO for arch (x86_64,
// aarch64), failing with how to build it when it is missing.
func DevImageFor(arch string) (string, error) {
	p := filepath.Join(RepoRoot(), "dist", "dev-image", "agentboot-dev-live."+arch+".iso")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s missing: run `make dev-image` (make test does it first)", p)
	}
	return p, nil
}

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago; each is held open until all are chosen, so none repeats. They come
// from 10000 up to the kernel's ephemeral range (ip_local_port_range),
// which every connect() and listen on :0 draws from, and below 30000,
// where Kubernetes' NodePorts begin (kube-proxy redirects them without
// holding a socket): no other process takes one by chance before the
// caller listens on it, or after the caller closed it (a test that checks
// a port was freed). Tests that choose the same one at random find it
// taken and fail; with thousands to choose from, that is rare. Where the
// ephemeral range leaves too few, they are ephemeral ports, as the
// kernel hands out. Callers that can should listen on :0 instead.
func FreePorts(n int) ([]int, error) {
	low, high := unreservedPorts()
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d free TCP ports in %d-%d on 127.0.0.1 after %d tries", n, low, high-1, tries)
		}
		port := 0
		if high > low {
			port = low + rand.IntN(high-low)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			if port == 0 {
				return nil, err
			}
			continue
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// unreservedPorts is the range [low, high) FreePorts chooses from; empty
// when the ephemeral range leaves fewer than 1000 ports below 30000.
func unreservedPorts() (low, high int) {
	first := 32768 // Linux's default
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if a, err := strconv.Atoi(f[0]); err == nil {
				first = a
			}
		}
	}
	low, high = 10000, min(first, 30000)
	if high-low < 1000 {
		return 0, 0
	}
	return low, high
}

// Tool returns the path of a tool `make tools` links into bin/.
func Tool(name string) (string, error) {
	p := filepath.Join(RepoRoot(), "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s missing: run `make tools` (make test does it first)", p)
	}
	return p, nil
}
