package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/cmd/agentboot/app"
	"github.com/agentboot/agentboot/deploy"
	"github.com/agentboot/agentboot/internal/devcluster"
	"github.com/agentboot/agentboot/internal/hostaddr"
	"github.com/agentboot/agentboot/internal/kubeapply"
	"github.com/agentboot/agentboot/internal/ui"
	"github.com/agentboot/agentboot/pxe"
)

// devFlags are the settings of `agentboot dev`.
type devFlags struct {
	stateDir      string
	binDir        string
	fresh         bool
	preflight     bool
	advertise     string
	etcdPort      int
	etcdPeerPort  int
	apiserverPort int
	uiAddr        string
}

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var (
		d         devFlags
		m         managerFlags
		disc      discoveryFlags
		img       imageServiceFlags
		ag        agentFlags
		px        pxeFlags
		logLevel  = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat = fs.String("log-format", "text", "text or json")
	)
	fs.StringVar(&d.stateDir, "state-dir", ".agentboot/dev", "where the dev control plane keeps etcd data, certificates, logs and the kubeconfig")
	fs.StringVar(&d.binDir, "bin-dir", "bin/testbin", "directory with etcd, kube-apiserver and kubectl (make testbin)")
	fs.BoolVar(&d.fresh, "fresh", false, "discard the state of earlier runs and start clean")
	fs.BoolVar(&d.preflight, "preflight", false, "only check that every port the dev services need is free, then exit (make run does this before its long builds)")
	fs.StringVar(&d.advertise, "advertise-address", "", "address booted hosts use to reach agentboot's services (default: this machine's primary address)")
	fs.IntVar(&d.etcdPort, "etcd-port", devcluster.DefaultEtcdPort, "loopback port of the dev etcd")
	fs.IntVar(&d.etcdPeerPort, "etcd-peer-port", devcluster.DefaultEtcdPeerPort, "loopback peer port of the dev etcd")
	fs.IntVar(&d.apiserverPort, "apiserver-port", devcluster.DefaultAPIServerPort, "loopback port of the dev kube-apiserver")
	fs.StringVar(&d.uiAddr, "ui-addr", "127.0.0.1:9092", "loopback address of the hosts page (agentboot ui, with the dev cluster's admin credentials); empty: none")
	m.register(fs)
	disc.register(fs)
	img.register(fs)
	ag.register(fs)
	px.register(fs, "pxe-")
	// In dev the manager is alone, on loopback, and restarts often.
	if err := fs.Set("leader-elect", "false"); err != nil {
		return err
	}
	if err := fs.Set("metrics-bind-address", "127.0.0.1:9091"); err != nil {
		return err
	}
	if err := fs.Set("metrics-secure", "false"); err != nil {
		return err
	}
	if err := fs.Set("health-probe-bind-address", "127.0.0.1:9440"); err != nil {
		return err
	}
	if err := fs.Set("image-cache-dir", ".agentboot/cache"); err != nil {
		return err
	}
	// One developer's cluster: every namespace may claim network-booting
	// hosts.
	if err := fs.Set("boot-network-namespaces", "*"); err != nil {
		return err
	}
	if err := fs.Set("pxe-lease-file", ".agentboot/dev/pxe-leases.json"); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if d.preflight {
		if err := checkDevPorts(m, img, ag); err != nil {
			return err
		}
		if err := checkUIPort(d.uiAddr); err != nil {
			return err
		}
		return devcluster.CheckPorts(d.etcdPort, d.etcdPeerPort, d.apiserverPort)
	}
	if disc.osImages == "" && len(disc.streams) == 0 {
		// The dev OS image `make dev-image` builds, offline.
		stream := "dist/dev-image/stream.json"
		if _, err := os.Stat(stream); err != nil {
			return fmt.Errorf("no OS images: %s is missing (run `make dev-image`), or pass --os-images / --os-image-stream", stream)
		}
		disc.streams = stringList{stream}
	}
	log, err := newLogger(os.Stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}

	advertise, err := advertiseAddress(d.advertise)
	if err != nil {
		return err
	}
	if err := checkDevPorts(m, img, ag); err != nil {
		return err
	}
	if err := checkUIPort(d.uiAddr); err != nil {
		return err
	}
	cluster, err := devcluster.New(devcluster.Config{
		StateDir:      d.stateDir,
		BinDir:        d.binDir,
		Fresh:         d.fresh,
		EtcdPort:      d.etcdPort,
		EtcdPeerPort:  d.etcdPeerPort,
		APIServerPort: d.apiserverPort,
		Log:           log.WithName("devcluster"),
	})
	if err != nil {
		return err
	}
	if err := cluster.Start(ctx); err != nil {
		return err
	}
	defer cluster.Stop()

	if err := devServices(cluster, advertise, &disc, &img, &ag); err != nil {
		return err
	}
	settings, err := disc.settings()
	if err != nil {
		return err
	}
	catalog, err := newCatalog(disc, log)
	if err != nil {
		return err
	}
	cfg := cluster.RESTConfig()
	if err := installDev(ctx, cfg, m.namespace); err != nil {
		return err
	}
	mgr, err := app.NewManager(cfg, m.options(), log)
	if err != nil {
		return err
	}
	var pxeServer *pxe.Server
	if px.iface != "" {
		// Network boot on a lab segment: needs root for ports 67 and 69.
		if px.bootScriptURL == "" {
			px.bootScriptURL = disc.imageHTTPURL + "/boot.ipxe"
		}
		if px.observationsURL == "" {
			// Its boot observations go to the image service in this
			// process, over HTTPS with a token made for this run.
			tokenFile := filepath.Join(d.stateDir, "boot-observations-token")
			if err := os.WriteFile(tokenFile, []byte(rand.Text()+"\n"), 0o600); err != nil {
				return err
			}
			px.observationsURL, px.observationsTokenFile, px.observationsCAFile = disc.imageURL+"/boot-observations", tokenFile, disc.caBundleFile
			img.bootObservationsTokenFile = tokenFile
		}
		pcfg, err := px.config("pxe-", log.WithName("pxe"))
		if err != nil {
			return err
		}
		if pxeServer, err = pxe.New(pcfg); err != nil {
			return err
		}
	}
	imgCfg, err := img.config()
	if err != nil {
		return err
	}
	bmcCfg, err := m.bmc()
	if err != nil {
		return err
	}
	agentCfg := ag.config()
	if err := app.Add(mgr, app.Components{Namespace: m.namespace, Catalog: catalog, Settings: settings, Controllers: true, ImageService: &imgCfg, AgentService: agentCfg, NodePool: m.nodePool(), BMC: bmcCfg, AgentClassifications: m.agentClassifications, ClassificationMatcher: m.classificationSandbox()}, log); err != nil {
		return err
	}

	mgrCtx, stopMgr := context.WithCancel(ctx)
	defer stopMgr()
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	pxeDone := make(chan error, 1)
	if pxeServer != nil {
		go func() { pxeDone <- pxeServer.Start(mgrCtx) }()
	}
	// "Up" only once the image service and the agent API accept
	// connections: a host booted right after the message must not meet a
	// refusal.
	if err := awaitServing(ctx, mgrDone, imgCfg.HTTPSAddr, imgCfg.HTTPAddr, agentCfg.Addr); err != nil {
		stopMgr()
		return err
	}
	fmt.Fprintf(os.Stderr, "\nagentboot dev is up. In another terminal:\n\n  export KUBECONFIG=%s\n  %s/kubectl get infraenvs,agents -A\n\n"+
		"Hosts reach agentboot at %s: image service %s and %s, agent API %s.\nCtrl-C stops everything.\n\n",
		cluster.KubeconfigPath(), d.binDir, advertise, disc.imageURL, disc.imageHTTPURL, disc.agentAPIURL)
	if pxeServer != nil {
		fmt.Fprintf(os.Stderr, "Network boot (%s mode) answers on %s; iPXE fetches %s?mac=<MAC>.\n\n", px.mode, px.iface, px.bootScriptURL)
	}
	if d.uiAddr != "" {
		page := &ui.Server{Config: cfg, Home: m.namespace, Log: log.WithName("ui")}
		l, err := net.Listen("tcp", d.uiAddr)
		if err != nil {
			stopMgr()
			return fmt.Errorf("hosts page: %w (choose another with --ui-addr)", err)
		}
		hs := &http.Server{Handler: page.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := page.Start(mgrCtx); err != nil {
				log.Error(err, "the hosts page stopped")
			}
		}()
		go func() { _ = hs.Serve(l) }()
		defer hs.Close()
		fmt.Fprintf(os.Stderr, "The hosts page: %s\n\n", page.URL(l.Addr().String()))
	}

	select {
	case <-ctx.Done():
		log.Info("stopping")
		stopMgr()
		if err := <-mgrDone; err != nil {
			return err
		}
		return nil
	case err := <-mgrDone:
		return err
	case err := <-cluster.Died():
		stopMgr()
		<-mgrDone
		return err
	case err := <-pxeDone:
		stopMgr()
		<-mgrDone
		return fmt.Errorf("PXE service: %w", err)
	}
}

