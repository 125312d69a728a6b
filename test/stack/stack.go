// Package stack runs agentboot as the agentboot command wires it (internal/
// app) against a real kube-apiserver, with the dev OS image in the catalog,
// for integration tests and benchmarks.
package stack

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentservice "github.com/agentboot/agentboot/agent-service"
	"github.com/agentboot/agentboot/bmc"
	"github.com/agentboot/agentboot/cmd/agentboot/app"
	imageservice "github.com/agentboot/agentboot/image-service"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/test/container"
	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

// Namespace is agentboot's own namespace in the stack.
const Namespace = "agentboot-system"

// Options shape a stack.
type Options struct {
	// AdvertiseHost is what URLs name: 127.0.0.1 by default; VM tests on
	// qemu user networking use 10.0.2.2, which reaches the host's loopback.
	AdvertiseHost string
	// ISOOverHTTP publishes ISO URLs over plain HTTP.
	ISOOverHTTP bool
	// MaxConcurrentDownloads bounds image downloads.
	MaxConcurrentDownloads int
	// MaxDownloadsPerClient and DownloadStallTimeout tune the image
	// service's download slots.
	MaxDownloadsPerClient, MaxDownloadsPerInfraEnv int
	DownloadStallTimeout                           time.Duration
	// Images replace the dev OS image stream in the catalog.
	Images []osimage.Entry
	// Quiet drops component logs (benchmarks).
	Quiet bool
	// AgentArm64 also builds and serves the agent for aarch64 hosts.
	AgentArm64 bool
	// BMC tunes the BareMetalHost controller (tests shorten its timing).
	BMC bmc.Config
	// NodePool tunes the installation of bound Agents.
	NodePool nodepool.Config
	// AgentClassifications runs the AgentClassification controllers.
	AgentClassifications bool
	// Agent service timing, for tests that cannot wait minutes.
	AgentPollInterval       time.Duration
	AgentLeaseRenewInterval time.Duration
	AgentDisconnectAfter    time.Duration
	// AgentControllerPasses is told of each finished pass of the Agent
	// controller (testenv.Passes.Observe).
	AgentControllerPasses observe.Hook
	// DiskBootPasses is told of each finished pass of the controller that
	// keeps the disk-boot records.
	DiskBootPasses observe.Hook
	// MaxAgentsPerInfraEnv caps each InfraEnv's Agents (default: the
	// service's).
	MaxAgentsPerInfraEnv int
	// MaxUnapprovedPerInfraEnv and the write budgets (bytes per second)
	// likewise (agent-service Config).
	MaxUnapprovedPerInfraEnv                      int
	WriteBudgetPerInfraEnv, WriteBudgetPerProcess int
	// WritesInFlight likewise (agent-service Config).
	WritesInFlight int
	// BootNetworkNamespaces are the namespaces that may claim
	// network-booting hosts (--boot-network-namespaces); default "*".
	BootNetworkNamespaces string
	// Listen and Dial, when set, put the services' listeners and the
	// stack's HTTP client somewhere else (the VM lab's network namespace);
	// listeners then bind AdvertiseHost.
	Listen func(network, addr string) (net.Listener, error)
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	// Binary, when set, runs the manager, the agent API and the image
	// service as processes of this agentboot executable with the flags
	// deploy/ gives them (Identities is then required; the options that
	// have no flag, such as BMC and NodePool timings, are not applied);
	// Stack.Upgrade replaces them with another executable's.
	Binary string
	// Identities, when set, prepares the cluster (it must create the
	// agentboot-system namespace, and may find it made already: see Main)
	// and returns the identities the manager, the agent API and the image
	// service run as, in three processes as deployed; the stack then
	// mounts the agent API's keys as the kubelet does.
	Identities func(env *testenv.Env) (Identities, error)
	// BootStallAfter is how long a boot may make no progress before its
	// host gets a BootStalled event (10 min).
	BootStallAfter time.Duration
	// BootObservationsToken lets the PXE service post boot observations to
	// the image service (--boot-observations-token-file).
	BootObservationsToken string
	// Metrics serves the in-process components' metrics (one registry:
	// the pool, BMCs, agent API, image service) on a loopback port, over
	// HTTPS with Kubernetes authentication and authorization as deployed
	// (Stack.MetricsURL). Not with Binary.
	Metrics bool
}

