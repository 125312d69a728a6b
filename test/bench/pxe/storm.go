package main

// The boot storm (make bench-storm, root): clients network-boot at once,
// each in a network namespace of its own with its own MAC, bridged to the
// servers' namespace, and each goes the whole way a UEFI machine goes from
// power-on to a kernel: DHCP as PXE firmware, ipxe.efi over TFTP, DHCP
// again as iPXE, the boot script over HTTP, then the initrd and the kernel
// it names. Once against agentboot (`agentboot pxe` in authoritative mode
// and the image service, with the InfraEnv that is the PXE default, all at
// their default limits), once against dnsmasq with a static HTTP server
// holding the same script, initrd and kernel: the baseline, tuned as an
// operator would for such a storm (--tftp-max, and the 4 MiB socket receive
// buffer agentboot asks for, as the kernel's default for the run: dnsmasq
// cannot ask for one). The servers' side runs in
// the servers' namespace (this program re-executed there), with its own
// kube-apiserver on that namespace's loopback, so no address is added
// outside the namespaces the bench makes.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/test/bench/internal/infraenv"
	"github.com/agentboot/agentboot/test/bench/internal/proc"
	"github.com/agentboot/agentboot/test/bench/internal/stats"
	"github.com/agentboot/agentboot/test/netns"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// stormReceiveBuffer is the receive buffer agentboot's PXE service asks
// for its sockets (pxe/sockbuf.go), given to dnsmasq's as the default.
const stormReceiveBuffer = 4 << 20

const (
	stormImages = 8080 // the image service's plain HTTP, on serverIP
	stormStatic = 8081 // the baseline's static HTTP server
	stormPXE    = 8070 // agentboot pxe's HTTP (health)
)

// storm makes the namespaces (the servers' with a bridge, one per client
// with a veth on it), runs the rest inside the servers' namespace and
// removes every namespace whatever happens.
func storm(o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, ports 67 and 69): sudo make bench-storm")
	}
	for _, tool := range []string{"ip", "dnsmasq"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install the Debian packages in .ci/packages", tool)
		}
	}
	// What the run changes is undone in reverse on every way out: its
	// return, or an interrupt at any point (then the logs go too).
	var (
		mu   sync.Mutex
		undo []func()
	)
	later := func(f func()) { mu.Lock(); undo = append(undo, f); mu.Unlock() }
	undoAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		undo = nil
	}
	defer undoAll()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			undoAll()
			os.Exit(130)
		}
	}()
	dir, err := os.MkdirTemp("", "agentboot-bench-storm-")
	if err != nil {
		return err
	}
	keep := false
	later(func() {
		if !keep {
			os.RemoveAll(dir)
		}
	})
	// A segment of a thousand hosts needs a neighbour table for them, and
	// the kernel keeps one for every namespace together: its default stops
	// at 1024 entries and reclaims above 512. A broadcast is a copy for
	// every port of the bridge, all queued on this machine's two cores
	// where each real host's NIC would take its own: the queue's default
	// of 1000 packets drops most of a storm's. Both raised for the run, put
	// back after, with a socket's default receive buffer and its ceiling,
	// so that dnsmasq, which cannot ask for one, has what agentboot asks
	// for: a namespace takes the default it is made with.
	restore, err := raiseSysctls([]sysctl{
		{"net/core/rmem_max", stormReceiveBuffer}, // before the default it bounds
		{"net/core/rmem_default", stormReceiveBuffer},
		{"net/ipv4/neigh/default/gc_thresh3", 8 * o.storm}, // the thresholds from the top
		{"net/ipv4/neigh/default/gc_thresh2", 4 * o.storm},
		{"net/ipv4/neigh/default/gc_thresh1", 2 * o.storm},
		{"net/core/netdev_max_backlog", 64 * o.storm},
	})
	if err != nil {
		return err
	}
	later(restore)
	netns.RemoveStale(prefix)
	id := prefix + strconv.Itoa(os.Getpid())
	server, err := netns.New(id + "-server")
	if err != nil {
		return err
	}
	later(server.Close)
	names := make([]string, o.storm)
	for i := range names {
		names[i] = fmt.Sprintf("%s-c%d", id, i)
	}
	clients, err := netns.NewMany(names)
	if err != nil {
		return err
	}
	later(func() { netns.CloseMany(clients) })
	lines := []string{
		"link add br0 type bridge",
		"link set br0 up",
		"addr add " + serverIP + "/16 dev br0",
		// kube-apiserver advertises the address of the default route's
		// interface: without one it does not start.
		"route add default dev br0",
	}
	for i, n := range names {
		lines = append(lines, fmt.Sprintf("link add v%d type veth peer name eth0 address %s netns %s", i, stormMAC(i), n), fmt.Sprintf("link set v%d master br0 up", i))
	}
	if err := server.Batch(lines); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// What make build made (make bench-storm and bench-smoke run it
	// first), with the agent binary the manager serves beside it.
	agentboot := filepath.Join(testenv.RepoRoot(), "bin", "agentboot")
	for _, b := range []string{agentboot, filepath.Join(testenv.RepoRoot(), "bin", "agent")} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s: %w (run make build, or make bench-storm)", b, err)
		}
	}
	cmd := server.Command(context.Background(), self, "storm-run", "-dir", dir, "-agentboot", agentboot,
		"-clients", strconv.Itoa(o.storm), "-namespace-prefix", id+"-c", "-repeats", strconv.Itoa(o.repeats),
		"-repo", testenv.RepoRoot())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		keep = true
		return fmt.Errorf("the storm: %v (logs in %s)", err, dir)
	}
	return nil
}

