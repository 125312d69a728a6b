// Command images benchmarks the image service (make bench-images): download
// throughput of a customised discovery ISO against http.ServeFile of the same
// base ISO, measured in the same run, at several client counts, over HTTPS
// and plain HTTP; time to first byte; and the server's resident memory per
// concurrent download. The image service runs as `agentboot image-service`
// (with `agentboot manager` publishing the InfraEnv) against a real
// kube-apiserver; the baseline file server is this program re-executed.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/test/bench/internal/infraenv"
	"github.com/agentboot/agentboot/test/bench/internal/proc"
	"github.com/agentboot/agentboot/test/lb"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve-file" {
		serveFile(os.Args[2:])
		return
	}
	clients := flag.String("clients", "1,16,128", "concurrent client counts")
	duration := flag.Duration("duration", 4*time.Second, "how long each measurement downloads")
	repeats := flag.Int("repeats", 3, "measurements per point (the median is reported)")
	fail := flag.Int("failover", 0, "instead: this many clients download through a load balancer in front of two image-service replicas, one killed mid-download (failover.go)")
	flag.Parse()
	if err := run(*clients, *duration, *repeats, *fail); err != nil {
		fmt.Fprintln(os.Stderr, "bench-images:", err)
		os.Exit(1)
	}
}

// serveFile is the baseline: http.ServeFile of the base ISO.
func serveFile(args []string) {
	path, httpsAddr, httpAddr, cert, key := args[0], args[1], args[2], args[3], args[4]
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, path) })
	go func() { _ = http.ListenAndServeTLS(httpsAddr, cert, key, h) }()
	_ = http.ListenAndServe(httpAddr, h)
}

func run(clientList string, duration time.Duration, repeats, failoverClients int) (err error) {
	root := testenv.RepoRoot()
	bin := filepath.Join(root, "bin")
	iso, err := testenv.DevImage()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-images-")
	if err != nil {
		return err
	}
	defer func() {
		if err == nil { // the logs stay for a failed run
			os.RemoveAll(dir)
		}
	}()
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx := context.Background()
	c := env.Client

	cert, key, caPEM, err := stack.Certificates(dir, "127.0.0.1")
	if err != nil {
		return err
	}
	ports, err := testenv.FreePorts(8)
	if err != nil {
		return err
	}
	imgHTTPS, imgHTTP, baseHTTPS, baseHTTP, agentAPI := ports[0], ports[1], ports[2], ports[3], ports[4]
	secondHTTPS, secondHTTP, balanced := ports[5], ports[6], ports[7]
	common := []string{
		"--kubeconfig", env.Kubeconfig, "--log-format", "text", "--leader-elect=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--os-image-stream", filepath.Join(filepath.Dir(iso), "stream.json"),
		"--agent-api-url", "https://127.0.0.1:7443",
		"--image-service-url", fmt.Sprintf("https://127.0.0.1:%d", imgHTTPS),
		"--image-service-http-url", fmt.Sprintf("http://127.0.0.1:%d", imgHTTP),
		"--ca-bundle-file", filepath.Join(dir, "ca.crt"),
		"--agent-binary", filepath.Join(bin, "agent"),
		"--iso-over-http",
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agentboot-system"}}); err != nil {
		return err
	}
	mgr, err := proc.Start("manager", dir, append([]string{filepath.Join(bin, "agentboot"), "manager", "--image-cache-dir", filepath.Join(dir, "cache-manager"),
		"--agent-api-addr", fmt.Sprintf("127.0.0.1:%d", agentAPI), "--agent-api-tls-cert-file", cert, "--agent-api-tls-key-file", key}, common...)...)
	if err != nil {
		return err
	}
	defer mgr.Stop()
	svc, err := proc.Start("image-service", dir, append([]string{filepath.Join(bin, "agentboot"), "image-service", "--image-cache-dir", filepath.Join(dir, "cache-images"),
		"--https-addr", fmt.Sprintf("127.0.0.1:%d", imgHTTPS), "--http-addr", fmt.Sprintf("127.0.0.1:%d", imgHTTP),
		"--tls-cert-file", cert, "--tls-key-file", key, "--max-concurrent-downloads", "1024",
		// Every simulated client is on 127.0.0.1.
		"--max-downloads-per-client", "1024"}, common...)...)
	if err != nil {
		return err
	}
	defer svc.Stop()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	base, err := proc.Start("serve-file", dir, self, "serve-file", iso, fmt.Sprintf("127.0.0.1:%d", baseHTTPS), fmt.Sprintf("127.0.0.1:%d", baseHTTP), cert, key)
	if err != nil {
		return err
	}
	defer base.Stop()

	isoURL, err := infraEnv(ctx, c)
	if err != nil {
		return fmt.Errorf("%w (logs: %s, %s)", err, mgr.Log, svc.Log)
	}
	// With --iso-over-http the ISO is published on the HTTP listener; the
	// HTTPS listener serves the same path.
	path := "/images/" + strings.Split(isoURL, "/images/")[1]
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tlsCfg := &tls.Config{RootCAs: pool}
	targets := map[string]map[string]string{
		"https": {"customised": fmt.Sprintf("https://127.0.0.1:%d%s", imgHTTPS, path), "ServeFile": fmt.Sprintf("https://127.0.0.1:%d/base.iso", baseHTTPS)},
		"http":  {"customised": fmt.Sprintf("http://127.0.0.1:%d%s", imgHTTP, path), "ServeFile": fmt.Sprintf("http://127.0.0.1:%d/base.iso", baseHTTP)},
	}
	if err := waitOK(tlsCfg, targets["https"]["ServeFile"]); err != nil {
		return err
	}
	if err := waitOK(tlsCfg, targets["https"]["customised"]); err != nil {
		return err
	}
	if failoverClients > 0 {
		second, err := proc.Start("image-service-2", dir, append([]string{filepath.Join(bin, "agentboot"), "image-service", "--image-cache-dir", filepath.Join(dir, "cache-images-2"),
			"--https-addr", fmt.Sprintf("127.0.0.1:%d", secondHTTPS), "--http-addr", fmt.Sprintf("127.0.0.1:%d", secondHTTP),
			"--tls-cert-file", cert, "--tls-key-file", key, "--max-concurrent-downloads", "1024", "--max-downloads-per-client", "1024"}, common...)...)
		if err != nil {
			return err
		}
		defer second.Stop()
		if err := waitOK(tlsCfg, fmt.Sprintf("https://127.0.0.1:%d%s", secondHTTPS, path)); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", balanced))
		if err != nil {
			return err
		}
		defer ln.Close()
		go lb.Serve(ln, []string{fmt.Sprintf("127.0.0.1:%d", imgHTTPS), fmt.Sprintf("127.0.0.1:%d", secondHTTPS)})
		return failover(tlsCfg, fmt.Sprintf("https://127.0.0.1:%d%s", balanced, path), failoverClients, svc)
	}

	counts := []int{}
	for _, s := range strings.Split(clientList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("--clients: %q", s)
		}
		counts = append(counts, n)
	}

	fmt.Printf("agentboot bench-images (%s, %d CPUs, base ISO %d MiB, %s per point, median of %d)\n\n", time.Now().UTC().Format(time.RFC3339), numCPU(), fileSize(iso)>>20, duration, repeats)
	fmt.Printf("%-6s %-8s %14s %14s %8s\n", "proto", "clients", "customised", "ServeFile", "ratio")
	for _, proto := range []string{"https", "http"} {
		for _, n := range counts {
			var mine, theirs []float64
			for range repeats {
				theirs = append(theirs, throughput(tlsCfg, targets[proto]["ServeFile"], n, duration))
				mine = append(mine, throughput(tlsCfg, targets[proto]["customised"], n, duration))
			}
			m, b := median(mine), median(theirs)
			fmt.Printf("%-6s %-8d %10.0f MB/s %10.0f MB/s %7.2fx\n", proto, n, m/1e6, b/1e6, m/b)
		}
	}

	fmt.Println()
	mineTTFB := ttfb(tlsCfg, targets["https"]["customised"], 200)
	baseTTFB := ttfb(tlsCfg, targets["https"]["ServeFile"], 200)
	fmt.Printf("time to first byte, HTTPS, kept-alive connection: customised p50 %s p99 %s; ServeFile p50 %s p99 %s\n",
		pct(mineTTFB, 50), pct(mineTTFB, 99), pct(baseTTFB, 50), pct(baseTTFB, 99))

	const concurrent = 128
	idleSvc, idleBase := svc.RSS(), base.RSS()
	peakSvc := peakRSS(svc, func() { throughput(tlsCfg, targets["https"]["customised"], concurrent, duration) })
	peakBase := peakRSS(base, func() { throughput(tlsCfg, targets["https"]["ServeFile"], concurrent, duration) })
	fmt.Printf("resident memory per concurrent HTTPS download (%d clients): image service %d KiB (idle %d MiB, peak %d MiB); ServeFile %d KiB\n",
		concurrent, (peakSvc-idleSvc)/concurrent>>10, idleSvc>>20, peakSvc>>20, (peakBase-idleBase)/concurrent>>10)
	return nil
}

