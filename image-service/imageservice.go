// Package imageservice serves each InfraEnv's discovery content over HTTP(S):
// ISOs made by laying the Ignition archive and kernel arguments over the
// cached base ISO (never a per-host copy), the PXE kernel, initrd (base plus
// an appended archive) and root filesystem, the iPXE script and the discovery
// Ignition. It renders with internal/discovery, as the InfraEnv controller
// does, from InfraEnvs and NMStateConfigs read through an informer cache, so
// it is stateless: any number of replicas answer the same URLs.
//
// It reads the cluster and writes one kind only: BootTraces, what it and the
// PXE service saw of each MAC's boot (docs/trace.md).
package imageservice

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/image-service/internal/server"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/diskboot"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/serve"
	"github.com/agentboot/agentboot/internal/signing"
)

// Config configures the image service.
type Config struct {
	// HTTPSAddr and HTTPAddr are the listen addresses (":8443", ":8080").
	HTTPSAddr, HTTPAddr string
	// TLSCertFile and TLSKeyFile are the HTTPS serving certificate.
	TLSCertFile, TLSKeyFile string
	Catalog                 *osimage.Catalog
	Keys                    signing.Source
	Settings                discovery.Settings
	// MaxConcurrentDownloads bounds image downloads in flight; past it the
	// service answers 503 with Retry-After.
	MaxConcurrentDownloads int
	// MaxDownloadsPerClient bounds one client address's downloads in
	// flight (8); DownloadStallTimeout how long a download may make no
	// progress before its connection is closed (1m).
	MaxDownloadsPerClient int
	DownloadStallTimeout  time.Duration
	// MaxDownloadsPerInfraEnv bounds the downloads of one InfraEnv's
	// content in flight (a quarter of MaxConcurrentDownloads).
	MaxDownloadsPerInfraEnv int
	// TrustedProxies are the proxies (an ingress) whose X-Forwarded-For
	// names the client for the per-client limit; none by default.
	TrustedProxies []netip.Prefix
	// BootNamespaces are the namespaces whose BareMetalHost boot MACs and
	// pxe-default InfraEnvs decide where a network-booting host goes: on a
	// boot network shared by teams, a namespace the admin has not
	// designated must not capture or block other teams' hosts.
	BootNamespaces Namespaces
	// Listen opens the listeners; nil is net.Listen. Tests listen inside a
	// network namespace with it.
	Listen func(network, addr string) (net.Listener, error)
	// Namespace is agentboot's own, where the boot traces of MACs nothing
	// claims are kept.
	Namespace string
	// ObservationsToken, when set, lets the PXE service post its boot
	// observations (docs/trace.md).
	ObservationsToken string
	// TraceInterval is how often boot traces are written (2 s).
	TraceInterval time.Duration
	Log           logr.Logger
}

// Namespaces is a set of namespaces, or every namespace.
type Namespaces = server.Namespaces

// ParseNamespaces reads a comma-separated list of namespaces; "*" is every
// namespace and "" none.
func ParseNamespaces(s string) (Namespaces, error) { return server.ParseNamespaces(s) }

// Service is the image service.
type Service struct {
	cfg     Config
	handler *server.Handler
}

// New checks cfg.
func New(cfg Config) (*Service, error) {
	if cfg.Catalog == nil || cfg.Keys == nil {
		return nil, errors.New("image-service: Catalog and Keys are required")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, err
	}
	if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" {
		return nil, errors.New("image-service: a TLS certificate and key are required (HTTPS serves everything but stock iPXE's files)")
	}
	for arch, a := range cfg.Settings.Agents {
		if _, err := os.Stat(a.Path); err != nil {
			return nil, fmt.Errorf("image-service: the %s agent binary: %w", arch, err)
		}
	}
	if cfg.MaxConcurrentDownloads <= 0 {
		cfg.MaxConcurrentDownloads = 256
	}
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	return &Service{cfg: cfg}, nil
}

// SetupWithManager indexes what the service looks up and adds it to mgr.
func (s *Service) SetupWithManager(mgr manager.Manager) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1beta1.InfraEnv{}, server.UIDIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return err
	}
	if err := macindex.RegisterHosts(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := diskboot.Register(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	// Each replica gathers what it saw and writes it (docs/trace.md).
	journal := &boottrace.Journal{}
	h, err := server.NewHandler(server.Options{
		Reader:            mgr.GetCache(),
		Catalog:           s.cfg.Catalog,
		Keys:              s.cfg.Keys,
		Settings:          s.cfg.Settings,
		MaxInFlight:       s.cfg.MaxConcurrentDownloads,
		MaxPerClient:      s.cfg.MaxDownloadsPerClient,
		MaxPerInfraEnv:    s.cfg.MaxDownloadsPerInfraEnv,
		TrustedProxies:    s.cfg.TrustedProxies,
		StallTimeout:      s.cfg.DownloadStallTimeout,
		BootNS:            s.cfg.BootNamespaces,
		Trace:             journal,
		ObservationsToken: s.cfg.ObservationsToken,
		Log:               s.cfg.Log,
	})
	if err != nil {
		return err
	}
	s.handler = h
	if err := mgr.Add(&boottrace.Writer{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Journal: journal, Claim: h.Claim,
		Namespace: s.cfg.Namespace, Interval: s.cfg.TraceInterval, Log: s.cfg.Log.WithName("boottrace")}); err != nil {
		return err
	}
	return mgr.Add(s)
}

type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

// NeedLeaderElection is false: every replica serves.
func (s *Service) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (s *Service) Start(ctx context.Context) error {
	if s.handler == nil {
		return errors.New("image-service: SetupWithManager was not called")
	}
	cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("image-service TLS certificate: %w", err)
	}
	servers := []*http.Server{
		{Addr: s.cfg.HTTPSAddr, Handler: s.handler.HTTPS(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}},
		{Addr: s.cfg.HTTPAddr, Handler: s.handler.HTTP()},
	}
	var tasks []serve.Task
	for _, srv := range servers {
		srv.ReadHeaderTimeout = 10 * time.Second
		srv.IdleTimeout = 2 * time.Minute
		// Connection-level noise (probes, aborted handshakes) is debug output.
		srv.ErrorLog = stdlog.New(logWriter{s.cfg.Log.V(1)}, "", 0)
		l, err := s.cfg.Listen("tcp", srv.Addr)
		if err != nil {
			serve.StopAll(tasks)
			return fmt.Errorf("image-service: listen %s: %w", srv.Addr, err)
		}
		secure := srv.TLSConfig != nil
		s.cfg.Log.Info("image service listening", "addr", l.Addr().String(), "tls", secure)
		name := "image service HTTP " + srv.Addr
		if secure {
			l, name = tls.NewListener(l, srv.TLSConfig), "image service HTTPS "+srv.Addr
		}
		tasks = append(tasks, serve.HTTP(name, srv, l))
	}
	return serve.Run(ctx, 10*time.Second, tasks...)
}
