package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/agentboot/agentboot/internal/atomicfile"
	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// serviceIP is the first address of the service range, which the apiserver
// claims for the `kubernetes` Service.
const serviceIP = "10.0.0.1"

// Default loopback ports, chosen away from the usual 2379/6443 so that a real
// cluster on the same machine does not collide with the dev one.
const (
	DefaultEtcdPort      = 12379
	DefaultEtcdPeerPort  = 12380
	DefaultAPIServerPort = 16443
)

// Config says where the binaries are, where state lives and which loopback
// ports to use.
type Config struct {
	// StateDir keeps etcd data, certificates, logs and the kubeconfig between runs.
	StateDir string
	// BinDir holds etcd, kube-apiserver and kubectl (`make testbin`).
	BinDir string
	// Fresh discards the state of earlier runs first.
	Fresh bool

	EtcdPort      int
	EtcdPeerPort  int
	APIServerPort int

	// ReadyTimeout bounds how long to wait for each process to answer.
	ReadyTimeout time.Duration
	Log          logr.Logger
}

// Cluster is a running control plane.
type Cluster struct {
	cfg      Config
	pki      pki
	lock     *os.File
	etcd     *process
	api      *process
	rest     *rest.Config
	died     chan error
	stopOnce chan struct{}
}

// New checks the configuration; nothing starts until Start.
func New(cfg Config) (*Cluster, error) {
	if cfg.StateDir == "" || cfg.BinDir == "" {
		return nil, errors.New("devcluster: StateDir and BinDir are required")
	}
	if cfg.EtcdPort == 0 {
		cfg.EtcdPort = DefaultEtcdPort
	}
	if cfg.EtcdPeerPort == 0 {
		cfg.EtcdPeerPort = DefaultEtcdPeerPort
	}
	if cfg.APIServerPort == 0 {
		cfg.APIServerPort = DefaultAPIServerPort
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 90 * time.Second
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	return &Cluster{
		cfg:      cfg,
		pki:      pki{dir: filepath.Join(abs, "pki")},
		died:     make(chan error, 2),
		stopOnce: make(chan struct{}),
	}, nil
}

// KubeconfigPath is the admin kubeconfig that Start writes.
func (c *Cluster) KubeconfigPath() string { return filepath.Join(c.cfg.StateDir, "kubeconfig") }

// RESTConfig is the admin client configuration; valid after Start.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Died delivers an error when etcd or kube-apiserver exits on its own.
func (c *Cluster) Died() <-chan error { return c.died }

// LogDir is where etcd and kube-apiserver write their logs.
func (c *Cluster) LogDir() string { return filepath.Join(c.cfg.StateDir, "logs") }

// Start launches etcd and kube-apiserver and returns once the apiserver is
// ready. On error everything it started is stopped again.
func (c *Cluster) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	bins, err := c.binaries()
	if err != nil {
		return err
	}
	if err := c.lockState(); err != nil {
		return err
	}
	if c.cfg.Fresh {
		if err := c.discardState(); err != nil {
			return fmt.Errorf("discard previous state in %s: %w", c.cfg.StateDir, err)
		}
	}
	if err := c.checkPorts(); err != nil {
		return err
	}
	if err := c.pki.ensure(); err != nil {
		return fmt.Errorf("certificates in %s: %w", c.pki.dir, err)
	}
	if err := c.writeKubeconfig(); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}

	c.etcd, err = startProcess("etcd", bins["etcd"], c.LogDir(), c.etcdArgs())
	if err != nil {
		return err
	}
	c.watch(c.etcd)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d/health", c.cfg.EtcdPort)
	if err := c.waitReady(ctx, c.etcd, http.DefaultClient, etcdURL); err != nil {
		return err
	}
	c.cfg.Log.Info("etcd ready", "endpoint", fmt.Sprintf("127.0.0.1:%d", c.cfg.EtcdPort), "log", c.etcd.logPath)

	c.api, err = startProcess("kube-apiserver", bins["kube-apiserver"], c.LogDir(), c.apiserverArgs())
	if err != nil {
		return err
	}
	c.watch(c.api)
	client, err := c.adminHTTPClient()
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, c.api, client, c.apiserverURL()+"/readyz"); err != nil {
		return err
	}
	c.rest, err = clientcmd.BuildConfigFromFlags("", c.KubeconfigPath())
	if err != nil {
		return err
	}
	c.cfg.Log.Info("kube-apiserver ready", "url", c.apiserverURL(), "log", c.api.logPath)
	return nil
}

// Stop terminates kube-apiserver, then etcd, and releases the state lock.
// It is safe to call more than once.
func (c *Cluster) Stop() {
	select {
	case <-c.stopOnce:
		return
	default:
		close(c.stopOnce)
	}
	if c.api != nil {
		c.api.stop(15 * time.Second)
	}
	if c.etcd != nil {
		c.etcd.stop(15 * time.Second)
	}
	if c.lock != nil {
		c.lock.Close()
	}
}

// watch reports an exit that Stop did not ask for.
func (c *Cluster) watch(p *process) {
	go func() {
		<-p.done
		select {
		case <-c.stopOnce:
		default:
			c.died <- p.failure()
		}
	}()
}

