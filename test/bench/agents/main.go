// Command agents benchmarks the agent API (make bench-agents): N simulated
// hosts register with `agentboot manager` against a real kube-apiserver,
// upload an inventory and heartbeat. It reports registration latency, the
// manager's CPU and memory, and the writes per second the apiserver takes in
// steady state, against the targets (p99 < 1 s; writes <= N/40 per second).
// It also times `agent inventory` and reports the agent binary's size.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentclient "github.com/agentboot/agentboot/agent/client"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/bench/internal/proc"
	"github.com/agentboot/agentboot/test/lb"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

func main() {
	n := flag.Int("agents", 2000, "simulated hosts")
	ramp := flag.Duration("ramp", 40*time.Second, "hosts start evenly over this time, as racks powering on")
	poll := flag.Duration("poll", 20*time.Second, "heartbeat interval")
	flag.BoolVar(&holdHeartbeats, "hold", true, "hosts let the agent API hold their heartbeats until there is work, as the agent does (false: as agents before 2026-11-28)")
	window := flag.Duration("window", 90*time.Second, "steady-state measurement window")
	infraEnvs := flag.Int("infraenvs", 1, "InfraEnvs the hosts are spread over, each in a namespace of its own (a site's teams or racks)")
	inFlight := flag.Int("writes-in-flight", 0, "the manager's --agent-api-writes-in-flight (0: its default)")
	manager := flag.String("manager", "", "the agentboot binary to run as the manager (default bin/agentboot): another build as a baseline")
	bound := flag.Float64("bound", 0, "share of the hosts bound to hosted clusters and installed, once all registered (bound.go)")
	failover := flag.Bool("failover", false, "two managers (leader-elected, both serving the agent API) behind a load balancer; the leader is killed halfway through the ramp (failover.go)")
	installing := flag.Float64("installing", 0, "share of the hosts bound and joining their hosted cluster, polled by the manager (bound.go)")
	abuse := flag.Bool("abuse", false, "make bench-abuse: the honest hosts heartbeat while a holder of another InfraEnv's registration token writes at full speed (abuse.go)")
	flag.Parse()
	if *abuse {
		if err := runAbuse(*n, *ramp, *poll, *window); err != nil {
			fmt.Fprintln(os.Stderr, "bench-abuse:", err)
			os.Exit(1)
		}
		return
	}
	if *bound < 0 || *installing < 0 || *bound+*installing > 1 {
		fmt.Fprintf(os.Stderr, "bench-agents: -bound %g and -installing %g are shares of the hosts: each at least 0, together at most 1\n", *bound, *installing)
		os.Exit(2)
	}
	o := options{failover: *failover, manager: *manager, n: *n, infraEnvs: *infraEnvs, ramp: *ramp, poll: *poll, window: *window, bound: *bound, installing: *installing}
	if *inFlight != 0 {
		o.extra = append(o.extra, fmt.Sprintf("--agent-api-writes-in-flight=%d", *inFlight))
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-agents:", err)
		os.Exit(1)
	}
}

// bench is a control plane and `agentboot manager` serving the agent API:
// one, or replicas behind a TCP load balancer, as a Service has them.
type bench struct {
	once sync.Once
	env  *testenv.Env
	dir  string
	mgr  *exec.Cmd // the one measured (the first, or the one left)
	hc   *http.Client
	base string
	// metricsAddr serves the manager's metrics (plain HTTP, loopback).
	metricsAddr string
	// replicas are every manager started, with its metrics address, and
	// lb the load balancer in front of them (when more than one).
	replicas []replica
	lb       net.Listener
}

type replica struct {
	cmd         *exec.Cmd
	metricsAddr string
}

// start starts the control plane (with the CRDs env asks for) and the manager (with extra flags), and
// waits for the agent API; stop ends them.
func start(n int, poll time.Duration, env testenv.Options, manager string, extra ...string) (*bench, error) {
	return startReplicas(n, poll, env, manager, 1, extra...)
}

