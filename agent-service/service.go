// Package agentservice is the service side of the agent: the agent API that
// hosts register and heartbeat with (every replica of `agentboot agent-api`,
// or of a manager that serves it) and the Agent controller that turns what
// hosts report into Agent status (leader-elected, in the manager). It
// writes Agents, their status, and in agentboot's own namespace liveness
// Leases, erase debts and disk-boot records; it never touches InfraEnvs.
package agentservice

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/agentboot/agentboot/agent-service/internal/agentstatus"
	"github.com/agentboot/agentboot/agent-service/internal/debts"
	"github.com/agentboot/agentboot/agent-service/internal/hostapi"
	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	"github.com/agentboot/agentboot/agent-service/internal/steps"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/diskboot"
	"github.com/agentboot/agentboot/internal/eventnote"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/internal/serve"
	"github.com/agentboot/agentboot/internal/signing"
)

// Config configures the agent service.
type Config struct {
	// Controller adds the Agent controller (it runs on the leader).
	Controller bool
	// Addr, when set, serves the agent API there over HTTPS (":7443"; on
	// every replica).
	Addr string
	// TLSCertFile and TLSKeyFile are its serving certificate.
	TLSCertFile, TLSKeyFile string
	// Listen opens the listener; nil is net.Listen. Tests listen inside a
	// network namespace with it.
	Listen func(network, addr string) (net.Listener, error)
	Keys   signing.Source
	// Namespace is agentboot's own namespace, where liveness Leases live.
	Namespace string
	// Minimums for hosts, unless an InfraEnv's hostRequirements says
	// otherwise (defaults: 2 cores, 8 GiB, 100 GB).
	MinCPUCores      int64
	MinMemoryBytes   int64
	MinDiskSizeBytes int64
	// MaxAgentsPerInfraEnv caps the Agents one InfraEnv's discovery token
	// can create (DefaultMaxAgentsPerInfraEnv): the token travels in clear
	// in PXE initrds, and without a cap anyone holding it could fill etcd.
	MaxAgentsPerInfraEnv int
	// MaxUnapprovedPerInfraEnv caps its unapproved Agents
	// (DefaultMaxUnapprovedPerInfraEnv; negative: no cap).
	MaxUnapprovedPerInfraEnv int
	// WriteBudgetPerInfraEnv and WriteBudgetPerProcess are the bytes per
	// second the agent API may write to the apiserver for one InfraEnv's
	// hosts, and in all (the defaults below; negative: no limit).
	WriteBudgetPerInfraEnv, WriteBudgetPerProcess int
	// WritesInFlight bounds the registrations and inventory uploads the
	// agent API serves at once (DefaultWritesInFlight; negative: no bound):
	// past it a host waits a moment, then gets 429 and when to come back.
	WritesInFlight int
	// PollInterval is how often hosts heartbeat (20s); LeaseRenewInterval
	// the most often their Lease is written (45s: every third heartbeat); DisconnectAfter how long
	// a silent host stays connected (3m).
	PollInterval       time.Duration
	LeaseRenewInterval time.Duration
	DisconnectAfter    time.Duration
	Log                logr.Logger
	// ControllerPasses, when set, is told of each finished pass of the
	// Agent controller: tests wait on passes, not on the wall clock.
	ControllerPasses observe.Hook
	// DiskBootPasses, likewise, of the controller that keeps the records
	// of which hosts boot from their disks.
	DiskBootPasses observe.Hook
}

// EraseDebtLabel marks the ConfigMaps in agentboot's namespace that record
// the erases machines owe by their hardware (docs/security.md).
const EraseDebtLabel = debts.Label

// Defaults of the caps and budgets. A holder of one InfraEnv's
// registration token can store at most 500 unapproved Agents of 64 KiB of
// inventory (32 MiB) and write at most 256 KiB/s for them (75 MiB of etcd
// history between two compactions), a quarter of a replica's 1 MiB/s. An
// honest host is charged about 40 KiB to register (its Agent created, its
// record, its inventory, the controller's writes after them, etcd's
// overhead): 400 hosts of an InfraEnv register at once, a larger boot
// storm at about 6 hosts a second after that.
const (
	DefaultMaxAgentsPerInfraEnv     = 5000
	DefaultMaxUnapprovedPerInfraEnv = 500
	DefaultWriteBudgetPerInfraEnv   = 256 << 10
	DefaultWriteBudgetPerProcess    = 1 << 20
	// DefaultWritesInFlight: enough to keep the apiserver busy, few
	// enough that a host served waits for a handful of writes, not for
	// a whole rack's.
	DefaultWritesInFlight = 32
)

