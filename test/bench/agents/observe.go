package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/agentboot/agentboot/internal/ui"
)

// metricsCost scrapes the manager's /metrics (served on metricsAddr) as
// Prometheus would, back to back for a while, and says what one scrape
// costs: time, size, series, and the manager's CPU per scrape beyond its
// steady rate (baseline, in ticks a second).
func metricsCost(pid int, metricsAddr string, baseline float64) (string, error) {
	const scrapes = 30
	var size, series int
	var took time.Duration
	cpu0, t0 := cpuTicks(pid), time.Now()
	for i := 0; i < scrapes; i++ {
		start := time.Now()
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return "", err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("scrape: %v %s", err, resp.Status)
		}
		took += time.Since(start)
		size, series = len(body), 0
		for _, line := range strings.Split(string(body), "\n") {
			if line != "" && !strings.HasPrefix(line, "#") {
				series++
			}
		}
	}
	elapsed := time.Since(t0).Seconds()
	extra := float64(cpuTicks(pid)-cpu0) - baseline*elapsed
	perScrape := max(extra, 0) / scrapes * 10 // ticks are 10 ms
	return fmt.Sprintf("metrics: a scrape takes %s, %d KiB, %d series; %.0f ms of the manager's CPU each: at one scrape every 30 s, %.2f%% of one CPU",
		(took / scrapes).Round(time.Millisecond), size>>10, series, perScrape, perScrape/30000*100), nil
}

// pageCost opens the hosts page on the pool with the bench's admin
// credentials in headless Chromium, and says how long until the first
// data is built and rendered.
func pageCost(cfg *rest.Config) (string, error) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		return "", errors.New("chromium not found: install Debian's chromium package to measure the hosts page")
	}
	ctrllog.SetLogger(logr.Discard())
	srv := &ui.Server{Config: cfg, Home: "agentboot-system", Log: logr.Discard()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer hs.Close()
	start := time.Now()
	go func() { _ = srv.Start(ctx) }()
	go func() { _ = hs.Serve(l) }()
	url := srv.URL(l.Addr().String())
	// The first snapshot: the watches listed and the page's data built.
	req, _ := http.NewRequest(http.MethodGet, strings.Split(url, "?")[0]+"snapshot.json?token="+srv.Token, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	snap, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	built := time.Since(start)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		return "", err
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		return "", err
	}
	var first float64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if first, err = chromedp.Run(bctx, chromedp.Evaluate[float64](`window.agentbootFirstRender || 0`)); err == nil && first > 0 {
			break
		}
	}
	if first == 0 {
		return "", fmt.Errorf("the page never rendered: %v", err)
	}
	rows, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.host").length`))
	return fmt.Sprintf("hosts page: first data built %s after start (%d KiB); in Chromium, %d rows rendered %.0f ms after navigation",
		built.Round(time.Millisecond), len(snap)>>10, rows, first), nil
}
