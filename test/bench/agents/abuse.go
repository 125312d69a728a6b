package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// runAbuse is make bench-abuse: n honest hosts of one InfraEnv register and
// heartbeat; after a baseline window, a holder of another InfraEnv's
// registration token writes as fast as it can with 16 connections — new
// Agents, each with the largest inventory a host may store, then new
// inventories for them — for a window as long. It reports etcd's write
// bytes per second and database growth, and the honest hosts' heartbeat
// latency and failures, in both windows: the write budget holds, and the
// honest hosts are not starved.
func runAbuse(n int, ramp, poll, window time.Duration) error {
	// Heartbeat latency is what this bench compares: the honest hosts'
	// are not held (their hosts are unapproved, and would be answered at
	// once anyway), so it is the service's time, not a long poll's.
	holdHeartbeats = false
	b, err := start(n+64, poll, testenv.Options{}, "")
	if err != nil {
		return err
	}
	defer b.stop()
	ctx := context.Background()
	honestIE, honestToken, err := infraEnv(ctx, b.env.Client, "honest", func(ie *v1beta1.InfraEnv) {
		ie.Spec.AgentApproval = &v1beta1.AgentApproval{AutoApprove: true}
	})
	if err != nil {
		return err
	}
	evilIE, evilToken, err := infraEnv(ctx, b.env.Client, "attacker", nil)
	if err != nil {
		return err
	}
	fmt.Printf("agentboot bench-abuse (%s, %d CPUs): %d honest hosts heartbeating every %s; windows of %s without and with an attacker\n\n",
		time.Now().UTC().Format(time.RFC3339), numCPU(), n, poll, window)

	var beats latencies
	runCtx, stopHosts := context.WithCancel(ctx)
	defer stopHosts()
	var wg sync.WaitGroup
	var registered, failed atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(int64(ramp) * int64(i) / int64(n)))
			h := &host{c: b.hc, base: b.base, i: i}
			if _, err := h.register(runCtx, honestIE, honestToken, &retryCounts{}); err != nil {
				failed.Add(1)
				return
			}
			registered.Add(1)
			h.live(runCtx, poll, &beats, nil)
		}()
	}
	for registered.Load()+failed.Load() < int64(n) {
		time.Sleep(time.Second)
	}
	if failed.Load() > 0 {
		return fmt.Errorf("%d honest hosts could not register", failed.Load())
	}
	time.Sleep(poll) // the registration writes drain

	measure := func(what string, during func(ctx context.Context)) (windowFigures, error) {
		var f windowFigures
		beats.reset()
		w0, size0, err := etcdFigures(b.env.EtcdURL())
		if err != nil {
			return f, err
		}
		r0, _ := apiserverWritesByResource(b.env.Config)
		wctx, cancel := context.WithTimeout(ctx, window)
		t0 := time.Now()
		if during != nil {
			go during(wctx)
		}
		<-wctx.Done()
		cancel()
		secs := time.Since(t0).Seconds()
		w1, size1, err := etcdFigures(b.env.EtcdURL())
		if err != nil {
			return f, err
		}
		f.writeBps, f.dbGrowth = float64(w1-w0)/secs, size1-size0
		f.p50, f.p99, f.beats, f.failures = beats.summary()
		r1, _ := apiserverWritesByResource(b.env.Config)
		fmt.Printf("%-16s etcd takes %6.0f KiB/s of writes, its database grew %5.1f MiB; honest heartbeats: %d, p50 %s, p99 %s, %d failed\n",
			what+":", f.writeBps/1024, float64(f.dbGrowth)/(1<<20), f.beats, f.p50, f.p99, f.failures)
		var parts []string
		for res, v := range r1 {
			if d := v - r0[res]; d > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f/s", res, float64(d)/secs))
			}
		}
		sort.Strings(parts)
		fmt.Printf("%-16s apiserver writes: %s\n", "", strings.Join(parts, ", "))
		return f, nil
	}
	base, err := measure("no attacker", nil)
	if err != nil {
		return err
	}
	var outcomes sync.Map // answer → *atomic.Int64
	abused, err := measure("with attacker", func(ctx context.Context) {
		var awg sync.WaitGroup
		for w := 0; w < 16; w++ {
			awg.Add(1)
			go func() {
				defer awg.Done()
				attack(ctx, b, evilIE, evilToken, w, &outcomes)
			}()
		}
		awg.Wait()
	})
	if err != nil {
		return err
	}
	stopHosts()
	wg.Wait()

	var parts []string
	outcomes.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%s %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(parts)
	fmt.Printf("\nattacker's answers: %s\n", strings.Join(parts, ", "))
	added := abused.writeBps - base.writeBps
	// In a window of W seconds the budget lets through W seconds' worth
	// and its burst (a minute's worth).
	allowed := float64(256<<10) * (window.Seconds() + 60) / window.Seconds()
	fmt.Printf("writes the attacker added: %.0f KiB/s = %.2f× what its InfraEnv's budget (256 KiB/s, a minute's worth at once) allows in %s, %.0f KiB/s (holds when <= 1)\n",
		added/1024, added/allowed, window, allowed/1024)
	fmt.Printf("honest heartbeat p99 with the attacker: %s = %.2f× without (not starved when close to 1); failures %d (without: %d)\n",
		abused.p99, float64(abused.p99)/float64(max(base.p99, time.Millisecond)), abused.failures, base.failures)
	return nil
}

