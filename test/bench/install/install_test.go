//go:build bench

// Package install benchmarks hundreds of hosts installing together (make
// bench-install): registered and approved hosts are bound at once by a
// NodePool scaled to all of them (cluster-api-provider-agent played by
// test/capiagent), each takes its install step from the agent API, writes
// its image for -write (the part no installer can shorten), reboots, and
// its kubelet joins a real hosted-cluster kube-apiserver, where the
// manager's worker approves its CSR and sees its Node Ready. Everything
// runs at production timing (the agent's heartbeats, held by the agent API
// until there is work, and the worker's polls of joining hosts).
// The baseline is the image write itself: what a host spends from being
// bound to Done beyond it is agentboot's overhead, reported per stage.
package install

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/test/bench/internal/stats"
	"github.com/agentboot/agentboot/test/capiagent"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/stack"
)

var (
	hosts    = flag.Int("hosts", 200, "hosts bound at once")
	write    = flag.Duration("write", time.Minute, "how long each host writes its image (a 20 GB image at 400 MB/s: 50 s)")
	joinPoll = flag.Duration("join-poll", 0, "the worker's poll of a joining host (0: the product's default; 10s: before 2026-11-28)")
)

// token is the NodePools' bearer token (HyperShift's, base64).
const token = "YmVuY2gtaW5zdGFsbC10b2tlbg"

func TestMain(m *testing.M) { stack.Main(m) }

// times is one host's way from bound to Done.
type times struct {
	bound, step, rebooted, approved, ready, done time.Time
	err                                          error
}

func TestBenchInstall(t *testing.T) {
	if *hosts < 1 || *write < 0 || *joinPoll < 0 {
		t.Fatalf("-hosts %d, -write %s, -join-poll %s: want at least one host and no negative duration", *hosts, *write, *joinPoll)
	}
	s := stack.Start(t, stack.Options{Quiet: true, NodePool: nodepool.Config{JoinPoll: *joinPoll}})
	ie := s.CreateInfraEnv(t, "agents", "bench", nil)
	cluster := hosted.Start(t)
	_, _, ca, err := stack.Certificates(t.TempDir(), "ignition.bench.example.com")
	require.NoError(t, err)
	hc := capiagent.Start(t, s.Env, capiagent.Options{Namespace: s.Namespace(t, "clusters"), Name: "bench", AgentNamespace: ie.Namespace,
		Hosted: cluster, IgnitionEndpoint: "ignition.bench.example.com:443", IgnitionCA: ca, Token: token, Provider: true})
	ctx := context.Background()

	// The pool: registered, approved and labelled, validated.
	start := time.Now()
	hs := make([]*stack.Host, *hosts)
	parallel(*hosts, 16, func(i int) {
		hs[i] = s.Register(t, ie, i+1)
		require.Eventually(t, func() bool {
			var a v1beta1.Agent
			if s.Client.Get(ctx, client.ObjectKey{Namespace: hs[i].NS, Name: hs[i].ID}, &a) != nil {
				return false
			}
			patch := client.MergeFrom(a.DeepCopy())
			a.Spec.Approved = true
			a.Labels["pool"] = "a"
			return s.Client.Patch(ctx, &a, patch) == nil
		}, time.Minute, 100*time.Millisecond)
	})
	require.Eventually(t, func() bool {
		return countAgents(t, s, ie.Namespace, func(a *v1beta1.Agent) bool {
			return conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) && conditions.IsTrue(a.Status.Conditions, v1beta1.ConnectedCondition)
		}) == *hosts
	}, 5*time.Minute, time.Second, "the pool never validated")
	t.Logf("%d hosts registered, approved and validated in %s", *hosts, time.Since(start).Round(time.Second))

	// Bound at once.
	out := make([]times, *hosts)
	watchCtx, stopWatch := context.WithCancel(ctx)
	agents, err := watchAgents(watchCtx, s, ie.Namespace)
	require.NoError(t, err)
	var mu sync.Mutex
	// Each agent heartbeats on its own phase, as hosts that booted at
	// different times do; the NodePool is scaled once all of them are.
	var wg, polling sync.WaitGroup
	polling.Add(*hosts)
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(rand.N(agentwire.DefaultPollInterval))
			polling.Done()
			r := installHost(ctx, agents, cluster, h, fmt.Sprintf("host-%d", i+1))
			r.bound = agents.bound(h.ID)
			mu.Lock()
			out[i] = r
			mu.Unlock()
		}()
	}
	polling.Wait()
	scaled := time.Now()
	hc.NodePool("bench", map[string]string{"pool": "a"}).Scale(*hosts)
	wg.Wait()
	stopWatch()
	wall := time.Since(scaled)

	var failed []string
	var total, toBind, toStep, toApprove, toDone []time.Duration
	for i, r := range out {
		if r.err != nil || r.bound.IsZero() {
			failed = append(failed, fmt.Sprintf("host-%d: %v (bound %v)", i+1, r.err, !r.bound.IsZero()))
			continue
		}
		total = append(total, r.done.Sub(r.bound)-*write)
		toBind = append(toBind, r.bound.Sub(scaled))
		toStep = append(toStep, r.step.Sub(r.bound))
		toApprove = append(toApprove, r.approved.Sub(r.rebooted))
		toDone = append(toDone, r.done.Sub(r.ready))
	}
	require.Empty(t, failed, "hosts that did not install")
	fmt.Printf("\nbench-install: %d hosts bound at once, each writing its image for %s; all Done %s after the NodePool was scaled\n\n", *hosts, *write, wall.Round(time.Second))
	fmt.Println("| agentboot's part (the image write excluded) | p50 | p99 | max |")
	fmt.Println("|---|---|---|---|")
	for _, row := range []struct {
		what string
		d    []time.Duration
	}{
		{"NodePool scaled → Agent bound (the provider, played)", toBind},
		{"bound → install step in the agent's hands (a held heartbeat, or the next)", toStep},
		{"kubelet's client CSR → approved", toApprove},
		{"Node Ready → Agent Done", toDone},
		{"bound → Done, less the image write: agentboot's overhead per host", total},
	} {
		fmt.Printf("| %s | %s | %s | %s |\n", row.what, pct(row.d, 50), pct(row.d, 99), pct(row.d, 100))
	}
}