// orDefault is v, def when v is 0, and 0 (none) when v is negative.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (c *Config) defaults() {
	if c.MaxAgentsPerInfraEnv == 0 {
		c.MaxAgentsPerInfraEnv = DefaultMaxAgentsPerInfraEnv
	}
	d := agentstatus.DefaultRequirements
	if c.MinCPUCores == 0 {
		c.MinCPUCores = d.MinCPUCores
	}
	if c.MinMemoryBytes == 0 {
		c.MinMemoryBytes = d.MinMemoryBytes
	}
	if c.MinDiskSizeBytes == 0 {
		c.MinDiskSizeBytes = d.MinDiskSizeBytes
	}
	if c.PollInterval == 0 {
		c.PollInterval = agentwire.DefaultPollInterval
	}
	if c.LeaseRenewInterval == 0 {
		c.LeaseRenewInterval = 45 * time.Second
	}
	if c.DisconnectAfter == 0 {
		c.DisconnectAfter = 3 * time.Minute
	}
	if c.Listen == nil {
		c.Listen = net.Listen
	}
}

// SetupWithManager adds the agent service to mgr: the cache index both
// of its parts read, the Agent controller when cfg.Controller, and the
// agent API server when cfg.Addr is set. The configuration is checked
// before anything is added.
func SetupWithManager(mgr manager.Manager, cfg Config) error {
	cfg.defaults()
	if !cfg.Controller && cfg.Addr == "" {
		return errors.New("agent service: neither the controller nor the API (Addr) is asked for")
	}
	if cfg.Addr != "" {
		if cfg.Keys == nil {
			return errors.New("agent service: Keys are required")
		}
		if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" {
			return errors.New("agent service: the agent API is HTTPS only and needs a certificate and key")
		}
	}
	if err := debts.Index(context.Background(), mgr); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1beta1.Agent{}, hosts.HostnameIndex, func(o client.Object) []string {
		if h := o.(*v1beta1.Agent).Hostname(); h != "" {
			return []string{h}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1beta1.Agent{}, hosts.InfraEnvIndex, func(o client.Object) []string {
		if r := o.(*v1beta1.Agent).Status.Registration; r != nil && r.InfraEnvUID != "" {
			return []string{r.InfraEnvUID}
		}
		return nil
	}); err != nil {
		return err
	}
	if cfg.Controller {
		if err := setupController(mgr, cfg); err != nil {
			return err
		}
	}
	if cfg.Addr != "" {
		return setupAPI(mgr, cfg)
	}
	return nil
}

func setupController(mgr manager.Manager, cfg Config) error {
	// What the image service may know of installed hosts, without
	// reading Agents.
	if err := (&diskboot.Reconciler{Client: mgr.GetClient(), Namespace: cfg.Namespace, Passes: cfg.DiskBootPasses}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&agentstatus.Reconciler{
		Client:          mgr.GetClient(),
		APIReader:       mgr.GetAPIReader(),
		Events:          eventnote.Recorder(mgr.GetEventRecorder("agentboot-agent-controller")),
		LeaseNamespace:  cfg.Namespace,
		Requirements:    agentstatus.Requirements{MinCPUCores: cfg.MinCPUCores, MinMemoryBytes: cfg.MinMemoryBytes, MinDiskSizeBytes: cfg.MinDiskSizeBytes},
		DisconnectAfter: cfg.DisconnectAfter,
		Now:             time.Now,
		Passes:          cfg.ControllerPasses,
	}).SetupWithManager(mgr)
}

