// Package app wires agentboot's components into one controller-runtime
// manager. The agentboot command and the integration tests both use it, so
// tests run exactly what ships.
package app

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	agentservice "github.com/agentboot/agentboot/agent-service"
	"github.com/agentboot/agentboot/agentclassification"
	"github.com/agentboot/agentboot/bmc"
	imageservice "github.com/agentboot/agentboot/image-service"
	infraenvcontroller "github.com/agentboot/agentboot/infraenv-controller"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/eventnote"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/internal/scheme"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/nodepool"
)

// ManagerOptions are the process-level settings of a manager.
type ManagerOptions struct {
	// Namespace holds agentboot's own objects: signing key, leader lease.
	Namespace     string
	LeaderElect   bool
	MetricsAddr   string
	MetricsSecure bool
	ProbeAddr     string
	// SkipControllerNameValidation lets several managers share a process
	// (tests).
	SkipControllerNameValidation bool
}

// NewManager builds the controller-runtime manager with probes, metrics and
// leader election; components add themselves to it.
func NewManager(cfg *rest.Config, o ManagerOptions, log logr.Logger) (manager.Manager, error) {
	s, err := scheme.New()
	if err != nil {
		return nil, err
	}
	metrics := metricsserver.Options{BindAddress: o.MetricsAddr, SecureServing: o.MetricsSecure}
	if o.MetricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	if cfg.QPS == 0 {
		// As controller-runtime's own config loader does: no client-side
		// rate limit, the apiserver's priority and fairness decides. The
		// client-go default of 5 requests a second would throttle hosts
		// registering by the hundred.
		cfg = rest.CopyConfig(cfg)
		cfg.QPS = -1
	}
	grace := 20 * time.Second
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s,
		// Secrets are never cached (they are read one by one, by name);
		// Agents' liveness Leases and the ConfigMaps of erase debts and
		// installation handovers live in agentboot's namespace, and only
		// those are cached.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{o.Namespace: {}}},
			&corev1.ConfigMap{}:     {Namespaces: map[string]cache.Config{o.Namespace: {}}},
		}},
		Client:                        client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Logger:                        log,
		Metrics:                       metrics,
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              "agentboot-manager",
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &grace,
		Controller:                    config.Controller{SkipNameValidation: &o.SkipControllerNameValidation},
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// Components says what one process runs.
type Components struct {
	// Namespace holds the signing key.
	Namespace string
	Catalog   *osimage.Catalog
	Settings  discovery.Settings
	// Controllers runs the controllers (and creates the signing key).
	Controllers bool
	// AgentAPIKeysDir is where the kubelet mounts the agent API's keys
	// (signing.AgentAPISecretName), for an agent API running without the
	// controllers: it reads no Secret from the apiserver.
	AgentAPIKeysDir string
	// ImageService, when set, runs the image service; Catalog, Keys,
	// Settings and Log are filled in here.
	ImageService *imageservice.Config
	// AgentService, when set, serves the agent API (every replica) unless
	// its Addr is empty; with Controllers it also configures the Agent
	// controller. Keys, Namespace and Log are filled in here.
	AgentService *agentservice.Config
	// InfraEnvPullSecretRecheck overrides how often a failing pull secret is
	// read again (tests).
	InfraEnvPullSecretRecheck time.Duration
	// BMC tunes the BareMetalHost controller (with Controllers).
	BMC bmc.Config
	// NodePool tunes the installation of bound Agents (with Controllers).
	NodePool nodepool.Config
	// AgentClassifications runs the AgentClassification controllers (with
	// Controllers); off by default (docs/agents.md).
	AgentClassifications bool
	// ClassificationMatcher runs their queries (default: in this process,
	// bounded in time only; the manager's commands give a Sandbox).
	ClassificationMatcher agentclassification.Matcher
	// BootStallAfter is how long a boot may make no progress before its
	// host's BareMetalHost and Agent get a BootStalled event (10 min).
	BootStallAfter time.Duration
}