// installHost plays one bound host from its next heartbeat to Done: the
// agent polls as told, writes its image when given the install step,
// reports progress and reboots; its kubelet then joins the hosted cluster.
func installHost(ctx context.Context, agents *agentTimes, cluster *hosted.Cluster, h *stack.Host, hostname string) (r times) {
	defer func() {
		if p := recover(); p != nil {
			r.err = fmt.Errorf("kubelet: %v", p)
		}
	}()
	deadline := time.Now().Add(*write + 10*time.Minute)
	for {
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("no install step")
			return r
		}
		in, err := h.HeartbeatWait(agentwire.MaxWaitSeconds) // as the agent does
		if err != nil {
			r.err = fmt.Errorf("heartbeat: %w", err)
			return r
		}
		if len(in.Steps) > 0 && in.Steps[0].Kind == agentwire.StepInstall {
			r.step = time.Now()
			break
		}
		poll := time.Duration(in.PollSeconds) * time.Second
		if poll <= 0 {
			poll = agentwire.DefaultPollInterval
		}
		time.Sleep(poll)
	}
	for _, p := range []struct {
		stage string
		pct   int
		after time.Duration
	}{{"Starting installation", 0, 0}, {"Writing image to disk", 50, *write / 2}, {"Rebooting", 100, *write / 2}} {
		time.Sleep(p.after)
		if err := h.Progress(p.stage, p.pct, ""); err != nil {
			r.err = fmt.Errorf("progress %s: %w", p.stage, err)
			return r
		}
	}
	if err := h.StepResult("install", agentwire.StepResult{Output: "installed to /dev/vda"}); err != nil {
		r.err = fmt.Errorf("install result: %w", err)
		return r
	}
	r.rebooted = time.Now()
	kl := &hosted.Kubelet{T: &quiet{}, C: cluster, Name: hostname}
	kl.CSR(hostname+"-client", hosted.ClientSigner, hosted.Bootstrapper, hostname, nil, nil, hosted.ClientUsages...)
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := approved(wctx, cluster, hostname+"-client"); err != nil {
		r.err = fmt.Errorf("CSR never approved: %w", err)
		return r
	}
	r.approved = time.Now()
	kl.Register()
	kl.Ready()
	r.ready = time.Now()
	select {
	case <-agents.doneCh(h.ID):
		r.done = agents.done(h.ID)
	case <-wctx.Done():
		r.err = fmt.Errorf("never Done")
	}
	return r
}