func setupAPI(mgr manager.Manager, cfg Config) error {
	// Sanitizations are counted from zero, so that the first failure is
	// an increase an alert sees.
	poolmetrics.Register()
	owed := &debts.Store{Client: mgr.GetClient(), Namespace: cfg.Namespace, Now: time.Now}
	// Bound hosts install what the manager hands over for them (package
	// handover); hosts that owe an erase get it first.
	install := &steps.Steps{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Keys: cfg.Keys, Namespace: cfg.Namespace,
		Debts:  owed,
		Events: eventnote.Recorder(mgr.GetEventRecorder("agentboot-agent-api")), Log: cfg.Log.WithName("steps"), Now: time.Now,
	}
	// Heartbeats held until their host has work are woken by what the
	// cache sees change: the Agent (approved, bound) and its handover.
	waker := &hostapi.Waker{}
	if err := wakeOn(mgr, waker); err != nil {
		return err
	}
	srv := hostapi.New(hostapi.Options{
		Client:                 mgr.GetClient(),
		APIReader:              mgr.GetAPIReader(),
		Keys:                   cfg.Keys,
		Events:                 eventnote.Recorder(mgr.GetEventRecorder("agentboot-agent-api")),
		LeaseNamespace:         cfg.Namespace,
		MinDiskSizeBytes:       cfg.MinDiskSizeBytes,
		MaxAgents:              cfg.MaxAgentsPerInfraEnv,
		MaxUnapproved:          orDefault(cfg.MaxUnapprovedPerInfraEnv, DefaultMaxUnapprovedPerInfraEnv),
		WriteBudgetPerInfraEnv: orDefault(cfg.WriteBudgetPerInfraEnv, DefaultWriteBudgetPerInfraEnv),
		WriteBudgetPerProcess:  orDefault(cfg.WriteBudgetPerProcess, DefaultWriteBudgetPerProcess),
		WritesInFlight:         orDefault(cfg.WritesInFlight, DefaultWritesInFlight),
		PollInterval:           cfg.PollInterval,
		Waker:                  waker,
		LeaseRenewInterval:     cfg.LeaseRenewInterval,
		Steps:                  install,
		Debts:                  owed,
		Log:                    cfg.Log,
	})
	return mgr.Add(&server{cfg: cfg, handler: srv.Handler(), waker: waker})
}

// wakeOn feeds waker from the cache's informers: an Agent changed, or the
// handover of an Agent's installation made or changed.
func wakeOn(mgr manager.Manager, waker *hostapi.Waker) error {
	ctx := context.Background()
	agents, err := mgr.GetCache().GetInformer(ctx, &v1beta1.Agent{})
	if err != nil {
		return fmt.Errorf("the Agents' informer, to wake held heartbeats: %w", err)
	}
	if _, err := agents.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, o any) {
		if a, ok := o.(*v1beta1.Agent); ok {
			waker.Wake(string(a.UID))
		}
	}}); err != nil {
		return err
	}
	handovers, err := mgr.GetCache().GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		return fmt.Errorf("the handovers' informer, to wake held heartbeats: %w", err)
	}
	wake := func(o any) {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			if uid, ok := handover.AgentUID(cm); ok {
				waker.Wake(uid)
			}
		}
	}
	_, err = handovers.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, o any) { wake(o) }})
	return err
}

type server struct {
	cfg     Config
	handler http.Handler
	waker   *hostapi.Waker
}

// NeedLeaderElection is false: every replica serves the agent API.
func (s *server) NeedLeaderElection() bool { return false }

func (s *server) Start(ctx context.Context) error {
	cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("agent API TLS certificate: %w", err)
	}
	l, err := s.cfg.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("agent API: listen %s: %w", s.cfg.Addr, err)
	}
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          stdlog.New(logWriter{s.cfg.Log.V(1)}, "", 0),
	}
	// Held heartbeats are answered when the replica stops, not cut: their
	// hosts come back (to another replica) after the rest of their poll.
	srv.RegisterOnShutdown(s.waker.Shutdown)
	s.cfg.Log.Info("agent API listening", "addr", l.Addr().String())
	return serve.Run(ctx, 10*time.Second, serve.HTTP("agent API", srv, tls.NewListener(l, srv.TLSConfig)))
}

type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