func (c *Cluster) binaries() (map[string]string, error) {
	bins := map[string]string{}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		path, err := filepath.Abs(filepath.Join(c.cfg.BinDir, name))
		if err != nil {
			return nil, err
		}
		if info, err := os.Stat(path); err != nil || info.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%w: %s not found at %s: run `make testbin` (builds etcd, kube-apiserver and kubectl once, 5-10 minutes)", errMissingBinary, name, path)
		}
		bins[name] = path
	}
	return bins, nil
}

// lockState makes sure only one `agentboot dev` uses a state directory.
func (c *Cluster) lockState() error {
	if err := os.MkdirAll(c.cfg.StateDir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(c.cfg.StateDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("%s is in use by another `agentboot dev`: stop that one first (Ctrl-C in its terminal)", c.cfg.StateDir)
	}
	c.lock = f
	return nil
}

// discardState removes everything in the state directory except the lock.
func (c *Cluster) discardState() error {
	entries, err := os.ReadDir(c.cfg.StateDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == ".lock" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.cfg.StateDir, e.Name())); err != nil {
			return err
		}
	}
	c.cfg.Log.Info("discarded previous dev state", "dir", c.cfg.StateDir)
	return nil
}

// CheckPort fails with a message naming the port's user and the fix when
// addr cannot be listened on.
func CheckPort(network, addr, what, fix string) error {
	switch network {
	case "udp":
		conn, err := net.ListenPacket("udp", addr)
		if err != nil {
			return portError(addr, what, fix, err)
		}
		return conn.Close()
	default:
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return portError(addr, what, fix, err)
		}
		return l.Close()
	}
}

func portError(addr, what, fix string, err error) error {
	_, port, _ := net.SplitHostPort(addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("port %s (%s) is already in use: find the process with `ss -lntup 'sport = :%s'` and stop it, or %s", addr, what, port, fix)
	}
	return fmt.Errorf("cannot listen on %s (%s): %w; %s", addr, what, err, fix)
}

func (c *Cluster) checkPorts() error {
	return CheckPorts(c.cfg.EtcdPort, c.cfg.EtcdPeerPort, c.cfg.APIServerPort)
}

// CheckPorts says which of the control plane's loopback ports is taken, and
// how to choose another.
func CheckPorts(etcd, etcdPeer, apiserver int) error {
	for _, p := range []struct {
		port      int
		what, fix string
	}{
		{etcd, "dev etcd", "choose another with --etcd-port"},
		{etcdPeer, "dev etcd peer", "choose another with --etcd-peer-port"},
		{apiserver, "dev kube-apiserver", "choose another with --apiserver-port"},
	} {
		if err := CheckPort("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), p.what, p.fix); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) etcdArgs() []string {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.cfg.EtcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.cfg.EtcdPeerPort)
	return []string{
		"--name=agentboot-dev",
		"--data-dir=" + filepath.Join(c.cfg.StateDir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=agentboot-dev=" + peer,
		"--listen-metrics-urls=",
		// A dev cluster trades durability across power loss for speed.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
}

func (c *Cluster) apiserverURL() string {
	return fmt.Sprintf("https://127.0.0.1:%d", c.cfg.APIServerPort)
}

func (c *Cluster) apiserverArgs() []string {
	return []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.cfg.EtcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The kubernetes Service would point at loopback: nothing in-cluster
		// dials it in dev, and the apiserver refuses loopback endpoints.
		"--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", c.cfg.APIServerPort),
		"--cert-dir=" + filepath.Join(c.cfg.StateDir, "apiserver-certs"),
		"--tls-cert-file=" + c.pki.servingCert(),
		"--tls-private-key-file=" + c.pki.servingKey(),
		"--client-ca-file=" + c.pki.caCert(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.saPublic(),
		"--service-account-signing-key-file=" + c.pki.saPrivate(),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
}

func (c *Cluster) adminHTTPClient() (*http.Client, error) {
	caPEM, err := os.ReadFile(c.pki.caCert())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(c.pki.adminCert(), c.pki.adminKey())
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}},
	}, nil
}

// waitReady polls url until it answers 200, p exits, or the timeout passes.
func (c *Cluster) waitReady(ctx context.Context, p *process, client *http.Client, url string) error {
	deadline := time.NewTimer(c.cfg.ReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return p.failure()
		case <-deadline.C:
			return fmt.Errorf("%s did not become ready at %s within %s; last lines of %s:\n%s", p.name, url, c.cfg.ReadyTimeout, p.logPath, tail(p.logPath, 15))
		case <-tick.C:
		}
	}
}

func (c *Cluster) writeKubeconfig() error {
	ca, err := os.ReadFile(c.pki.caCert())
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(c.pki.adminCert())
	if err != nil {
		return err
	}
	key, err := os.ReadFile(c.pki.adminKey())
	if err != nil {
		return err
	}
	const name = "agentboot-dev"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: c.apiserverURL(), CertificateAuthorityData: ca}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: "default"}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return atomicfile.Write(c.KubeconfigPath(), data, 0o600)
}

// ServiceCertificate issues (or reuses) a certificate, signed by the dev CA,
// for agentboot's services at addr, loopback and localhost. It returns the
// certificate, key and CA files.
func (c *Cluster) ServiceCertificate(addr netip.Addr) (certFile, keyFile, caFile string, err error) {
	ips := []net.IP{net.IP(addr.AsSlice()), net.ParseIP("127.0.0.1")}
	certFile, keyFile, err = c.pki.serviceCertificate(ips, []string{"localhost"})
	return certFile, keyFile, c.pki.caCert(), err
}