// approved waits, on a watch, until CSR name is approved.
func approved(ctx context.Context, cluster *hosted.Cluster, name string) error {
	csrs := cluster.Admin.CertificatesV1().CertificateSigningRequests()
	for {
		csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if isApproved(csr) {
			return nil
		}
		w, err := csrs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: csr.ResourceVersion})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*certificatesv1.CertificateSigningRequest); ok && isApproved(c) {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func isApproved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// agentTimes are when each Agent of the namespace was first seen bound and
// Done, from a watch.
type agentTimes struct {
	mu          sync.Mutex
	boundAt     map[string]time.Time
	doneAt      map[string]time.Time
	doneSignals map[string]chan struct{}
}

// watchAgents records the namespace's Agents until ctx ends.
func watchAgents(ctx context.Context, s *stack.Stack, ns string) (*agentTimes, error) {
	wc, err := client.NewWithWatch(s.Env.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		return nil, err
	}
	at := &agentTimes{boundAt: map[string]time.Time{}, doneAt: map[string]time.Time{}, doneSignals: map[string]chan struct{}{}}
	see := func(a *v1beta1.Agent) {
		now := time.Now()
		at.mu.Lock()
		defer at.mu.Unlock()
		if _, ok := at.boundAt[a.Name]; !ok && a.Labels["agentMachineRef"] != "" {
			at.boundAt[a.Name] = now
		}
		if _, ok := at.doneAt[a.Name]; !ok && a.Status.DebugInfo.State == lifecycle.StateAddedToExistingCluster {
			at.doneAt[a.Name] = now
			close(at.signal(a.Name))
		}
	}
	go func() {
		for ctx.Err() == nil {
			var list v1beta1.AgentList
			if err := wc.List(ctx, &list, client.InNamespace(ns)); err != nil {
				select { // the apiserver failing: again a moment later
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			for i := range list.Items {
				see(&list.Items[i])
			}
			w, err := wc.Watch(ctx, &v1beta1.AgentList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
			if err != nil {
				continue // listed again
			}
			for ev := range w.ResultChan() {
				if a, ok := ev.Object.(*v1beta1.Agent); ok {
					see(a)
				}
			}
			w.Stop()
		}
	}()
	return at, nil
}

// signal is the channel closed when name is Done; at.mu is held.
func (at *agentTimes) signal(name string) chan struct{} {
	ch, ok := at.doneSignals[name]
	if !ok {
		ch = make(chan struct{})
		at.doneSignals[name] = ch
	}
	return ch
}

func (at *agentTimes) doneCh(name string) <-chan struct{} {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.signal(name)
}

func (at *agentTimes) done(name string) time.Time {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.doneAt[name]
}

func (at *agentTimes) bound(name string) time.Time {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.boundAt[name]
}

// quiet is the testing.TB a kubelet fails through from a goroutine: it
// panics with the failure, which installHost recovers as the host's error.
type quiet struct{ testing.TB }

func (quiet) Helper() {}
func (quiet) Errorf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (quiet) FailNow() { panic("kubelet failed") }

func countAgents(t *testing.T, s *stack.Stack, ns string, match func(*v1beta1.Agent) bool) int {
	var list v1beta1.AgentList
	require.NoError(t, s.Client.List(context.Background(), &list, client.InNamespace(ns)))
	n := 0
	for i := range list.Items {
		if match(&list.Items[i]) {
			n++
		}
	}
	return n
}

// parallel runs fn for 0..n-1, at most workers at once.
func parallel(n, workers int, fn func(int)) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				fn(i)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	return stats.Percentile(ds, p).Round(100 * time.Millisecond).String()
}
