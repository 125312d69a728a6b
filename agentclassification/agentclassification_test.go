package agentclassification_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agentclassification"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/stack"
)

func TestMain(m *testing.M) {
	// The sandbox's worker is this test binary again (TestSandbox).
	if os.Getenv("AGENTBOOT_QUERY_WORKER") != "" {
		if err := agentclassification.Worker(os.Stdin, os.Stdout, workerMemory, 100*time.Millisecond); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	stack.Main(m)
}

// workerMemory is the worker's address space in TestSandbox.
const workerMemory = 128 << 20

// A query that allocates without bound kills its worker, never the
// caller: the query fails on that inventory, saying so, and the next
// query gets a new worker. One that runs too long is stopped.
func TestSandbox(t *testing.T) {
	sb := &agentclassification.Sandbox{Timeout: 100 * time.Millisecond, Memory: workerMemory, Command: func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "AGENTBOOT_QUERY_WORKER=1")
		return cmd
	}}
	defer sb.Close()
	inv := []byte(`{"cpu":{"count":4},"memory":{"physicalBytes":17179869184}}`)
	ctx := context.Background()
	ok, err := sb.Match(ctx, ".cpu.count >= 4", inv)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = sb.Match(ctx, ".cpu.count == 2", inv)
	require.NoError(t, err)
	require.False(t, ok)
	_, err = sb.Match(ctx, "(((", inv)
	require.ErrorContains(t, err, "query does not parse")

	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err = sb.Match(ctx, `"0123456789" * 100000000 | length > 0`, inv)
	require.ErrorContains(t, err, "the query used more memory than the query worker may (128 MiB)")
	require.Less(t, time.Since(start), 10*time.Second)
	t.Logf("a query allocating without bound: %v (%s)", err, time.Since(start).Round(time.Millisecond))
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	require.Less(t, after.HeapAlloc, before.HeapAlloc+64<<20, "the caller's memory did not grow")

	_, err = sb.Match(ctx, "reduce range(1e15) as $x (0; 1) > 0", inv)
	require.ErrorContains(t, err, "the query ran longer than 100ms", "a query that only computes is stopped in time")
	ok, err = sb.Match(ctx, ".memory.physicalBytes > 1e9", inv)
	require.NoError(t, err, "a new worker answers the next query")
	require.True(t, ok)
}

// A query is a tenant's program run by the manager: it sees the inventory
// and nothing of the manager's environment, and it is stopped when it runs
// too long; what it gives must be a boolean.
func TestQueriesRunInABox(t *testing.T) {
	inv := map[string]any{"cpu": map[string]any{"count": 4.0}, "memory": map[string]any{"physicalBytes": float64(16 << 30)}}
	t.Setenv("AGENTBOOT_TEST_SECRET", "s3cret")
	run := func(query string) (bool, error) {
		code, err := agentclassification.Compile(query)
		if err != nil {
			return false, err
		}
		return agentclassification.Match(context.Background(), code, inv, 100*time.Millisecond)
	}
	for query, want := range map[string]bool{
		".cpu.count >= 4": true,
		".cpu.count == 2 and .memory.physicalBytes >= 1e9": false,
		"$ENV | length == 0":                                    true,
		`env.AGENTBOOT_TEST_SECRET == null`:                     true,
		`[.disks[]? | select(.sizeBytes > 1e12)] | length == 0`: true,
	} {
		got, err := run(query)
		require.NoError(t, err, query)
		require.Equal(t, want, got, query)
	}
	for query, want := range map[string]string{
		"(((":                        "query does not parse",
		"undefined_function(1)":      "query does not compile",
		".cpu.count":                 "the query gave a number, not a boolean",
		".cpu":                       "the query gave an object, not a boolean",
		"empty":                      "the query gave no result",
		`.cpu.count + "x"`:           "cannot add",
		"input":                      "input",
		"def f: f; f":                "the query ran longer than 100ms",
		"[range(1e12)] | length > 0": "the query ran longer than 100ms",
	} {
		start := time.Now()
		_, err := run(query)
		require.ErrorContains(t, err, want, query)
		require.Less(t, time.Since(start), 5*time.Second, "%s was not stopped", query)
	}
}