// startReplicas is start with several managers (leader-elected, each
// serving the agent API) behind a load balancer.
func startReplicas(n int, poll time.Duration, env testenv.Options, manager string, replicas int, extra ...string) (*bench, error) {
	root := testenv.RepoRoot()
	bin := filepath.Join(root, "bin")
	iso, err := testenv.DevImage()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-agents-")
	if err != nil {
		return nil, err
	}
	b := &bench{dir: dir, metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort())}
	// Interrupted, the bench still stops what it started: etcd and
	// kube-apiserver would otherwise outlive it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "interrupted: stopping the control plane and the manager")
		b.stop()
		os.Exit(130)
	}()
	b.env, err = testenv.Start(env)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cert, key, caPEM, err := stack.Certificates(dir, "127.0.0.1")
	if err != nil {
		b.stop()
		return nil, err
	}
	apiPort := freePort()
	if err := b.env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agentboot-system"}}); err != nil {
		b.stop()
		return nil, err
	}
	if manager == "" {
		manager = filepath.Join(bin, "agentboot")
	}
	var backends []string
	for i := range replicas {
		port, metricsAddr := apiPort, b.metricsAddr
		if replicas > 1 {
			port, metricsAddr = freePort(), fmt.Sprintf("127.0.0.1:%d", freePort())
			backends = append(backends, fmt.Sprintf("127.0.0.1:%d", port))
		}
		args := append([]string{"manager",
			"--kubeconfig", b.env.Kubeconfig, "--log-format", "text", "--log-level", "warn", fmt.Sprintf("--leader-elect=%t", replicas > 1),
			"--metrics-bind-address", metricsAddr, "--metrics-secure=false", "--health-probe-bind-address", "0",
			"--os-image-stream", filepath.Join(filepath.Dir(iso), "stream.json"), "--image-cache-dir", filepath.Join(dir, fmt.Sprintf("cache-%d", i)),
			"--agent-api-url", fmt.Sprintf("https://127.0.0.1:%d", apiPort),
			"--image-service-url", "https://127.0.0.1:1", "--image-service-http-url", "http://127.0.0.1:1",
			"--ca-bundle-file", filepath.Join(dir, "ca.crt"), "--agent-binary", filepath.Join(bin, "agent"),
			"--agent-api-addr", fmt.Sprintf("127.0.0.1:%d", port), "--agent-api-tls-cert-file", cert, "--agent-api-tls-key-file", key,
			"--agent-poll-interval", poll.String()}, extra...)
		cmd := exec.Command(manager, args...)
		mgrLog, _ := os.Create(filepath.Join(dir, fmt.Sprintf("manager-%d.log", i)))
		cmd.Stdout, cmd.Stderr = mgrLog, mgrLog
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.stop()
			return nil, err
		}
		b.replicas = append(b.replicas, replica{cmd: cmd, metricsAddr: metricsAddr})
	}
	b.mgr, b.metricsAddr = b.replicas[0].cmd, b.replicas[0].metricsAddr
	if replicas > 1 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", apiPort))
		if err != nil {
			b.stop()
			return nil, err
		}
		b.lb = ln
		go lb.Serve(ln, backends)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	b.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: n, MaxIdleConns: n, IdleConnTimeout: 5 * time.Minute,
	}}
	b.base = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := waitAPI(b.hc, b.base); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

func (b *bench) stop() {
	b.once.Do(func() {
		if b.lb != nil {
			b.lb.Close()
		}
		for _, r := range b.replicas {
			if r.cmd.ProcessState == nil {
				_ = r.cmd.Process.Signal(os.Interrupt)
				_ = r.cmd.Wait()
			}
		}
		if b.env != nil {
			_ = b.env.Stop()
		}
		os.RemoveAll(b.dir)
	})
}