// sysctl is one of the kernel's settings (its path under /proc/sys) and a
// value.
type sysctl struct {
	key   string
	value int
}

// raiseSysctls sets each of the kernel's settings to at least its value,
// in order, and returns what puts them back, in the reverse order.
func raiseSysctls(want []sysctl) (func(), error) {
	var undo []func()
	restore := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, w := range want {
		k, v := w.key, w.value
		path := "/proc/sys/" + k
		old, err := os.ReadFile(path)
		if err != nil {
			restore()
			return nil, err
		}
		cur, err := strconv.Atoi(strings.TrimSpace(string(old)))
		if err != nil {
			restore()
			return nil, fmt.Errorf("%s: %q", path, old)
		}
		if cur >= v {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644); err != nil {
			restore()
			return nil, err
		}
		undo = append(undo, func() { _ = os.WriteFile(path, old, 0o644) })
	}
	return restore, nil
}

// stormRun is the servers' side, inside their namespace: the apiserver, the
// manager, the image service and the baseline's HTTP server for the whole
// run, agentboot pxe or dnsmasq for each round, and the clients.
func stormRun(args []string) error {
	fs := flag.NewFlagSet("storm-run", flag.ContinueOnError)
	dir := fs.String("dir", "", "")
	agentboot := fs.String("agentboot", "", "")
	n := fs.Int("clients", 0, "")
	nsPrefix := fs.String("namespace-prefix", "", "")
	repeats := fs.Int("repeats", 1, "")
	repo := fs.String("repo", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	clients := make([]*bootClient, *n)
	for i := range clients {
		c, err := newBootClient(i, fmt.Sprintf("%s%d", *nsPrefix, i))
		if err != nil {
			return err
		}
		clients[i] = c
	}
	files, err := stormServers(*dir, *agentboot, *repo)
	if err != nil {
		return err
	}
	defer files.stop()

	fmt.Printf("bench-storm: %d clients booting at once, each in its own network namespace: DHCP (PXE firmware) → ipxe.efi over TFTP → DHCP (iPXE) → boot script → initrd (%.1f MiB) and kernel (%.1f MiB) over HTTP; %d round(s), %d cores; dnsmasq %s with --tftp-max and 4 MiB socket receive buffers\n\n",
		len(clients), float64(files.initrd.size)/(1<<20), float64(files.kernel.size)/(1<<20), *repeats, runtime.NumCPU(), dnsmasqVersion())
	results := map[string][]roundResult{}
	for r := 0; r < *repeats; r++ {
		for _, name := range []string{"agentboot", "dnsmasq"} {
			res, err := stormRound(name, *dir, *agentboot, clients, files)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			results[name] = append(results[name], res)
			fmt.Printf("round %d, %s: %s\n", r+1, name, res)
		}
	}
	a, d := bestRound(results["agentboot"]), bestRound(results["dnsmasq"])
	fmt.Printf("\n| measure (%d clients; the round with the median p99) | agentboot | dnsmasq + static HTTP | ratio (target ≥ 1) |\n|---|---|---|---|\n", len(clients))
	fmt.Printf("| booted (kernel and initrd, bytes checked) | %d | %d | |\n", a.booted, d.booted)
	fmt.Printf("| throughput: booted per second, first DISCOVER to the last byte | %.1f/s | %.1f/s | %.2f |\n", a.rate(), d.rate(), a.rate()/d.rate())
	fmt.Printf("| DISCOVER → last byte, p50 | %s | %s | %.2f |\n", a.pct(50), d.pct(50), float64(d.pct(50))/float64(a.pct(50)))
	fmt.Printf("| DISCOVER → last byte, p99 | %s | %s | %.2f |\n", a.pct(99), d.pct(99), float64(d.pct(99))/float64(a.pct(99)))
	for i, phase := range phaseNames {
		fmt.Printf("| %s, p50 / p99 | %s / %s | %s / %s | |\n", phase, a.phasePct(i, 50), a.phasePct(i, 99), d.phasePct(i, 50), d.phasePct(i, 99))
	}
	fmt.Printf("| DHCP retransmissions (firmware 4, 8, 16, 32 s) | %d | %d | |\n", a.dhcpRetx, d.dhcpRetx)
	fmt.Printf("| TFTP retransmissions (timeout 4 s) | %d | %d | |\n", a.tftpRetx, d.tftpRetx)
	fmt.Printf("| HTTP answers to retry (503, as iPXE after Retry-After) | %d | %d | |\n", a.httpRetry, d.httpRetry)
	fmt.Printf("| memory per client: DHCP and TFTP server (agentboot pxe / dnsmasq) | %s | %s | |\n", perClient(a.bootMemory, len(clients)), perClient(d.bootMemory, len(clients)))
	fmt.Printf("| memory per client: HTTP server (image service / static) | %s | %s | |\n", perClient(a.httpMemory, len(clients)), perClient(d.httpMemory, len(clients)))
	// The baseline's failures are reported above; agentboot's fail the run.
	for i, r := range results["agentboot"] {
		if r.failed > 0 {
			return fmt.Errorf("agentboot, round %d: %d clients did not boot; the first: %s", i+1, r.failed, r.firstErr)
		}
	}
	return nil
}

// served is one file the clients fetch over HTTP, as the image service
// serves it for the storm's InfraEnv.
type served struct {
	size int64
	sum  uint32 // CRC-32C
}

// stormFiles is what runs for the whole storm, and the files' sums.
type stormFiles struct {
	procs          []*proc.Proc
	images, static *proc.Proc // the HTTP servers of each side
	env            *testenv.Env
	initrd, kernel served
	staticScript   string
}

func (f *stormFiles) stop() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		f.procs[i].Stop()
	}
	if f.env != nil {
		f.env.Stop()
	}
}