func infraEnv(ctx context.Context, c client.Client) (string, error) {
	ie, err := infraenv.Ready(ctx, c, "bench", nil)
	if err != nil {
		return "", err
	}
	return ie.Status.ISODownloadURL, nil
}

func newClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: false, MaxIdleConnsPerHost: 1, DisableCompression: true}}
}

func waitOK(tlsCfg *tls.Config, u string) error {
	c := newClient(tlsCfg)
	deadline := time.Now().Add(time.Minute)
	var last string
	for time.Now().Before(deadline) {
		resp, err := c.Get(u)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s never answered 200 (last: %s)", u, last)
}

// throughput downloads u with n clients, each on its own HTTP/1.1
// connection, for d, and returns bytes per second.
func throughput(tlsCfg *tls.Config, u string, n int, d time.Duration) float64 {
	var total atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(tlsCfg)
			buf := make([]byte, 256<<10)
			for time.Now().Before(stop) {
				resp, err := c.Get(u)
				if err != nil {
					return
				}
				k, _ := io.CopyBuffer(io.Discard, resp.Body, buf)
				resp.Body.Close()
				total.Add(k)
			}
		}()
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

func ttfb(tlsCfg *tls.Config, u string, n int) []time.Duration {
	c := newClient(tlsCfg)
	var out []time.Duration
	one := make([]byte, 1)
	for i := 0; i < n+5; i++ {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Range", "bytes=0-65535")
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			continue
		}
		_, _ = io.ReadFull(resp.Body, one)
		took := time.Since(start)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i >= 5 { // warm-up
			out = append(out, took)
		}
	}
	return out
}

func peakRSS(p *proc.Proc, load func()) int64 {
	peak := p.Peak()
	load()
	_, m := peak()
	return m
}

func median(xs []float64) float64 {
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "n/a"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := (len(ds) - 1) * p / 100
	return ds[i].Round(10 * time.Microsecond).String()
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "processor\t:")
}

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}
