package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentservice "github.com/agentboot/agentboot/agent-service"
	"github.com/agentboot/agentboot/test/testenv"
)

// A control plane costs seconds to start (etcd and kube-apiserver), more
// than most tests that use one. Main lets the tests of a binary take turns
// on one per kind (the stacks' own, with agentboot's CRDs; the hosted
// clusters' of test/hosted, without): each Stack still starts its own
// manager and servers, and when it stops, every namespaced custom resource
// is deleted, so that the next one starts without the last one's
// InfraEnvs, Agents, BareMetalHosts or Cluster API objects. Namespaces and
// what else they hold (Secrets, events) stay, as do the signing keys and
// Leases in agentboot's own namespace and the RBAC Identities applied.
var shared struct {
	sync.Mutex
	main  bool // Main runs this binary's tests
	pools map[testenv.Options]*pool
}

// pool is the shared control plane started with one set of options.
type pool struct {
	env     *testenv.Env
	inUse   bool
	unwatch func()
}

// Main runs a package's tests (call it from TestMain) with one control
// plane for their stacks (and one for their hosted clusters), and stops
// them before the process exits; should the process die first (a test's
// panic, the -timeout), a watchdog process stops them. A stack that starts
// while another still runs (two at once in a test) gets a control plane of
// its own, as every stack does in a binary without Main. Options.Identities
// run on the shared one again for each stack: they must be idempotent, as
// applying deploy/ (Deployed) is. Tests that share it create their
// namespaces with GenerateName and must pass with -count=2.
func Main(m *testing.M) {
	shared.Lock()
	shared.main = true
	shared.pools = map[testenv.Options]*pool{}
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	for _, p := range shared.pools {
		if p.env != nil {
			if err := p.env.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stop a shared control plane:", err)
			}
			p.unwatch()
		}
	}
	shared.Unlock()
	os.Exit(code)
}

// Borrow gives t a control plane started with opts until t ends: under
// Main, the one this binary's tests take turns on, which empty readies
// for the next test once t is done; otherwise, or while another test
// holds it, one of its own. test/hosted plays hosted clusters on it.
func Borrow(t testing.TB, opts testenv.Options, empty Emptier) *testenv.Env {
	t.Helper()
	env, release, err := controlPlane(opts, empty)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	})
	return env
}

// An Emptier makes one pass over a shared control plane, deleting what a
// test left there, and says what it found ("" for nothing). The control
// plane is handed on once a pass finds nothing: cleanups run last in,
// first out, so what the test started earlier (a stack's manager) may
// still write during the first. An error, or something still found after
// emptyPasses, retires the control plane: it is stopped, never handed on,
// and the test fails.
type Emptier func(*testenv.Env) (found string, err error)

const emptyPasses = 6

// controlPlane returns a control plane started with opts for one user,
// and what gives it back when that user is done.
func controlPlane(opts testenv.Options, empty Emptier) (*testenv.Env, func() error, error) {
	shared.Lock()
	p := shared.pools[opts]
	useShared := shared.main && (p == nil || !p.inUse)
	if useShared {
		if p == nil {
			p = &pool{}
			shared.pools[opts] = p
		}
		p.inUse = true
	}
	shared.Unlock()
	if !useShared {
		env, err := testenv.Start(opts)
		if err != nil {
			return nil, nil, err
		}
		unwatch := watch()
		return env, func() error {
			err := env.Stop()
			unwatch()
			return err
		}, nil
	}
	// Only this user touches p's control plane until it gives it back.
	if p.env == nil {
		env, err := testenv.Start(opts)
		if err != nil {
			shared.Lock()
			p.inUse = false
			shared.Unlock()
			return nil, nil, err
		}
		p.env, p.unwatch = env, watch()
	}
	env := p.env
	return env, func() error {
		err := emptyUntilClean(env, empty)
		shared.Lock()
		defer shared.Unlock()
		if err != nil {
			// The next user would find this one's objects: it gets a
			// control plane of its own instead.
			_ = env.Stop()
			p.unwatch()
			p.env, p.unwatch = nil, nil
		}
		p.inUse = false
		if err != nil {
			return fmt.Errorf("empty the shared control plane (retired): %w", err)
		}
		return nil
	}, nil
}

// watch starts a watchdog that stops this process's etcd and
// kube-apiserver children once this process is gone (envtest starts them
// in process groups of their own, which nothing stops when a test binary
// dies of a panic or its -timeout); the function returned stops the
// watchdog.
func watch() func() {
	args := []string{"-c", `parent=$1; shift
while kill -0 "$parent" 2>/dev/null; do sleep 1; done
ours() { grep -qa -e etcd -e kube-apiserver "/proc/$1/cmdline" 2>/dev/null; }
for p in "$@"; do ours "$p" && kill "$p"; done
sleep 5
for p in "$@"; do ours "$p" && kill -9 "$p"; done`, "watchdog", strconv.Itoa(os.Getpid())}
	for _, p := range children("etcd", "kube-apiserver") {
		args = append(args, strconv.Itoa(p))
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "stack: no watchdog for the control plane:", err)
		return func() {}
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// children are the PIDs of this process's children running one of the
// named programs.
func children(names ...string) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, never ")".
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open {
			continue
		}
		fields := bytes.Fields(b[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(string(fields[1]))
		comm := string(b[open+1 : end])
		pid, _ := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
		for _, n := range names {
			if ppid == os.Getpid() && comm == n {
				out = append(out, pid)
			}
		}
	}
	return out
}

// emptyUntilClean runs empty until a pass finds nothing.
func emptyUntilClean(env *testenv.Env, empty Emptier) error {
	for pass := 1; ; pass++ {
		found, err := empty(env)
		switch {
		case err != nil:
			return err
		case found == "":
			return nil
		case pass == emptyPasses:
			return fmt.Errorf("still found after %d passes: %s", pass, found)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// emptyCRs deletes every namespaced custom resource, removing its
// finalizers first (no controller is left to remove them), and the erase
// debts agentboot recorded by hardware: the next test's hosts are other
// machines, even where they reuse the same made-up UUIDs and MACs.
func emptyCRs(env *testenv.Env) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var debts corev1.ConfigMapList
	if err := env.Client.List(ctx, &debts, client.InNamespace(Namespace), client.HasLabels{agentservice.EraseDebtLabel}); err != nil {
		return "", fmt.Errorf("list erase debts: %w", err)
	}
	for i := range debts.Items {
		if err := env.Client.Delete(ctx, &debts.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("delete erase debt %s: %w", debts.Items[i].Name, err)
		}
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return "", err
	}
	raw, err := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list CRDs: %w", err)
	}
	found := ""
	if len(debts.Items) > 0 {
		found = "erase debt " + debts.Items[0].Name
	}
	for _, u := range raw.Items {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
			return "", fmt.Errorf("CRD %s: %w", u.GetName(), err)
		}
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Storage {
				continue
			}
			res := dyn.Resource(schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural})
			list, err := res.List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", fmt.Errorf("list %s: %w", crd.Name, err)
			}
			for _, o := range list.Items {
				found = fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
				r := res.Namespace(o.GetNamespace())
				if len(o.GetFinalizers()) > 0 {
					_, err := r.Patch(ctx, o.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
					if err != nil && !apierrors.IsNotFound(err) {
						return "", fmt.Errorf("remove the finalizers of %s: %w", found, err)
					}
				}
				if err := r.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return "", fmt.Errorf("delete %s: %w", found, err)
				}
			}
		}
	}
	return found, nil
}