func stormServers(dir, agentboot, repo string) (f *stormFiles, err error) {
	f = &stormFiles{}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	iso, err := testenv.DevImage()
	if err != nil {
		return f, err
	}
	if f.env, err = testenv.Start(testenv.Options{}); err != nil {
		return f, err
	}
	ctx := context.Background()
	c := f.env.Client
	cert, key, _, err := stack.Certificates(dir, "127.0.0.1")
	if err != nil {
		return f, err
	}
	ports, err := testenv.FreePorts(2)
	if err != nil {
		return f, err
	}
	imgHTTPS, agentAPI := ports[0], ports[1]
	common := []string{
		"--kubeconfig", f.env.Kubeconfig, "--log-format", "text", "--leader-elect=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--os-image-stream", filepath.Join(filepath.Dir(iso), "stream.json"),
		"--agent-api-url", fmt.Sprintf("https://127.0.0.1:%d", agentAPI),
		"--image-service-url", fmt.Sprintf("https://127.0.0.1:%d", imgHTTPS),
		"--image-service-http-url", fmt.Sprintf("http://%s:%d", serverIP, stormImages),
		"--ca-bundle-file", filepath.Join(dir, "ca.crt"),
		"--agent-binary", filepath.Join(repo, "bin", "agent"),
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agentboot-system"}}); err != nil {
		return f, err
	}
	mgr, err := proc.Start("manager", dir, append([]string{agentboot, "manager", "--image-cache-dir", filepath.Join(dir, "cache-manager"),
		"--agent-api-addr", fmt.Sprintf("127.0.0.1:%d", agentAPI), "--agent-api-tls-cert-file", cert, "--agent-api-tls-key-file", key}, common...)...)
	if err != nil {
		return f, err
	}
	f.procs = append(f.procs, mgr)
	// The image service at its defaults, but for the namespace that boots
	// by MAC.
	svc, err := proc.Start("image-service", dir, append([]string{agentboot, "image-service", "--image-cache-dir", filepath.Join(dir, "cache-images"),
		"--https-addr", fmt.Sprintf("127.0.0.1:%d", imgHTTPS), "--http-addr", fmt.Sprintf("%s:%d", serverIP, stormImages),
		"--tls-cert-file", cert, "--tls-key-file", key, "--boot-network-namespaces", "storm"}, common...)...)
	if err != nil {
		return f, err
	}
	f.procs, f.images = append(f.procs, svc), svc
	if err := stormInfraEnv(ctx, c); err != nil {
		return f, fmt.Errorf("%w (logs: %s, %s)", err, mgr.Log, svc.Log)
	}

	// The script the image service gives a MAC, and the files it names.
	script, err := waitScript(fmt.Sprintf("http://%s:%d/boot.ipxe?mac=02:00:00:00:00:01", serverIP, stormImages))
	if err != nil {
		return f, fmt.Errorf("%w (log: %s)", err, svc.Log)
	}
	initrdURL, kernelURL, err := scriptFiles(script)
	if err != nil {
		return f, err
	}
	static := filepath.Join(dir, "static")
	if err := os.MkdirAll(static, 0o755); err != nil {
		return f, err
	}
	for _, file := range []struct {
		url, name string
		into      *served
	}{{initrdURL, "initrd", &f.initrd}, {kernelURL, "kernel", &f.kernel}} {
		if *file.into, err = fetchTo(file.url, filepath.Join(static, file.name)); err != nil {
			return f, err
		}
	}
	// The baseline's script: the same, its files from the static server.
	base := fmt.Sprintf("http://%s:%d/", serverIP, stormStatic)
	f.staticScript = strings.NewReplacer(initrdURL, base+"initrd", kernelURL, base+"kernel").Replace(script)
	if err := os.WriteFile(filepath.Join(static, "boot.ipxe"), []byte(f.staticScript), 0o644); err != nil {
		return f, err
	}
	self, err := os.Executable()
	if err != nil {
		return f, err
	}
	st, err := proc.Start("static", dir, self, "serve-static", static, fmt.Sprintf("%s:%d", serverIP, stormStatic))
	if err != nil {
		return f, err
	}
	f.procs, f.static = append(f.procs, st), st
	if _, err := waitScript(base + "boot.ipxe"); err != nil {
		return f, fmt.Errorf("static server: %w (log: %s)", err, st.Log)
	}
	return f, nil
}