// options are a bench-agents run's.
type options struct {
	n, infraEnvs       int
	ramp, poll, window time.Duration
	bound, installing  float64
	extra              []string // the manager's flags
	manager            string   // its binary ("": bin/agentboot)
	failover           bool
}

func run(o options) error {
	n, k, ramp, poll, window := o.n, o.infraEnvs, o.ramp, o.poll, o.window
	// The hosts stay unapproved, as on a site that approves by hand: the
	// cap on unapproved Agents (500) is lifted for them, and so is the
	// per-InfraEnv write budget, which would spread their registration
	// over minutes (this bench measures the API, bench-abuse the budget).
	// Bound hosts need HyperShift's, Cluster API's and hive's kinds.
	replicas := 1
	if o.failover {
		replicas = 2
	}
	b, err := startReplicas(n, poll, testenv.Options{HyperShift: o.bound+o.installing > 0}, o.manager, replicas, append([]string{"--max-unapproved-agents-per-infraenv=-1", "--agent-api-write-budget-per-infraenv=-1"}, o.extra...)...)
	if err != nil {
		return err
	}
	defer b.stop()
	ctx := context.Background()
	env, c, hc, base := b.env, b.env.Client, b.hc, b.base
	k = max(k, 1)
	ies, tokens := make([]*v1beta1.InfraEnv, k), make([]string, k)
	var namespaces []string
	for j := range k {
		name := "bench"
		if k > 1 {
			name = fmt.Sprintf("bench-%d", j)
		}
		if ies[j], tokens[j], err = infraEnv(ctx, c, name, nil); err != nil {
			return fmt.Errorf("%w (manager log: %s)", err, tail(filepath.Join(b.dir, "manager-0.log")))
		}
		namespaces = append(namespaces, name)
	}

	fmt.Printf("agentboot bench-agents (%s, %d CPUs): %d simulated hosts over %d InfraEnvs starting over %s (%.0f a second), heartbeat every %s; "+
		"a failed registration is retried as the agent does: at the Retry-After the service gives, else with backoff (1 s to 1 min, jittered)\n\n",
		time.Now().UTC().Format(time.RFC3339), numCPU(), n, k, ramp, float64(n)/ramp.Seconds(), poll)
	var (
		lat      = make([]time.Duration, n) // the successful request
		ended    = make([]time.Time, n)     // when it was answered
		reauth   atomic.Int64               // heartbeats refused 401 or 404: the host would register again
		waited   = make([]time.Duration, n) // first attempt to registered, retries included
		failures atomic.Int64
		done     atomic.Int64
		retries  = &retryCounts{}
	)
	rBurst, _ := apiserverWritesByResource(env.Config)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	start := time.Now()
	hosts, stops := make([]*host, n), make([]context.CancelFunc, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		hostCtx, stopHost := context.WithCancel(runCtx)
		stops[i] = stopHost
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(int64(ramp) * int64(i) / int64(n)))
			h := &host{c: hc, base: base, i: i}
			hosts[i] = h
			first := time.Now()
			d, err := h.register(runCtx, ies[i%k], tokens[i%k], retries)
			if err != nil {
				failures.Add(1)
				if runCtx.Err() == nil {
					fmt.Fprintf(os.Stderr, "host %d: %v\n", i, err)
				}
				return
			}
			lat[i], waited[i], ended[i] = d, time.Since(first), time.Now()
			done.Add(1)
			h.live(hostCtx, poll, nil, &reauth)
		}()
	}
	var killed time.Time
	var handover time.Duration
	if o.failover {
		time.Sleep(ramp / 2)
		if killed, handover, err = b.killLeader(); err != nil {
			return fmt.Errorf("failover: %w", err)
		}
	}
	// Everyone registered and every Agent known: the pool is settled.
	settle := time.Now().Add(ramp + 5*time.Minute)
	for time.Now().Before(settle) && (done.Load()+failures.Load() < int64(n) || known(ctx, c, namespaces) < int(done.Load())) {
		time.Sleep(time.Second)
	}
	settled := time.Since(start)
	// Let the registration burst's writes drain before measuring.
	time.Sleep(poll)
	rSettled, _ := apiserverWritesByResource(env.Config)
	boundLine := ""
	if o.bound+o.installing > 0 {
		t := time.Now()
		nb, ni, err := bindSome(ctx, c, env.Config, env.Kubeconfig, hosts, stops, namespaces, o.bound, o.installing)
		if err != nil {
			return fmt.Errorf("bind: %w (manager log: %s)", err, tail(filepath.Join(b.dir, "manager-0.log")))
		}
		for deadline := time.Now().Add(5 * time.Minute); settledBound(ctx, c, namespaces) < nb+ni; {
			if time.Now().After(deadline) {
				return fmt.Errorf("of %d bound hosts, the manager took in %d within 5 minutes (manager log: %s)", nb+ni, settledBound(ctx, c, namespaces), tail(filepath.Join(b.dir, "manager-0.log")))
			}
			time.Sleep(time.Second)
		}
		time.Sleep(poll)
		boundLine = fmt.Sprintf("bound: %d hosts installed (stage Done) and %d joining (Joined, their Nodes not Ready, polled every 2 s), over %d hosted clusters; "+
			"none heartbeats any more; bound and taken in after %s", nb, ni, k, time.Since(t).Round(time.Second))
	}

	w0, err := apiserverWrites(env.Config)
	if err != nil {
		return err
	}
	r0, _ := apiserverWritesByResource(env.Config)
	reads0, _ := apiserverRequestsByResource(env.Config, "GET", "LIST")
	// The manager measured: after a failover, the one that took over.
	mgr := b.mgr
	cpu0, t0 := cpuTicks(mgr.Process.Pid), time.Now()
	peak := int64(0)
	for time.Since(t0) < window {
		if r := proc.RSS(mgr.Process.Pid); r > peak {
			peak = r
		}
		time.Sleep(time.Second)
	}
	elapsed := time.Since(t0).Seconds()
	w1, err := apiserverWrites(env.Config)
	if err != nil {
		return err
	}
	r1, _ := apiserverWritesByResource(env.Config)
	reads1, _ := apiserverRequestsByResource(env.Config, "GET", "LIST")
	cpu1 := cpuTicks(mgr.Process.Pid)
	// What watching the pool costs, while the hosts still heartbeat.
	metricsLine, err := metricsCost(mgr.Process.Pid, b.metricsAddr, float64(cpu1-cpu0)/elapsed)
	if err != nil {
		metricsLine = "metrics: " + err.Error()
	}
	pageLine, err := pageCost(env.Config)
	if err != nil {
		pageLine = "hosts page: " + err.Error()
	}
	stop()
	wg.Wait()

	percentiles := func(all []time.Duration) func(int) time.Duration {
		var ok []time.Duration
		for _, d := range all {
			if d > 0 {
				ok = append(ok, d)
			}
		}
		sort.Slice(ok, func(a, b int) bool { return ok[a] < ok[b] })
		return func(q int) time.Duration {
			if len(ok) == 0 {
				return 0
			}
			return ok[(len(ok)-1)*q/100].Round(time.Millisecond)
		}
	}
	p, w := percentiles(lat), percentiles(waited)
	shown := 0
	for i, h := range hosts {
		if h != nil && waited[i] == 0 && shown < 5 {
			fmt.Printf("host %d not registered; its last failure: %v\n", i, h.lastErr.Load())
			shown++
		}
	}
	if o.failover {
		var during []time.Duration
		for i, e := range ended {
			if !e.Before(killed) && e.Before(killed.Add(handover+10*time.Second)) {
				during = append(during, lat[i])
			}
		}
		fmt.Printf("failover: the leader killed (SIGKILL, its lease not released) %s into the ramp; the other replica led %s later; "+
			"registrations answered from the kill to 10 s after the handover: %d, p99 %s; heartbeats of registered hosts refused 401/404 (each a host that must register again): %d\n",
			killed.Sub(start).Round(time.Second), handover.Round(100*time.Millisecond), len(during), percentiles(during)(99), reauth.Load())
	}
	registered := int(done.Load())
	writesPerSec := float64(w1-w0) / elapsed
	fmt.Printf("registered %d of %d hosts (%d not by the end); all Agents known after %s\n", registered, n, failures.Load(), settled.Round(time.Second))
	fmt.Printf("registration request: p50 %s, p99 %s, max %s (target p99 < 1s)\n", p(50), p(99), p(100))
	fmt.Printf("first attempt to registered, retries included: p50 %s, p99 %s, max %s; failed attempts retried: %s\n", w(50), w(99), w(100), retries)
	fmt.Printf("registering cost the apiserver %s\n", perHost(rBurst, rSettled, registered))
	fmt.Printf("steady state over %.0fs: %.1f apiserver writes/s for the %d registered hosts = N/%.0f (target <= N/40 = %.1f/s)\n",
		elapsed, writesPerSec, registered, float64(registered)/max(writesPerSec, 0.001), float64(registered)/40)
	fmt.Printf("  by resource: %s\n", perSecond(r0, r1, elapsed))
	if boundLine != "" {
		fmt.Println(boundLine)
	}
	fmt.Printf("apiserver reads (GET and LIST) in steady state: %s\n", perSecond(reads0, reads1, elapsed))
	fmt.Printf("manager: %.1f%% of one CPU, %d MiB resident (peak)\n", float64(cpu1-cpu0)/100/elapsed*100, peak>>20)
	fmt.Println(metricsLine)
	fmt.Println(pageLine)
	if o.failover && (registered < n || reauth.Load() > 0) {
		// What a failover must not do, whatever the timing.
		return fmt.Errorf("failover: %d of %d hosts registered, %d heartbeats refused 401/404", registered, n, reauth.Load())
	}

	agentBin := filepath.Join(testenv.RepoRoot(), "bin", "agent")
	st, err := os.Stat(agentBin)
	if err != nil {
		return err
	}
	var runs []time.Duration
	for i := 0; i < 7; i++ {
		t := time.Now()
		if out, err := exec.Command(agentBin, "inventory").CombinedOutput(); err != nil {
			return fmt.Errorf("agent inventory: %v: %s", err, out)
		}
		runs = append(runs, time.Since(t))
	}
	sort.Slice(runs, func(a, b int) bool { return runs[a] < runs[b] })
	fmt.Printf("agent binary: %.1f MB (target <= 15 MB); `agent inventory` takes %s (median of 7)\n", float64(st.Size())/1e6, runs[3].Round(time.Millisecond))
	return nil
}

