//go:build e2e

// Package e2e_test is the VM lab (make e2e, root): real VMs on a bridge in a
// network namespace, booting what agentboot serves, against the whole stack
// on a real kube-apiserver.
package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/bmc"
	"github.com/agentboot/agentboot/test/e2e/lab"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

var (
	theLab *lab.Lab
	s      *stack.Stack
	// agentbootBin is this tree's agentboot command, for `agentboot pxe`.
	agentbootBin string
)

// bootTimeout is generous: TCG on a loaded two-core machine.
const bootTimeout = 8 * time.Minute

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "agentboot-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("AGENTBOOT_TEST_LOGS", filepath.Join(dir, "vms"))
	theLab, err = lab.New(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "VM lab:", err)
		return 1
	}
	var stop func()
	cleanup := func() {
		if stop != nil {
			stop()
		}
		theLab.Close()
	}
	// Ctrl-C and kill still tear the lab down.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "interrupted: tearing the VM lab down")
		cleanup()
		os.Exit(130)
	}()
	defer cleanup()

	// BMC retries capped at 20s: an outage test should not wait minutes.
	s, stop, err = stack.StartMain(stack.Options{AdvertiseHost: lab.HostIP, Listen: theLab.Listen, Dial: theLab.Dial,
		BMC: bmc.Config{BackoffCap: 20 * time.Second}, AgentArm64: true, BootObservationsToken: observationsToken})
	if err != nil {
		fmt.Fprintln(os.Stderr, "stack:", err)
		return 1
	}
	// The PXE service posts its boot observations with the image
	// service's token (docs/trace.md).
	observationsTokenFile = filepath.Join(dir, "boot-observations-token")
	if err := os.WriteFile(observationsTokenFile, []byte(observationsToken+"\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := theLab.DHCP(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	agentbootBin = filepath.Join(dir, "agentboot")
	build := exec.Command("go", "build", "-o", agentbootBin, "./cmd/agentboot")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agentboot: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	writeBootTimes(filepath.Join(testenv.RepoRoot(), "dist", "e2e", "boot-times.md"))
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "VM lab logs kept in %s\n", dir)
	}
	return code
}

// bootTimes are the lab's VMs' times from power-on to registration, by
// boot path, measured in the same run (docs/pxe.md#boot-paths-compared).
var bootTimes struct {
	sync.Mutex
	by map[string]time.Duration
}

// registered records how long v took from power-on to its Agent's
// registration (the Agent's creation, to the second), as path.
func registered(t *testing.T, path string, v *vm.VM, a v1beta1.Agent) {
	t.Helper()
	d := a.CreationTimestamp.Sub(v.Started).Round(time.Second)
	t.Logf("%s: registered %s after power-on", path, d)
	bootTimes.Lock()
	defer bootTimes.Unlock()
	if bootTimes.by == nil {
		bootTimes.by = map[string]time.Duration{}
	}
	bootTimes.by[path] = d
}

// writeBootTimes writes the table of boot times to path (make e2e prints it).
func writeBootTimes(path string) {
	bootTimes.Lock()
	defer bootTimes.Unlock()
	if len(bootTimes.by) == 0 {
		return
	}
	paths := make([]string, 0, len(bootTimes.by))
	for p := range bootTimes.by {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var b strings.Builder
	fmt.Fprintf(&b, "VM lab, %s: power-on to registered, by boot path (%s; VMs boot in parallel)\n\n| boot path | time |\n|---|---|\n",
		time.Now().UTC().Format("2006-01-02 15:04"), vm.Choose().Name)
	for _, p := range paths {
		fmt.Fprintf(&b, "| %s | %s |\n", p, bootTimes.by[p])
	}
	fmt.Fprint(os.Stderr, b.String())
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	if err == nil {
		err = os.WriteFile(path, []byte(b.String()), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "boot times:", err)
	}
}

func infraEnv(t *testing.T, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	return s.CreateInfraEnv(t, "lab", "hardware-inventory", change)
}

func download(t *testing.T, url string) string { return s.Download(t, url) }

// bootVM starts a VM on a new tap of the lab's main bridge.
func bootVM(t *testing.T, o vm.Options) *vm.VM {
	t.Helper()
	return bootVMOn(t, "br0", o)
}

// bootVMOn starts a VM on a new tap of bridge.
func bootVMOn(t *testing.T, bridge string, o vm.Options) *vm.VM {
	t.Helper()
	return vm.Start(t, onBridge(t, bridge, o))
}

// onBridge puts o's NIC on a new tap of bridge, run inside the lab.
func onBridge(t *testing.T, bridge string, o vm.Options) vm.Options {
	t.Helper()
	tap, err := theLab.TapOn(bridge)
	require.NoError(t, err)
	// Registered before the VM's own clean-up, so it runs after qemu is
	// gone: the tap, its counters and the neighbours stay.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the lab's network at the end of %s (VM %s on %s):\n%s", t.Name(), o.Name, tap, theLab.Describe(tap))
		}
	})
	o.Prefix = theLab.Exec()
	o.Net = "tap,ifname=" + tap + ",script=no,downscript=no"
	return o
}

func sparseDisk(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	require.NoError(t, os.Truncate(p, size))
	return p
}

// agents waits until n Agents in ns have reported an inventory.
func agents(t *testing.T, ns string, n int, v ...*vm.VM) []v1beta1.Agent {
	t.Helper()
	var list v1beta1.AgentList
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		list = v1beta1.AgentList{}
		if s.Client.List(context.Background(), &list, client.InNamespace(ns)) == nil && len(list.Items) == n {
			ready := true
			for _, a := range list.Items {
				ready = ready && a.Status.Inventory.ReportTime != nil && a.Status.DebugInfo.State != ""
			}
			if ready {
				return list.Items
			}
		}
		time.Sleep(2 * time.Second)
	}
	for _, m := range v {
		t.Logf("serial log of %s:\n%s", m.Name, m.Tail(40))
	}
	t.Fatalf("%d Agents with inventory never appeared in %s (have %d)", n, ns, len(list.Items))
	return nil
}