// serveStatic is the baseline's HTTP server: net/http's file server over
// a directory (sendfile, Range, keep-alive).
func serveStatic(args []string) error {
	return http.ListenAndServe(args[1], http.FileServer(http.Dir(args[0])))
}

// stormInfraEnv is the InfraEnv every storm client boots: the PXE default.
func stormInfraEnv(ctx context.Context, c client.Client) error {
	_, err := infraenv.Ready(ctx, c, "storm", map[string]string{"agentboot.io/pxe-default": "true"})
	return err
}

// waitScript fetches an iPXE script until it names a kernel.
func waitScript(u string) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(u)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%s: %q", resp.Status, b)
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "\nkernel ") {
				return string(b), nil
			}
		} else {
			last = err.Error()
		}
		time.Sleep(500 * time.Millisecond)
	}
	return "", fmt.Errorf("%s never gave a boot script naming a kernel: %s", u, last)
}

// scriptFiles returns the initrd's and the kernel's URLs in a boot script.
func scriptFiles(script string) (initrd, kernel string, err error) {
	for _, line := range strings.Split(script, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		var u string
		for _, w := range f[1:] {
			if strings.HasPrefix(w, "http://") {
				u = w
				break
			}
		}
		switch f[0] {
		case "initrd":
			initrd = u
		case "kernel":
			kernel = u
		}
	}
	if initrd == "" || kernel == "" {
		return "", "", fmt.Errorf("boot script names no initrd or kernel URL: %q", script)
	}
	return initrd, kernel, nil
}