type host struct {
	// lastErr is the last failure of its registration (a string).
	lastErr atomic.Value
	c       *http.Client
	base    string
	i       int
	ns      string
	id      string
	token   string
}

func (h *host) do(ctx context.Context, method, path, token string, in, out any) error {
	body, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return &agentclient.StatusError{Status: resp.StatusCode, RetryAfter: agentclient.RetryAfter(resp.Header),
			Msg: fmt.Sprintf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))}
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// register registers the host and uploads its inventory, retrying as the
// agent does: any failure waits the agent's backoff (1 s doubling to a
// minute, jittered) and tries again, until ctx ends. It returns how long
// the request that succeeded took.
func (h *host) register(ctx context.Context, ie *v1beta1.InfraEnv, token string, retries *retryCounts) (time.Duration, error) {
	req := agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: stack.HostID(h.i + 1), Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(h.i + 1)}}}
	var resp agentwire.RegisterResponse
	path := "/api/v1/infraenvs/" + ie.Namespace + "/" + ie.Name + "/hosts"
	backoff := agentclient.Backoff{Min: time.Second, Max: time.Minute}
	var took time.Duration
	for h.token == "" {
		start := time.Now()
		err := h.do(ctx, http.MethodPost, path, token, req, &resp)
		if err == nil {
			h.ns, h.id, h.token, took = resp.Namespace, resp.HostID, resp.AgentToken, time.Since(start)
			backoff.Reset()
			break
		}
		h.lastErr.Store(err.Error())
		retries.add(err)
		if agentclient.Sleep(ctx, backoff.After(err)) != nil {
			return 0, err
		}
	}
	inv := stack.FakeInventory(fmt.Sprintf("host-%d", h.i+1), stack.MAC(h.i+1))
	for {
		err := h.do(ctx, http.MethodPut, "/api/v1/namespaces/"+h.ns+"/agents/"+h.id+"/inventory", h.token, inv, nil)
		if err == nil {
			return took, nil
		}
		h.lastErr.Store(err.Error())
		retries.add(err)
		if agentclient.Sleep(ctx, backoff.After(err)) != nil {
			return 0, err
		}
	}
}

