package pxe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/pxe/internal/dhcp"
)

// The PXE service has no Kubernetes access: what it sees of each MAC's boot
// (DHCP, TFTP) goes to the image service, which writes the boot traces
// (docs/trace.md). The observer gathers observations by MAC and hop and
// posts them every second, with the token both were given.

const (
	// maxPendingObservations bounds what waits to be posted: past it,
	// observations of new (MAC, hop) pairs are dropped and counted.
	maxPendingObservations = 10000
)

// postBatch is how many observations one post carries: at the largest
// texts, well inside the image service's boottrace.MaxBatchBytes.
const postBatch = 300

type obsKey struct{ mac, hop string }

type observer struct {
	url, token string
	client     *http.Client
	log        logr.Logger
	every      time.Duration

	mu      sync.Mutex
	pending map[obsKey]*boottrace.Observation
	// addrs ties a TFTP transfer (which names no MAC) to the MAC that
	// asked for the client's address.
	addrs boottrace.Addresses

	sent, dropped *prometheus.CounterVec
	lastErr       time.Time
}

func newObserver(url, token string, client *http.Client, reg prometheus.Registerer, log logr.Logger) *observer {
	o := &observer{url: url, token: token, client: client, log: log, every: time.Second,
		pending: map[obsKey]*boottrace.Observation{},
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_boot_observations_sent_total",
			Help: "Boot observations the PXE service posted to the image service, by hop."}, []string{"hop"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentboot_boot_observations_dropped_total",
			Help: "Boot observations the PXE service dropped, by reason: full (too many waiting), refused (the image service said no), unreachable."}, []string{"reason"}),
	}
	reg.MustRegister(o.sent, o.dropped)
	return o
}

// add queues an observation, merged with one of the same MAC and hop.
func (o *observer) add(obs boottrace.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := obsKey{obs.MAC, obs.Hop}
	cur := o.pending[k]
	if cur == nil {
		if len(o.pending) >= maxPendingObservations {
			o.dropped.WithLabelValues("full").Inc()
			return
		}
		if obs.Count == 0 {
			obs.Count = 1
		}
		o.pending[k] = &obs
		return
	}
	count := cur.Count + max(obs.Count, 1)
	*cur = obs
	cur.Count = count
}

// dhcp records what the DHCP handler did, and the address the client uses.
func (o *observer) dhcp(d dhcp.Observation) {
	now := time.Now()
	// Only an answered client's address: a packet can name any.
	if d.Addr.IsValid() && d.Answered {
		o.addrs.Put(d.Addr.String(), d.MAC, now)
	}
	o.add(boottrace.Observation{MAC: d.MAC, Hop: boottrace.DHCP, At: now, OK: d.Answered, Outcome: d.Outcome, Detail: d.Detail})
}

// tftp records a finished transfer for the MAC that has the client's
// address: the boot loader, or for arm64 GRUB hosts the files it fetches
// through this service (its boot decision is the image service's to see).
func (o *observer) tftp(client netip.Addr, file, result string, bytes int64) {
	o.bootFile(client, file, result, bytes, "TFTP")
}

// bootFile records a file sent to the client over protocol (TFTP, or HTTP
// for UEFI HTTP boot clients).
func (o *observer) bootFile(client netip.Addr, file, result string, bytes int64, protocol string) {
	mac := o.addrs.MAC(client.Unmap().String(), time.Now())
	if mac == "" {
		return
	}
	if strings.HasPrefix(file, "grub/") {
		// The signed GRUB's config, and the per-host names it tries
		// first (grub.cfg-01-<mac>, ...), which are not found: not hops.
		return
	}
	hop := boottrace.BootFile
	if rel, ok := strings.CutPrefix(file, discovery.GRUBPathPrefix+"/"); ok {
		switch base := path.Base(strings.SplitN(rel, "?", 2)[0]); {
		case strings.HasPrefix(rel, "boot.grub"):
			return
		case base == discovery.FileKernel:
			hop = boottrace.Kernel
		case base == discovery.FileInitrd:
			hop = boottrace.Initrd
		}
	}
	obs := boottrace.Observation{MAC: mac, Hop: hop, At: time.Now(), OK: result == "ok", Detail: path.Base(file) + " over " + protocol + " from " + client.String()}
	if obs.OK {
		obs.Outcome = fmt.Sprintf("sent, %d bytes", bytes)
	} else {
		obs.Outcome = fmt.Sprintf("%s after %d bytes", result, bytes)
	}
	o.add(obs)
}

// run posts what is pending every second until ctx ends, then once more.
func (o *observer) run(ctx context.Context) error {
	t := time.NewTicker(o.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			o.flush(final)
			cancel()
			return nil
		case <-t.C:
			o.flush(ctx)
		}
	}
}

func (o *observer) flush(ctx context.Context) {
	o.mu.Lock()
	pending := o.pending
	o.pending = map[obsKey]*boottrace.Observation{}
	o.mu.Unlock()
	var batch []boottrace.Observation
	for _, obs := range pending {
		batch = append(batch, *obs)
		if len(batch) == postBatch {
			o.post(ctx, batch)
			batch = nil
		}
	}
	if len(batch) > 0 {
		o.post(ctx, batch)
	}
}

func (o *observer) post(ctx context.Context, batch []boottrace.Observation) {
	body, err := json.Marshal(boottrace.Batch{Observations: batch})
	if err != nil {
		o.fail("refused", len(batch), err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(body))
	if err != nil {
		o.fail("unreachable", len(batch), err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+o.token)
	resp, err := o.client.Do(req)
	if err != nil {
		o.fail("unreachable", len(batch), err)
		return
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusNoContent {
		o.fail("refused", len(batch), fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg))))
		return
	}
	for _, obs := range batch {
		o.sent.WithLabelValues(obs.Hop).Inc()
	}
}

// fail counts a batch lost and says why, at most once a minute.
func (o *observer) fail(reason string, n int, err error) {
	o.dropped.WithLabelValues(reason).Add(float64(n))
	o.mu.Lock()
	quiet := time.Since(o.lastErr) < time.Minute
	if !quiet {
		o.lastErr = time.Now()
	}
	o.mu.Unlock()
	if !quiet {
		o.log.Info("boot observations not posted to the image service", "url", o.url, "observations", n, "error", err.Error())
	}
}