func fetchTo(u, path string) (served, error) {
	resp, err := http.Get(u)
	if err != nil {
		return served{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return served{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return served{}, err
	}
	defer out.Close()
	sum := newSum()
	size, err := io.Copy(io.MultiWriter(out, sum), resp.Body)
	if err != nil {
		return served{}, fmt.Errorf("GET %s: %w", u, err)
	}
	return served{size: size, sum: sum.Sum32()}, out.Close()
}

// stormRound runs one server's round: its DHCP and TFTP up, every client
// booting at once, then down.
func stormRound(name, dir, agentboot string, clients []*bootClient, files *stormFiles) (roundResult, error) {
	var res roundResult
	// What the last round left: the clients' addresses and the servers'
	// neighbour entries for them (another server may lease them apart).
	for _, c := range clients {
		if err := c.reset(); err != nil {
			return res, err
		}
	}
	if out, err := exec.Command("ip", "neigh", "flush", "dev", "br0").CombinedOutput(); err != nil {
		return res, fmt.Errorf("ip neigh flush: %v: %s", err, out)
	}
	leases := filepath.Join(dir, name+"-leases")
	_ = os.Remove(leases)
	_ = os.Remove(leases + ".journal")
	var args []string
	switch name {
	case "agentboot":
		// Its defaults, as a site runs it.
		args = []string{agentboot, "pxe", "--interface", "br0", "--mode", "authoritative", "--log-format", "text",
			"--pool", "198.18.1.0-198.18.255.254", "--lease-file", leases,
			"--boot-script-url", fmt.Sprintf("http://%s:%d/boot.ipxe", serverIP, stormImages),
			"--tftp-dir", tftpDir, "--tftp-addr", serverIP + ":69", "--http-addr", fmt.Sprintf("%s:%d", serverIP, stormPXE)}
	case "dnsmasq":
		args = []string{"dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0", "--interface=br0", "--bind-interfaces",
			"--dhcp-range=198.18.1.0,198.18.255.254,255.255.0.0,12h", "--dhcp-leasefile=" + leases, "--no-ping",
			"--dhcp-lease-max=200000", "--quiet-dhcp", "--quiet-tftp",
			"--dhcp-userclass=set:ipxe,iPXE", fmt.Sprintf("--dhcp-boot=tag:ipxe,http://%s:%d/boot.ipxe", serverIP, stormStatic),
			"--dhcp-boot=tag:!ipxe,ipxe.efi,," + serverIP,
			// dnsmasq serves 50 transfers at once by default: an operator
			// expecting a thousand clients raises it.
			"--enable-tftp", "--tftp-root=" + tftpDir, fmt.Sprintf("--tftp-max=%d", len(clients)+10)}
	}
	p, err := proc.Start(name+"-storm", dir, args...)
	if err != nil {
		return res, err
	}
	defer p.Stop()
	if err := clients[0].probe(); err != nil {
		data, _ := os.ReadFile(p.Log)
		return res, fmt.Errorf("never offered an address: %w: %s", err, data)
	}

	dropsBefore, err := udpReceiveDrops()
	if err != nil {
		return res, err
	}
	var wg sync.WaitGroup
	out := make([]bootResult, len(clients))
	start := make(chan struct{})
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = c.boot(start, files)
		}()
	}
	time.Sleep(time.Second) // every client on its thread in its namespace
	// What each server holds per booting client: its peak resident
	// memory during the storm over its own before it.
	web := files.images
	if name == "dnsmasq" {
		web = files.static
	}
	bootPeak, webPeak := p.Peak(), web.Peak()
	t0 := time.Now()
	close(start)
	wg.Wait()
	res.wall = time.Since(t0)
	res.bootMemory[0], res.bootMemory[1] = bootPeak()
	res.httpMemory[0], res.httpMemory[1] = webPeak()
	dropsAfter, err := udpReceiveDrops()
	if err != nil {
		return res, err
	}
	res.serverDrops = dropsAfter - dropsBefore
	for _, r := range out {
		res.add(r)
	}
	return res, nil
}