// retryCounts counts failed attempts by what failed them.
type retryCounts struct {
	mu sync.Mutex
	by map[string]int
}

func (r *retryCounts) add(err error) {
	kind := "other"
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Client.Timeout") || strings.Contains(msg, "deadline exceeded"):
		kind = "timeout"
	case strings.Contains(msg, " 429 "):
		kind = "429"
	case strings.Contains(msg, " 403 "):
		kind = "403"
	case strings.Contains(msg, " 409 "):
		kind = "409"
	case strings.Contains(msg, " 500 ") || strings.Contains(msg, " 503 "):
		kind = "5xx"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]int{}
	}
	r.by[kind]++
}

func (r *retryCounts) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.by) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range r.by {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// holdHeartbeats: hosts send waitSeconds, as the agent does.
var holdHeartbeats bool

// live heartbeats every poll until ctx ends, recording each heartbeat's
// latency in l when it is not nil.
func (h *host) live(ctx context.Context, poll time.Duration, l *latencies, reauth *atomic.Int64) {
	path := "/api/v1/namespaces/" + h.ns + "/agents/" + h.id + "/instructions"
	// Spread the first heartbeat over the interval, as real hosts are.
	t := time.NewTimer(time.Duration(int64(poll) * int64(h.i%97) / 97))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		// As the agent: the service may hold the heartbeat until there is
		// work, and says when to come next.
		var in agentwire.Instructions
		req := agentwire.InstructionsRequest{Time: time.Now()}
		if holdHeartbeats {
			req.WaitSeconds = agentwire.MaxWaitSeconds
		}
		err := h.do(ctx, http.MethodPost, path, h.token, req, &in)
		if l != nil && ctx.Err() == nil {
			l.add(time.Since(start), err)
		}
		if reauth != nil && (agentclient.IsStatus(err, http.StatusUnauthorized) || agentclient.IsStatus(err, http.StatusNotFound)) {
			reauth.Add(1)
		}
		next := poll
		if err == nil && in.PollSeconds > 0 {
			next = time.Duration(in.PollSeconds) * time.Second
		}
		t.Reset(next)
	}
}