// Add adds the catalog, the signing key and the chosen components to mgr.
func Add(mgr manager.Manager, c Components, log logr.Logger) error {
	keys := &signing.Keeper{Reader: mgr.GetAPIReader(), Namespace: c.Namespace, Log: log.WithName("signing")}
	switch {
	case c.Controllers:
		keys.Writer = mgr.GetClient()
	case c.AgentService != nil:
		// An agent API on its own reads only its keys, from files.
		if c.AgentAPIKeysDir == "" {
			return errors.New("agent API: the directory its keys are mounted in is required")
		}
		keys.Dir = c.AgentAPIKeysDir
	default:
		// An image service on its own reads only its keys.
		keys.ImageService = true
	}
	if c.Catalog != nil {
		// An agent API on its own has none: the manager resolves images.
		if err := mgr.Add(c.Catalog); err != nil {
			return err
		}
	}
	if err := mgr.Add(keys); err != nil {
		return err
	}
	// Not ready without its keys: a process that cannot check a token
	// must not be sent requests.
	if err := mgr.AddReadyzCheck("keys", func(*http.Request) error {
		_, err := keys.Key()
		return err
	}); err != nil {
		return err
	}
	var agentCfg agentservice.Config
	if c.AgentService != nil {
		agentCfg = *c.AgentService
	}
	// It never holds the image key, even in one process with the rest.
	agentCfg.Keys = signing.Restricted{Source: keys, Purposes: signing.AgentAPIPurposes}
	agentCfg.Namespace, agentCfg.Log = c.Namespace, log.WithName("agent-api")
	if c.Controllers {
		if err := infraenvcontroller.SetupWithManager(mgr, infraenvcontroller.Config{
			Catalog: c.Catalog, Keys: keys, Settings: c.Settings, Log: log.WithName("infraenv"),
			PullSecretRecheck: c.InfraEnvPullSecretRecheck,
		}); err != nil {
			return err
		}
		bmcCfg := c.BMC
		bmcCfg.Keys = keys
		if err := bmc.SetupWithManager(mgr, bmcCfg); err != nil {
			return err
		}
		// Hosts cluster-api-provider-agent bound install the catalog's
		// disk image with their cluster's day-2 pointer Ignition, handed
		// over to the agent API sealed.
		npCfg := c.NodePool
		npCfg.Catalog, npCfg.Settings, npCfg.Keys, npCfg.Namespace = c.Catalog, c.Settings, keys, c.Namespace
		npCfg.Log = log.WithName("nodepool")
		if err := nodepool.SetupWithManager(mgr, npCfg); err != nil {
			return err
		}
		// A host stalled on its boot path is told of where people look.
		if err := (&boottrace.Stalls{Client: mgr.GetClient(), Events: eventnote.Recorder(mgr.GetEventRecorder("agentboot-boot-trace")),
			After: c.BootStallAfter, Home: c.Namespace}).SetupWithManager(mgr); err != nil {
			return err
		}
		// AgentClassifications label Agents by their inventory.
		if c.AgentClassifications {
			if err := agentclassification.SetupWithManager(mgr, agentclassification.Config{Log: log.WithName("agentclassification"), Matcher: c.ClassificationMatcher}); err != nil {
				return err
			}
		}
		// The pool, counted for Prometheus by the elected manager.
		if err := mgr.Add(poolmetrics.Runnable{Collector: &poolmetrics.Collector{Reader: mgr.GetClient(), Log: log.WithName("poolmetrics")}}); err != nil {
			return err
		}
	}
	agentCfg.Controller = c.Controllers
	switch {
	case c.AgentService == nil:
		agentCfg.Addr = ""
	case agentCfg.Addr == "" && !c.Controllers:
		return errors.New("agent service: an address to serve the agent API on is required")
	}
	if c.Controllers || c.AgentService != nil {
		if err := agentservice.SetupWithManager(mgr, agentCfg); err != nil {
			return err
		}
	}
	if c.ImageService != nil {
		cfg := *c.ImageService
		// It never holds the agent keys, even in one process with the rest.
		cfg.Catalog, cfg.Keys, cfg.Settings = c.Catalog, signing.Restricted{Source: keys, Purposes: signing.ImageServicePurposes}, c.Settings
		cfg.Log, cfg.Namespace = log.WithName("image-service"), c.Namespace
		svc, err := imageservice.New(cfg)
		if err != nil {
			return err
		}
		if err := svc.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	return nil
}