// phaseNames are a boot's phases, in order.
var phaseNames = []string{"DHCP (firmware)", "TFTP ipxe.efi", "DHCP (iPXE)", "boot script", "initrd and kernel"}

// roundResult is one round against one server.
type roundResult struct {
	booted                        int
	failed                        int
	firstErr                      string
	wall                          time.Duration
	last                          time.Duration // the last boot's end, from the start
	totals                        []time.Duration
	phases                        [5][]time.Duration
	dhcpRetx, tftpRetx, httpRetry int
	// serverDrops is the UDP datagrams the servers' namespace dropped
	// for a full receive buffer.
	serverDrops int64
	// bootMemory and httpMemory are the DHCP/TFTP server's and the HTTP
	// server's resident memory: before the storm, and its peak during.
	bootMemory, httpMemory [2]int64
}

// perClient is what a server held per client, in KiB, over what it held
// before, and its peak in MiB.
func perClient(m [2]int64, clients int) string {
	return fmt.Sprintf("%d KiB (%d → %d MiB)", (m[1]-m[0])/int64(clients)>>10, m[0]>>20, m[1]>>20)
}

// udpReceiveDrops is this namespace's count of UDP datagrams dropped for a
// full socket receive buffer.
func udpReceiveDrops() (int64, error) {
	data, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RcvbufErrors" && i < len(f) {
				return strconv.ParseInt(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("/proc/net/snmp has no Udp RcvbufErrors")
}

func (r *roundResult) add(b bootResult) {
	r.dhcpRetx += b.dhcpRetx
	r.tftpRetx += b.tftpRetx
	r.httpRetry += b.httpRetry
	if b.err != nil {
		r.failed++
		if r.firstErr == "" {
			r.firstErr = b.err.Error()
		}
		return
	}
	r.booted++
	r.totals = append(r.totals, b.total)
	r.last = max(r.last, b.total)
	for i, d := range b.phases {
		r.phases[i] = append(r.phases[i], d)
	}
}

func (r roundResult) rate() float64 {
	if r.last == 0 {
		return 0
	}
	return float64(r.booted) / r.last.Seconds()
}

func (r roundResult) pct(p int) time.Duration {
	return stats.Percentile(r.totals, p).Round(time.Millisecond)
}

func (r roundResult) phasePct(i, p int) time.Duration {
	return stats.Percentile(r.phases[i], p).Round(time.Millisecond)
}

func (r roundResult) String() string {
	s := fmt.Sprintf("%d booted, %d failed, p50 %s, p99 %s, last %s; retransmitted: DHCP %d, TFTP %d; HTTP retried %d; servers' UDP receive drops %d",
		r.booted, r.failed, r.pct(50), r.pct(99), r.last.Round(time.Millisecond), r.dhcpRetx, r.tftpRetx, r.httpRetry, r.serverDrops)
	if r.firstErr != "" {
		s += "; first failure: " + r.firstErr
	}
	return s
}

// bestRound is the round whose p99 is the median of the rounds'.
func bestRound(rs []roundResult) roundResult {
	s := append([]roundResult(nil), rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].pct(99) < s[j].pct(99) })
	return s[len(s)/2]
}