// infraEnv creates namespace ns with an InfraEnv of that name (change
// adjusts it) and returns it with its registration token.
func infraEnv(ctx context.Context, c client.Client, ns string, change func(*v1beta1.InfraEnv)) (*v1beta1.InfraEnv, string, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, "", err
	}
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pull-secret"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"quay.io":{"auth":"eDp5"}}}`)},
	}); err != nil {
		return nil, "", err
	}
	ie := stack.NewInfraEnv(ns, ns)
	if change != nil {
		change(ie)
	}
	if err := c.Create(ctx, ie); err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if c.Get(ctx, client.ObjectKeyFromObject(ie), ie) == nil && conditions.IsTrue(ie.Status.Conditions, v1beta1.ImageCreatedCondition) {
			var s corev1.Secret
			if err := c.Get(ctx, client.ObjectKey{Namespace: "agentboot-system", Name: signing.SecretName}, &s); err != nil {
				return nil, "", err
			}
			k, err := signing.FromSecret(&s)
			if err != nil {
				return nil, "", err
			}
			return ie, k.Token(signing.PurposeRegister, string(ie.UID), ""), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, "", fmt.Errorf("InfraEnv image not created: %+v", ie.Status.Conditions)
}

func known(ctx context.Context, c client.Client, namespaces []string) int {
	return countAgents(ctx, c, namespaces, func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "known-unbound" })
}

