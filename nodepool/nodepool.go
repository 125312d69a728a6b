package nodepool

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/eventnote"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/nodepool/internal/prepare"
	"github.com/agentboot/agentboot/nodepool/internal/shortfall"
	"github.com/agentboot/agentboot/nodepool/internal/worker"
)

// Timeouts bound the waits of a bound host's installation and release.
type Timeouts = worker.Timeouts

// Config tunes the installation of bound Agents.
type Config struct {
	// Off hands out no installations and follows no bound host, for a
	// manager that must leave Agents alone (another service installs them).
	Off bool
	// RetryAfter is how often a NodePool whose machines wait for Agents is
	// explained again (30s).
	RetryAfter time.Duration
	// Timeouts bound each wait of a bound host's installation; zero values
	// take the defaults (install 20m without a report, join 30m, Ready
	// 20m).
	Timeouts Timeouts
	// Poll is how often a hosted cluster is looked at for a bound host
	// that cannot be followed yet (10s); JoinPoll how often for a host that
	// rebooted into its installation, until its Node is Ready (2s, at
	// most Poll).
	Poll, JoinPoll time.Duration
	// NoCSRApproval leaves kubelet CSRs to a person (each is named in an
	// event) instead of approving those that pass the checks.
	NoCSRApproval bool
	// AgentAPIBehindNAT says hosts' source addresses do not reach the
	// agent API (a proxy or SNAT in front of it): serving CSRs are then
	// checked against the addresses hosts report, since none were seen.
	AgentAPIBehindNAT bool
	// CSRClockSkew is how much older than its AgentMachine a kubelet CSR
	// may be and still be approved (zero means 10s): the two clusters'
	// apiservers stamp them with their own clocks.
	CSRClockSkew time.Duration
	// HandoverRefresh is how often the installation handed over to the
	// agent API for a bound host that has not started installing is made
	// again from the binding and its Secrets (30s): a join token HyperShift
	// rotates reaches the host within it.
	HandoverRefresh time.Duration
	// Catalog, Settings, Keys and Namespace are the manager's (filled in
	// by the wiring): the OS disk image a host installs, and the key and
	// namespace of the handovers.
	Catalog  prepare.Catalog
	Settings discovery.Settings
	// Sanitization is what a host released from a cluster must erase
	// before it can be bound again, recorded when its installation is
	// handed out (the manager's --disk-sanitization flags).
	Sanitization sanitize.Policy
	Keys         signing.Source
	Namespace    string
	Log          logr.Logger
	// WorkerPasses, when set, is told of each finished pass of the
	// controller that follows bound hosts: tests wait on passes, not on
	// the wall clock.
	WorkerPasses observe.Hook
}

// SetupWithManager adds the worker controller, which follows bound hosts
// into their hosted clusters, and, when HyperShift's NodePool kind exists,
// the controller that explains NodePool shortfalls (restart the manager
// after installing HyperShift).
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	if cfg.Off {
		cfg.Log.Info("installing bound Agents is off (--nodepools=false)")
		// What an earlier run handed over is withdrawn: the agent API
		// installs only what a handover says.
		return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return withdrawHandovers(ctx, mgr.GetClient(), cfg)
		}))
	}
	if err := (&prepare.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Bindings: mgr.GetCache(),
		Catalog: cfg.Catalog, Settings: cfg.Settings, Keys: cfg.Keys, Namespace: cfg.Namespace, Sanitization: cfg.Sanitization,
		Refresh: cfg.HandoverRefresh, Log: cfg.Log.WithName("handover"),
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&worker.Reconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		Bindings:      mgr.GetCache(),
		Events:        eventnote.Recorder(mgr.GetEventRecorder("agentboot-nodepool-worker")),
		Timeouts:      cfg.Timeouts,
		Poll:          cfg.Poll,
		JoinPoll:      cfg.JoinPoll,
		NoCSRApproval: cfg.NoCSRApproval,
		BehindNAT:     cfg.AgentAPIBehindNAT,
		ClockSkew:     cfg.CSRClockSkew,
		Passes:        cfg.WorkerPasses,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	gk := hypershift.GroupVersion.WithKind("NodePool").GroupKind()
	if _, err := mgr.GetRESTMapper().RESTMapping(gk, hypershift.GroupVersion.Version); err != nil {
		if meta.IsNoMatchError(err) {
			cfg.Log.Info("HyperShift's NodePool kind is not installed; NodePool shortfalls are not explained until the manager restarts with it")
			return nil
		}
		return fmt.Errorf("look up the NodePool kind: %w", err)
	}
	return (&shortfall.Reconciler{
		Client:     mgr.GetClient(),
		APIReader:  mgr.GetAPIReader(),
		Events:     eventnote.Recorder(mgr.GetEventRecorder("agentboot-nodepool")),
		RetryAfter: cfg.RetryAfter,
	}).SetupWithManager(mgr)
}

// withdrawHandovers deletes every installation handed over to the agent
// API, once, for a manager that installs nothing.
func withdrawHandovers(ctx context.Context, c client.Client, cfg Config) error {
	// One by one: the manager may delete ConfigMaps there, not a
	// collection of them.
	err := retry.OnError(wait.Backoff{Duration: time.Second, Factor: 2, Steps: 8, Cap: time.Minute}, func(error) bool { return ctx.Err() == nil }, func() error {
		var list corev1.ConfigMapList
		if err := c.List(ctx, &list, client.InNamespace(cfg.Namespace), client.MatchingLabels{handover.Label: "true"}); err != nil {
			return err
		}
		for i := range list.Items {
			if err := c.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		cfg.Log.Error(err, "could not withdraw the installations handed over before --nodepools=false; delete them", "namespace", cfg.Namespace, "label", handover.Label)
	}
	return nil
}