// serveTimeout bounds how long the servers may take to listen once the
// manager started; they open their sockets at once.
const serveTimeout = 2 * time.Minute

// awaitServing waits until every address accepts a TCP connection (a
// wildcard host is dialled on loopback), the manager ends, or ctx is done.
func awaitServing(ctx context.Context, mgrDone <-chan error, addrs ...string) error {
	deadline := time.Now().Add(serveTimeout)
	for _, addr := range addrs {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("listen address %q: %w", addr, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "127.0.0.1"
		}
		target := net.JoinHostPort(host, port)
		for {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", target)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("nothing listens on %s %s after the manager started: %w", target, serveTimeout, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case err := <-mgrDone:
				return fmt.Errorf("the manager stopped before it served %s: %v", target, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// installDev installs the CRDs (with hive's ClusterDeployment and
// AgentClusterInstall: the dev control plane has no hive) and the
// manager's namespace.
func installDev(ctx context.Context, cfg *rest.Config, namespace string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	docs, err := deploy.CRDs()
	if err != nil {
		return err
	}
	hive, err := deploy.HiveCRDs()
	if err != nil {
		return err
	}
	docs = append(docs, hive...)
	objs, err := kubeapply.Decode(docs...)
	if err != nil {
		return err
	}
	if err := kubeapply.Apply(ctx, c, objs); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return nil
}

// devServices points hosts at this machine: service URLs on the advertised
// address, and a serving certificate from the dev CA.
func devServices(cluster *devcluster.Cluster, advertise netip.Addr, disc *discoveryFlags, img *imageServiceFlags, ag *agentFlags) error {
	cert, key, ca, err := cluster.ServiceCertificate(advertise)
	if err != nil {
		return fmt.Errorf("service certificate: %w", err)
	}
	img.cfg.TLSCertFile, img.cfg.TLSKeyFile = cert, key
	ag.cfg.TLSCertFile, ag.cfg.TLSKeyFile = cert, key
	if disc.caBundleFile == "" {
		disc.caBundleFile = ca
	}
	port := func(addr string) string {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return addr
		}
		return p
	}
	host := advertise.String()
	if advertise.Is6() {
		host = "[" + host + "]"
	}
	if disc.imageURL == "" {
		disc.imageURL = "https://" + host + ":" + port(img.cfg.HTTPSAddr)
	}
	if disc.imageHTTPURL == "" {
		disc.imageHTTPURL = "http://" + host + ":" + port(img.cfg.HTTPAddr)
	}
	if disc.agentAPIURL == "" {
		disc.agentAPIURL = "https://" + host + ":" + port(ag.cfg.Addr)
	}
	return nil
}

// checkDevPorts fails early, before anything starts, when a port of the
// in-process components is taken.
func checkDevPorts(m managerFlags, img imageServiceFlags, ag agentFlags) error {
	for _, p := range []struct{ addr, what, flag string }{
		{m.metricsAddr, "manager metrics", "--metrics-bind-address"},
		{m.probeAddr, "manager health probes", "--health-probe-bind-address"},
		{img.cfg.HTTPSAddr, "image service HTTPS", "--https-addr"},
		{img.cfg.HTTPAddr, "image service HTTP", "--http-addr"},
		{ag.cfg.Addr, "agent API", "--agent-api-addr"},
	} {
		if p.addr == "0" || p.addr == "" {
			continue
		}
		if err := devcluster.CheckPort("tcp", p.addr, p.what, "choose another with "+p.flag); err != nil {
			return err
		}
	}
	return nil
}

// checkUIPort says whether the hosts page's address is free.
func checkUIPort(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--ui-addr: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--ui-addr %s: the page acts with the dev cluster's admin credentials, so it is served on a loopback address only", addr)
	}
	return devcluster.CheckPort("tcp", addr, "hosts page", "choose another with --ui-addr")
}

// advertiseAddress parses the flag, or finds this machine's primary address.
func advertiseAddress(flagValue string) (netip.Addr, error) {
	if flagValue != "" {
		a, err := netip.ParseAddr(flagValue)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--advertise-address %q is not an IP address", flagValue)
		}
		if a.IsUnspecified() {
			return netip.Addr{}, errors.New("--advertise-address must be an address hosts can reach, not 0.0.0.0 or ::")
		}
		return a, nil
	}
	a, err := hostaddr.Primary()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("find this machine's primary address (%w): set one with ADVERTISE_ADDRESS=<ip>", err)
	}
	return a, nil
}