// Identities are what each of agentboot's processes runs as.
type Identities struct {
	Manager, AgentAPI, ImageService *rest.Config
}

// Stack is a running agentboot.
type Stack struct {
	Env      *testenv.Env
	Client   client.Client
	Settings discovery.Settings
	Catalog  *osimage.Catalog
	// HTTPSAddr and HTTPAddr are the image service's loopback listeners,
	// AgentAPIAddr the agent API's.
	HTTPSAddr, HTTPAddr, AgentAPIAddr string
	// HTTP trusts the stack's CA.
	HTTP     *http.Client
	CAFile   string
	AgentBin string
	// ImageCache is the catalog's cache directory. With the dev OS image
	// (no Options.Images) every stack shares one, keyed by the image's
	// stream metadata, as replicas share a volume: the images are
	// downloaded and checked once per dev image, not once per test.
	ImageCache string
	// MetricsURL is where Options.Metrics serves metrics.
	MetricsURL string

	replaceManager func() error
	upgrade        func(binary, deploy string) error
}

// ReplaceManager stops the manager (controllers and agent API, in one
// process or two) and starts new ones with the same configuration, as
// replicas that take over from ones that went away; what they know comes
// from the apiserver only.
func (s *Stack) ReplaceManager(t testing.TB) {
	t.Helper()
	if err := s.replaceManager(); err != nil {
		t.Fatal(err)
	}
}

// Start runs a stack for the duration of t.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	s, stop, err := start(opts, logFor(t, opts.Quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// MainWith runs a package's tests (call it from TestMain) against one
// stack for the whole binary, started with opts and set in *s before the
// first test.
func MainWith(m *testing.M, opts Options, s **Stack) {
	st, stop, err := StartMain(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*s = st
	code := m.Run()
	stop()
	os.Exit(code)
}

// StartMain runs a stack for a whole test binary (TestMain); the returned
// function stops it.
func StartMain(opts Options) (*Stack, func(), error) {
	s, stop, err := start(opts, logr.Discard())
	if err != nil {
		return nil, nil, err
	}
	return s, func() {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}, err
}

func logFor(t testing.TB, quiet bool) logr.Logger {
	if quiet {
		return logr.Discard()
	}
	return testr.NewWithInterface(t, testr.Options{Verbosity: 0})
}

// AgentBinary builds the real agent (x86_64) once per test process.
func AgentBinary() (string, error) { return agentFor("amd64") }

// AgentBinaryArm64 builds the real agent for aarch64 hosts once per test
// process.
func AgentBinaryArm64() (string, error) { return agentFor("arm64") }

type builtAgent struct {
	once sync.Once
	path string
	err  error
}

var agents = map[string]*builtAgent{"amd64": {}, "arm64": {}}

func agentFor(goarch string) (string, error) {
	b := agents[goarch]
	b.once.Do(func() {
		dir, err := testenv.ProcessTempDir("agentboot-agent-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "agent-"+goarch)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", b.path, "./cmd/agent")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build agent for %s: %v: %s", goarch, err, out)
		}
	})
	return b.path, b.err
}

// globalLogger sets controller-runtime's global logger, which only its
// first SetLogger sets: a test's logger there would still be used after
// that test ended, a panic once anything of a later test (or of the same
// test run again, -count=2) logs through it. What logs without a logger of
// its own writes to stderr.
var globalLogger sync.Once

