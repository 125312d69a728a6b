package hostapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// budget is the agent API's etcd write budget: the bytes per second it may
// write to the apiserver for the hosts of one InfraEnv, and for the whole
// process. etcd keeps every revision of an object until the apiserver
// compacts (every five minutes), and each write stores the whole object, so
// a write is charged the size of the object written, not of its change. A
// holder of one registration token can spend only its InfraEnv's share of
// the process's budget: hosts of other InfraEnvs keep the rest. Liveness
// Leases are outside it (a small write per host per renew interval, and a
// changed clock offset within the host's own write limit), so that no host
// is ever reported disconnected for want of budget. So are the writes of
// a bound host's installation and of a sanitization's report: a host has
// them only once cluster-api-provider-agent bound it, or it owes an erase.
type budget struct {
	perInfraEnv int // bytes per second; 0: no limit
	mu          sync.Mutex
	infraEnvs   map[string]*budgetEntry
	pruned      time.Time // when idle entries were last dropped
	all         *rate.Limiter
}

type budgetEntry struct {
	*rate.Limiter
	last time.Time
}

// budgetBurst is how many seconds of budget may be spent at once: a rack
// powering on registers and uploads its inventories within a minute.
const budgetBurst = 60

func newBudget(perInfraEnv, process int) *budget {
	return &budget{perInfraEnv: perInfraEnv, infraEnvs: map[string]*budgetEntry{}, all: rate.NewLimiter(limit(process), burst(process))}
}

func limit(bytesPerSecond int) rate.Limit {
	if bytesPerSecond <= 0 {
		return rate.Inf
	}
	return rate.Limit(bytesPerSecond)
}

func burst(bytesPerSecond int) int {
	return max(bytesPerSecond*budgetBurst, 1<<20)
}

// spend takes n bytes from infraEnv's budget and the process's at now. It
// returns 0 when they had them, or how long until they will (nothing is
// taken then).
func (b *budget) spend(infraEnv string, n int, now time.Time) time.Duration {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	e := b.infraEnvs[infraEnv]
	if e == nil {
		e = &budgetEntry{Limiter: rate.NewLimiter(limit(b.perInfraEnv), burst(b.perInfraEnv))}
		b.infraEnvs[infraEnv] = e
	}
	e.last = now
	if len(b.infraEnvs) > 1024 && now.Sub(b.pruned) > time.Second {
		b.pruned = now
		for k, v := range b.infraEnvs {
			// A bucket idle long enough to be full again is as good as
			// a new one.
			if v.Limit() == rate.Inf || now.Sub(v.last).Seconds()*float64(v.Limit()) >= float64(v.Burst()) {
				delete(b.infraEnvs, k)
			}
		}
	}
	b.mu.Unlock()
	mine := e.ReserveN(now, n)
	if !mine.OK() {
		return budgetBurst * time.Second
	}
	if d := mine.DelayFrom(now); d > 0 {
		mine.CancelAt(now)
		return d
	}
	ours := b.all.ReserveN(now, n)
	if !ours.OK() {
		mine.CancelAt(now)
		return budgetBurst * time.Second
	}
	if d := ours.DelayFrom(now); d > 0 {
		ours.CancelAt(now)
		mine.CancelAt(now)
		return d
	}
	return 0
}

// etcdOverhead is how many bytes etcd receives for each byte of an
// object's JSON written: the apiserver sends the object with its
// managedFields in a transaction that also carries the revision it
// compares against, in gRPC framing. Measured with make bench-abuse
// (2026-11-27): about 2.1 with the charge at 1.
const etcdOverhead = 2

// exhausted reports, taking nothing, how long until infraEnv's budget and
// the process's have anything again (0: they have now).
func (b *budget) exhausted(infraEnv string, now time.Time) time.Duration {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	e := b.infraEnvs[infraEnv]
	b.mu.Unlock()
	limiters := []*rate.Limiter{b.all}
	if e != nil {
		limiters = append(limiters, e.Limiter)
	}
	var wait time.Duration
	for _, l := range limiters {
		if l.Limit() == rate.Inf {
			continue
		}
		if t := l.TokensAt(now); t < 1 {
			wait = max(wait, time.Duration((1-t)/float64(l.Limit())*float64(time.Second)))
		}
	}
	return wait
}

// size is what writing v costs etcd: its JSON, times etcdOverhead.
func size(v any) int {
	raw, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return etcdOverhead * len(raw)
}

// overBudget answers a write the budget does not have: 429, with when to
// come back.
func overBudget(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(wait.Round(time.Second)/time.Second)+1))
	writeError(w, http.StatusTooManyRequests, "WriteBudget", "the agent API's write budget for this InfraEnv (or for the whole service) is spent; retry in %s", wait.Round(time.Second))
}