type windowFigures struct {
	writeBps        float64
	dbGrowth        int64
	p50, p99        time.Duration
	beats, failures int
}

// attack registers new Agents into ie with the largest inventories a host
// may store, and rewrites their inventories, as fast as answers come.
func attack(ctx context.Context, b *bench, ie *v1beta1.InfraEnv, token string, worker int, outcomes *sync.Map) {
	count := func(what string) {
		v, _ := outcomes.LoadOrStore(what, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	var mine []*host
	for i := 0; ctx.Err() == nil; i++ {
		inv := stack.LargeServerInventory(time.Now().UTC().Truncate(time.Second))
		inv.Hostname = fmt.Sprintf("evil-%d-%d", worker, i)
		if i%2 == 0 || len(mine) == 0 {
			h := &host{c: b.hc, base: b.base, i: 1_000_000 + worker*100_000 + i}
			req := agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: stack.HostID(h.i), Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(h.i)}}}
			var resp agentwire.RegisterResponse
			err := h.do(ctx, http.MethodPost, "/api/v1/infraenvs/"+ie.Namespace+"/"+ie.Name+"/hosts", token, req, &resp)
			count("register " + answer(err))
			if err != nil {
				continue
			}
			h.ns, h.id, h.token = resp.Namespace, resp.HostID, resp.AgentToken
			mine = append(mine, h)
		}
		h := mine[i%len(mine)]
		err := h.do(ctx, http.MethodPut, "/api/v1/namespaces/"+h.ns+"/agents/"+h.id+"/inventory", h.token, inv, nil)
		count("inventory " + answer(err))
	}
}

// answer names an outcome: "ok", or the HTTP status and error code.
func answer(err error) string {
	if err == nil {
		return "ok"
	}
	msg := err.Error()
	for _, code := range []string{"429", "403", "409", "500", "503"} {
		if strings.Contains(msg, " "+code+" ") {
			if i := strings.Index(msg, `"code":"`); i >= 0 {
				rest := msg[i+8:]
				return code + " " + rest[:strings.IndexByte(rest, '"')]
			}
			return code
		}
	}
	return "error"
}

// latencies collects heartbeat latencies and failures.
type latencies struct {
	mu       sync.Mutex
	d        []time.Duration
	failures int
}

func (l *latencies) add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failures++
		return
	}
	l.d = append(l.d, d)
}

func (l *latencies) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d, l.failures = nil, 0
}

func (l *latencies) summary() (p50, p99 time.Duration, n, failures int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := append([]time.Duration(nil), l.d...)
	sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
	if len(d) == 0 {
		return 0, 0, 0, l.failures
	}
	q := func(p int) time.Duration { return d[(len(d)-1)*p/100].Round(time.Millisecond) }
	return q(50), q(99), len(d), l.failures
}

// etcdFigures reads etcd's metrics: bytes its clients sent it (the
// apiserver's writes, and its reads' requests, which are small) and the
// size of its database.
func etcdFigures(url string) (received, dbSize int64, err error) {
	resp, err := http.Get(strings.TrimSuffix(url, "/") + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		v, perr := strconv.ParseFloat(f[len(f)-1], 64)
		if perr != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "etcd_network_client_grpc_received_bytes_total"):
			received += int64(v)
		case strings.HasPrefix(line, "etcd_mvcc_db_total_size_in_bytes "):
			dbSize = int64(v)
		}
	}
	return received, dbSize, sc.Err()
}