func start(opts Options, log logr.Logger) (*Stack, func() error, error) {
	if opts.AdvertiseHost == "" {
		opts.AdvertiseHost = "127.0.0.1"
	}
	globalLogger.Do(func() {
		ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, strings.TrimSpace(prefix+" "+args)) }, funcr.Options{}))
	})
	env, release, err := controlPlane(testenv.Options{HyperShift: true}, emptyCRs)
	if err != nil {
		return nil, nil, err
	}
	var released error
	cleanup := []func(){func() { released = release() }}
	stop := func() error {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		return released
	}
	fail := func(err error) (*Stack, func() error, error) {
		return nil, nil, errors.Join(err, stop())
	}
	dir, err := os.MkdirTemp("", "agentboot-stack-")
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })

	s := &Stack{Env: env, Client: env.Client, ImageCache: filepath.Join(dir, "cache")}
	if s.AgentBin, err = AgentBinary(); err != nil {
		return fail(err)
	}
	certFile, keyFile, caPEM, err := Certificates(dir, opts.AdvertiseHost)
	if err != nil {
		return fail(err)
	}
	s.CAFile = filepath.Join(dir, "ca.crt")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	s.HTTP = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: opts.Dial}}

	ports, err := testenv.FreePorts(3)
	if err != nil {
		return fail(err)
	}
	listenHost := "127.0.0.1"
	if opts.Listen != nil {
		listenHost = opts.AdvertiseHost
	}
	hostPort := func(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
	s.HTTPSAddr = hostPort(listenHost, ports[0])
	s.HTTPAddr = hostPort(listenHost, ports[1])
	s.AgentAPIAddr = hostPort(listenHost, ports[2])
	s.Settings = discovery.Settings{
		AgentAPIURL:         "https://" + hostPort(opts.AdvertiseHost, ports[2]),
		ImageServiceURL:     "https://" + hostPort(opts.AdvertiseHost, ports[0]),
		ImageServiceHTTPURL: "http://" + hostPort(opts.AdvertiseHost, ports[1]),
		ISOOverHTTP:         opts.ISOOverHTTP,
		CABundle:            string(caPEM),
	}
	agent, err := discovery.AgentBinaryFor(s.AgentBin, "x86_64")
	if err != nil {
		return fail(err)
	}
	s.Settings.Agents = map[string]discovery.AgentBinary{"x86_64": agent}
	if opts.AgentArm64 {
		path, err := AgentBinaryArm64()
		if err != nil {
			return fail(err)
		}
		if s.Settings.Agents["aarch64"], err = discovery.AgentBinaryFor(path, "aarch64"); err != nil {
			return fail(err)
		}
	}

	var streams []string
	if len(opts.Images) == 0 {
		stream, err := testenv.DevStream()
		if err != nil {
			return fail(err)
		}
		if s.ImageCache, err = sharedImageCache(stream); err != nil {
			return fail(err)
		}
		streams = []string{stream}
	}
	catCfg := osimage.Config{CacheDir: s.ImageCache, Images: opts.Images, Streams: streams, Log: log.WithName("osimage"), RetryMin: 200 * time.Millisecond, RetryMax: time.Second}
	if s.Catalog, err = osimage.New(catCfg); err != nil {
		return fail(err)
	}

	ctx := context.Background()
	ids := Identities{Manager: env.Config, AgentAPI: env.Config, ImageService: env.Config}
	if opts.Identities != nil {
		if ids, err = opts.Identities(env); err != nil {
			return fail(err)
		}
	} else if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		// A shared control plane keeps it from the stack before.
		return fail(err)
	}
	if opts.BootNetworkNamespaces == "" {
		opts.BootNetworkNamespaces = "*"
	}
	bootNS, err := imageservice.ParseNamespaces(opts.BootNetworkNamespaces)
	if err != nil {
		return fail(err)
	}
	imgSvc := &imageservice.Config{
		HTTPSAddr: s.HTTPSAddr, HTTPAddr: s.HTTPAddr, TLSCertFile: certFile, TLSKeyFile: keyFile,
		MaxConcurrentDownloads: opts.MaxConcurrentDownloads, Listen: opts.Listen,
		BootNamespaces: bootNS, MaxDownloadsPerClient: opts.MaxDownloadsPerClient, DownloadStallTimeout: opts.DownloadStallTimeout,
		MaxDownloadsPerInfraEnv: opts.MaxDownloadsPerInfraEnv,
		ObservationsToken:       opts.BootObservationsToken, TraceInterval: 200 * time.Millisecond,
	}
	controllers := app.Components{
		Namespace:   Namespace,
		Catalog:     s.Catalog,
		Settings:    s.Settings,
		Controllers: true,
		AgentService: &agentservice.Config{
			Addr: s.AgentAPIAddr, TLSCertFile: certFile, TLSKeyFile: keyFile, Listen: opts.Listen,
			PollInterval: opts.AgentPollInterval, LeaseRenewInterval: opts.AgentLeaseRenewInterval, DisconnectAfter: opts.AgentDisconnectAfter,
			MaxAgentsPerInfraEnv: opts.MaxAgentsPerInfraEnv, MaxUnapprovedPerInfraEnv: opts.MaxUnapprovedPerInfraEnv,
			WriteBudgetPerInfraEnv: opts.WriteBudgetPerInfraEnv, WriteBudgetPerProcess: opts.WriteBudgetPerProcess,
			WritesInFlight:   opts.WritesInFlight,
			ControllerPasses: opts.AgentControllerPasses, DiskBootPasses: opts.DiskBootPasses,
		},
		InfraEnvPullSecretRecheck: time.Second,
		BMC:                       opts.BMC,
		NodePool:                  opts.NodePool,
		AgentClassifications:      opts.AgentClassifications,
		BootStallAfter:            opts.BootStallAfter,
	}
	if opts.Binary != "" {
		if opts.Identities == nil {
			return fail(errNoIdentities)
		}
		b, err := s.newBinaries(opts, ids, dir, certFile, keyFile, streams, log)
		if err != nil {
			return fail(err)
		}
		kctx, stopKubelet := context.WithCancel(ctx)
		kubeletDone := make(chan struct{})
		go func() { defer close(kubeletDone); b.mountKeys(kctx, env.Client) }()
		cleanup = append(cleanup, func() { stopKubelet(); <-kubeletDone }, b.stop)
		if err := b.start(opts.Binary); err != nil {
			return fail(err)
		}
		s.replaceManager = func() error { b.stop(); return b.start(opts.Binary) }
		s.upgrade = func(binary, deploy string) error {
			if out, err := env.Kubectl(ctx, "", "apply", "-k", deploy); err != nil {
				return fmt.Errorf("apply %s: %v: %s", deploy, err, out)
			}
			b.stop()
			opts.Binary = binary
			return b.start(binary)
		}
		return s, stop, nil
	}
	processes := []struct {
		cfg *rest.Config
		c   app.Components
	}{{ids.Manager, controllers}}
	if opts.Identities != nil {
		// Three processes, as deployed: each with its own identity; the
		// manager and the image service each with its own catalog; the
		// agent API with its keys as the kubelet mounts them.
		apiCfg, mgrCfg := *controllers.AgentService, *controllers.AgentService
		api := app.Components{Namespace: Namespace, AgentService: &apiCfg}
		mgrCfg.Addr = ""
		processes[0].c.AgentService = &mgrCfg
		keysDir, err := os.MkdirTemp("", "agentboot-agent-api-keys-")
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, func() { os.RemoveAll(keysDir) })
		kctx, stopKubelet := context.WithCancel(ctx)
		kubeletDone := make(chan struct{})
		go func() {
			defer close(kubeletDone)
			container.MountSecret(kctx, env.Client, client.ObjectKey{Namespace: Namespace, Name: signing.AgentAPISecretName}, keysDir, 0o400, -1, log)
		}()
		cleanup = append(cleanup, func() { stopKubelet(); <-kubeletDone })
		api.AgentAPIKeysDir = keysDir
		images := controllers
		images.Controllers = false
		images.AgentService = nil
		images.ImageService = imgSvc
		if images.Catalog, err = osimage.New(catCfg); err != nil {
			return fail(err)
		}
		processes = append(processes, struct {
			cfg *rest.Config
			c   app.Components
		}{ids.AgentAPI, api}, struct {
			cfg *rest.Config
			c   app.Components
		}{ids.ImageService, images})
	} else {
		processes[0].c.ImageService = imgSvc
	}
	var replace []func() error
	metricsAddr := "0"
	if opts.Metrics {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		metricsAddr = l.Addr().String()
		l.Close()
		s.MetricsURL = "https://" + metricsAddr + "/metrics"
	}
	for i, p := range processes {
		mo := app.ManagerOptions{Namespace: Namespace, MetricsAddr: "0", ProbeAddr: "0", SkipControllerNameValidation: true}
		if i == 0 && opts.Metrics {
			mo.MetricsAddr, mo.MetricsSecure = metricsAddr, true
		}
		run := func() (func(), error) {
			mgr, err := app.NewManager(p.cfg, mo, log)
			if err != nil {
				return nil, err
			}
			if err := app.Add(mgr, p.c, log); err != nil {
				return nil, err
			}
			mctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- mgr.Start(mctx) }()
			return func() { cancel(); <-done }, nil
		}
		stopProcess, err := run()
		if err != nil {
			return fail(err)
		}
		if p.c.Controllers || p.c.AgentService != nil {
			// The manager process, and the agent API's when apart, can be
			// replaced, as new replicas take over from ones that stopped.
			replace = append(replace, func() error {
				stopProcess()
				stopProcess = func() {}
				if p.c.Catalog != nil {
					// A new process has a catalog of its own (a Catalog
					// starts once), over the same cache directory.
					catalog, err := osimage.New(catCfg)
					if err != nil {
						return err
					}
					p.c.Catalog = catalog
					if i == 0 {
						s.Catalog = catalog
					}
				}
				next, err := run()
				if err != nil {
					return err
				}
				stopProcess = next
				return nil
			})
		}
		cleanup = append(cleanup, func() { stopProcess() })
	}
	s.replaceManager = func() error {
		for _, r := range replace {
			if err := r(); err != nil {
				return err
			}
		}
		return waitListening(opts.Dial, s.AgentAPIAddr, time.Minute)
	}
	// Ready when every server of the stack accepts connections, the agent
	// API included: a test's first registration must not meet a refusal.
	for _, addr := range []string{s.HTTPSAddr, s.HTTPAddr, s.AgentAPIAddr} {
		if err := waitListening(opts.Dial, addr, time.Minute); err != nil {
			return fail(err)
		}
	}
	return s, stop, nil
}