// countAgents counts the Agents in namespaces that match (0 when a list
// fails: not settled).
func countAgents(ctx context.Context, c client.Client, namespaces []string, match func(*v1beta1.Agent) bool) int {
	n := 0
	for _, ns := range namespaces {
		var list v1beta1.AgentList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0
		}
		for i := range list.Items {
			if match(&list.Items[i]) {
				n++
			}
		}
	}
	return n
}

func waitAPI(hc *http.Client, base string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := hc.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the agent API never answered at %s", base)
}

// apiserverWrites sums the apiserver's mutating requests from its metrics.
func apiserverWrites(cfg *rest.Config) (int64, error) {
	byRes, err := apiserverWritesByResource(cfg)
	total := int64(0)
	for _, v := range byRes {
		total += v
	}
	return total, err
}

// perHost is the writes between two readings of
// apiserverWritesByResource, per host: in all and by resource.
func perHost(r0, r1 map[string]int64, hosts int) string {
	if hosts == 0 {
		return "nothing (no host registered)"
	}
	parts, all := per(r0, r1, float64(hosts), "%s %.2f")
	return fmt.Sprintf("%.1f writes per host (%s)", all, parts)
}

// per is the counts between two readings of apiserverRequestsByResource,
// each divided by by and formatted (resource, value), and their sum
// divided by by.
func per(r0, r1 map[string]int64, by float64, format string) (string, float64) {
	var all int64
	var parts []string
	for res, v := range r1 {
		if d := v - r0[res]; d > 0 {
			all += d
			parts = append(parts, fmt.Sprintf(format, res, float64(d)/by))
		}
	}
	if len(parts) == 0 {
		return "none", 0
	}
	sort.Strings(parts)
	return strings.Join(parts, ", "), float64(all) / by
}

func apiserverWritesByResource(cfg *rest.Config) (map[string]int64, error) {
	return apiserverRequestsByResource(cfg, "POST", "PUT", "PATCH", "DELETE")
}

// apiserverRequestsByResource reads the apiserver's count of requests of
// the verbs by resource (and subresource, and status code when not 2xx).
func apiserverRequestsByResource(cfg *rest.Config, verbs ...string) (map[string]int64, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		if !slices.ContainsFunc(verbs, func(v string) bool { return strings.Contains(line, `verb="`+v+`"`) }) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			res := ""
			if i := strings.Index(line, `resource="`); i >= 0 {
				res = line[i+10:]
				res = res[:strings.IndexByte(res, '"')]
			}
			if i := strings.Index(line, `subresource="`); i >= 0 {
				if sub := line[i+13:]; sub[0] != '"' {
					res += "/" + sub[:strings.IndexByte(sub, '"')]
				}
			}
			if i := strings.Index(line, `code="`); i >= 0 {
				if code := line[i+6 : i+9]; code[0] != '2' {
					res += " (" + code + ")"
				}
			}
			out[res] += int64(v)
		}
	}
	return out, sc.Err()
}

func cpuTicks(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

func freePort() int {
	ports, err := testenv.FreePorts(1)
	if err != nil {
		panic(err)
	}
	return ports[0]
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "processor\t:")
}

func tail(p string) string {
	data, _ := os.ReadFile(p)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}