// registerWith registers host n of ie with cpus CPUs.
func registerWith(t *testing.T, s *stack.Stack, ie *v1beta1.InfraEnv, n, cpus int) *stack.Host {
	h := s.Register(t, ie, n)
	inv := stack.FakeInventory(fmt.Sprintf("host-%d", n), stack.MAC(n))
	inv.CPU.Count = int64(cpus)
	require.NoError(t, h.PutInventory(inv))
	return h
}

// AgentClassifications label the Agents of their namespace by their
// inventory, follow inventory changes, mark the Agents the query fails on,
// say what they matched, never reach another namespace's Agents, and take
// their labels with them when deleted. The manager runs with deploy/'s
// RBAC.
func TestClassificationsLabelAgents(t *testing.T) {
	s := stack.Start(t, stack.Options{Identities: stack.Deployed, AgentClassifications: true})
	ctx := context.Background()
	ie := s.CreateInfraEnv(t, "classify", "env", nil)
	other := s.CreateInfraEnv(t, "elsewhere", "env", nil)
	small, big := registerWith(t, s, ie, 1, 2), registerWith(t, s, ie, 2, 8)
	foreign := registerWith(t, s, other, 3, 8)
	// An admin's own label, which classification leaves alone.
	agent := func(h *stack.Host) *v1beta1.Agent {
		var a v1beta1.Agent
		require.NoError(t, s.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a))
		return &a
	}
	a := agent(small)
	patch := client.MergeFrom(a.DeepCopy())
	a.Labels["pool"] = "a"
	require.NoError(t, s.Client.Patch(ctx, a, patch))
	labelOf := func(h *stack.Host, key string) string {
		return agent(h).Labels[v1beta1.ClassificationLabelPrefix+key]
	}
	classification := func(name, key, value, query string) *v1beta1.AgentClassification {
		c := &v1beta1.AgentClassification{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: name},
			Spec: v1beta1.AgentClassificationSpec{LabelKey: key, LabelValue: value, Query: query}}
		require.NoError(t, s.Client.Create(ctx, c))
		return c
	}
	status := func(c *v1beta1.AgentClassification, ok func(*v1beta1.AgentClassification) bool) *v1beta1.AgentClassification {
		t.Helper()
		var got v1beta1.AgentClassification
		require.Eventually(t, func() bool {
			return s.Client.Get(ctx, client.ObjectKeyFromObject(c), &got) == nil && ok(&got)
		}, time.Minute, 100*time.Millisecond, "AgentClassification %s: %+v", c.Name, got.Status)
		return &got
	}
	labelled := func(h *stack.Host, key, want string) {
		t.Helper()
		require.Eventually(t, func() bool { return labelOf(h, key) == want }, time.Minute, 100*time.Millisecond,
			"Agent %s: label %s is %q, want %q", h.ID, key, labelOf(h, key), want)
	}

	size := classification("size", "size", "large", ".cpu.count >= 4")
	labelled(big, "size", "large")
	labelled(small, "size", "")
	got := status(size, func(c *v1beta1.AgentClassification) bool {
		return c.Status.MatchedCount == 1 && conditions.Find(c.Status.Conditions, v1beta1.QueryErrorsCondition) != nil
	})
	require.True(t, conditions.IsTrue(got.Status.Conditions, v1beta1.QueryValidCondition))
	require.False(t, conditions.IsTrue(got.Status.Conditions, v1beta1.QueryErrorsCondition))
	require.Contains(t, got.Finalizers, agentclassification.Finalizer)

	// The query fails on every inventory: each Agent is marked, and the
	// status names them.
	broken := classification("broken", "disks", "many", `.cpu.count + "x" > 1`)
	labelled(small, "disks", "QUERYERROR-many")
	labelled(big, "disks", "QUERYERROR-many")
	got = status(broken, func(c *v1beta1.AgentClassification) bool { return c.Status.ErrorCount == 2 })
	errs := conditions.Find(got.Status.Conditions, v1beta1.QueryErrorsCondition)
	require.Equal(t, corev1.ConditionTrue, errs.Status)
	require.Equal(t, v1beta1.QueryHasErrorsReason, errs.Reason)
	require.Contains(t, errs.Message, small.ID)

	// One that does not compile labels nothing and says why.
	invalid := classification("invalid", "gpu", "yes", ".cpu.count >")
	got = status(invalid, func(c *v1beta1.AgentClassification) bool {
		return conditions.Find(c.Status.Conditions, v1beta1.QueryValidCondition) != nil
	})
	valid := conditions.Find(got.Status.Conditions, v1beta1.QueryValidCondition)
	require.Equal(t, v1beta1.QueryNotValidReason, valid.Reason)
	require.Contains(t, valid.Message, "query does not parse")
	require.Empty(t, labelOf(small, "gpu"))

	// A second one of the same key labels nothing while the first decides.
	second := classification("size-2", "size", "any", "true")
	got = status(second, func(c *v1beta1.AgentClassification) bool {
		c2 := conditions.Find(c.Status.Conditions, v1beta1.QueryValidCondition)
		return c2 != nil && c2.Reason == "LabelKeyConflict"
	})
	require.Zero(t, got.Status.MatchedCount)

	// The inventory changes: the label follows.
	inv := stack.FakeInventory("host-1", stack.MAC(1))
	inv.CPU.Count = 16
	require.NoError(t, small.PutInventory(inv))
	labelled(small, "size", "large")
	status(size, func(c *v1beta1.AgentClassification) bool { return c.Status.MatchedCount == 2 })

	// Never another namespace's Agents.
	for _, key := range []string{"size", "disks", "gpu"} {
		require.Empty(t, labelOf(foreign, key), "another namespace's Agent was labelled %s", key)
	}
	// The admin's label is kept.
	require.Equal(t, "a", agent(small).Labels["pool"])

	// Key and value are immutable; what is not a label is refused.
	got = status(size, func(*v1beta1.AgentClassification) bool { return true })
	p := client.MergeFrom(got.DeepCopy())
	got.Spec.LabelKey = "renamed"
	require.ErrorContains(t, s.Client.Patch(ctx, got, p), "labelKey is immutable")
	bad := &v1beta1.AgentClassification{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "bad"},
		Spec: v1beta1.AgentClassificationSpec{LabelKey: "not a label", LabelValue: "x", Query: "true"}}
	err := s.Client.Create(ctx, bad)
	require.True(t, apierrors.IsInvalid(err), "%v", err)
	bad.Spec = v1beta1.AgentClassificationSpec{LabelKey: "empty", LabelValue: "", Query: "true"}
	err = s.Client.Create(ctx, bad)
	require.True(t, apierrors.IsInvalid(err), "an empty value (QUERYERROR- is not a label value): %v", err)

	// Deleted, the first gives way to the second of its key, which now
	// labels every Agent of the namespace.
	require.NoError(t, s.Client.Delete(ctx, size))
	labelled(small, "size", "any")
	labelled(big, "size", "any")
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(s.Client.Get(ctx, client.ObjectKeyFromObject(size), &v1beta1.AgentClassification{}))
	}, time.Minute, 100*time.Millisecond)
	// Its status says so at once, from the first one's deletion.
	status(second, func(c *v1beta1.AgentClassification) bool {
		return conditions.IsTrue(c.Status.Conditions, v1beta1.QueryValidCondition) && c.Status.MatchedCount == 2
	})

	// Deleted, the others take their labels with them before they go.
	for _, c := range []*v1beta1.AgentClassification{second, broken, invalid} {
		require.NoError(t, s.Client.Delete(ctx, c))
	}
	for _, h := range []*stack.Host{small, big} {
		require.Eventually(t, func() bool {
			for k := range agent(h).Labels {
				if strings.HasPrefix(k, v1beta1.ClassificationLabelPrefix) {
					return false
				}
			}
			return true
		}, time.Minute, 100*time.Millisecond, "Agent %s keeps classification labels: %v", h.ID, agent(h).Labels)
	}
	require.Eventually(t, func() bool {
		var list v1beta1.AgentClassificationList
		return s.Client.List(ctx, &list, client.InNamespace(ie.Namespace)) == nil && len(list.Items) == 0
	}, time.Minute, 100*time.Millisecond)
}

// A query that makes its error as large as the worker's memory allows
// reaches the manager clipped.
func TestSandboxClipsErrors(t *testing.T) {
	sb := &agentclassification.Sandbox{Timeout: time.Second, Memory: workerMemory, Command: func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "AGENTBOOT_QUERY_WORKER=1")
		return cmd
	}}
	defer sb.Close()
	_, err := sb.Match(context.Background(), `error("x" * 10000000)`, []byte(`{}`))
	require.Error(t, err)
	require.Less(t, len(err.Error()), 2048)
	ok, err := sb.Match(context.Background(), `. == {}`, []byte(`{}`))
	require.NoError(t, err)
	require.True(t, ok)
}