// sharedImageCache is the catalog cache every stack of the dev image shares
// (across test processes too: the catalog's downloads rename into place and
// its minimal ISOs are made under a file lock). It is keyed by the stream
// metadata, which names each image's sha256, so a rebuilt dev image gets a
// new one. It lives in the user's own cache ($AGENTBOOT_CACHE, else
// ~/.cache/agentboot), mode 0700: the catalog trusts a cached image's
// recorded digest, so nobody else may write there.
func sharedImageCache(stream string) (string, error) {
	data, err := os.ReadFile(stream)
	if err != nil {
		return "", err
	}
	base := vm.CacheDir()
	sum := sha256.Sum256(data)
	dir := filepath.Join(base, "test-images", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	st, err := os.Stat(filepath.Dir(dir))
	if err != nil {
		return "", err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return "", fmt.Errorf("OS image cache %s belongs to another user (uid %d): set AGENTBOOT_CACHE to a directory of your own", filepath.Dir(dir), sys.Uid)
	}
	return dir, nil
}

func waitListening(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, timeout time.Duration) error {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := dial(ctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s (image service or agent API) after %s", addr, timeout)
}

// Certificates makes a CA and a serving certificate for loopback and host in
// dir (ca.crt, tls.crt, tls.key).
func Certificates(dir, host string) (certFile, keyFile string, caPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentboot-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return "", "", nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(host); ip != nil {
		ips = append(ips, ip)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "agentboot-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: ips, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return "", "", nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o644); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	return certFile, keyFile, caPEM, nil
}
