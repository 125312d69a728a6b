package nodepool

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"

	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/nodepool/internal/binder"
	"github.com/agentboot/agentboot/nodepool/internal/worker"
)

// Timeouts bound the waits of a bound host's installation and release.
type Timeouts = worker.Timeouts

// Config tunes the NodePool binder.
type Config struct {
	// Off leaves every NodePool alone: neither the binder nor the worker
	// controller runs, as for sites where cluster-api-provider-agent
	// serves all Agent-platform NodePools.
	Off bool
	// RetryAfter is how often a NodePool that cannot be served (no
	// HostedCluster yet, too few Agents) is looked at again, besides the
	// Agent changes that wake it (30s).
	RetryAfter time.Duration
	// Timeouts bound each wait of a bound host's installation and release;
	// zero values take the defaults (install 20m without a report, join 30m,
	// Ready 20m, drain 10m).
	Timeouts Timeouts
	// Poll is how often a hosted cluster is looked at for a joining or
	// draining host (10s).
	Poll time.Duration
	Log  logr.Logger
}

// SetupWithManager adds the binder to mgr when HyperShift's NodePool kind
// exists in the cluster; without it there is nothing to bind, and the
// manager must be restarted after HyperShift is installed.
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	if cfg.Off {
		cfg.Log.Info("NodePool binding is off (--nodepools=false)")
		return nil
	}
	gk := hypershift.GroupVersion.WithKind("NodePool").GroupKind()
	if _, err := mgr.GetRESTMapper().RESTMapping(gk, hypershift.GroupVersion.Version); err != nil {
		if meta.IsNoMatchError(err) {
			cfg.Log.Info("HyperShift's NodePool kind is not installed; the NodePool binder is off until the manager restarts with it")
			return nil
		}
		return fmt.Errorf("look up the NodePool kind: %w", err)
	}
	if err := (&binder.Reconciler{
		Client:     mgr.GetClient(),
		APIReader:  mgr.GetAPIReader(),
		Events:     mgr.GetEventRecorder("agentboot-nodepool-binder"),
		RetryAfter: cfg.RetryAfter,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&worker.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Events:    mgr.GetEventRecorder("agentboot-nodepool-worker"),
		Timeouts:  cfg.Timeouts,
		Poll:      cfg.Poll,
	}).SetupWithManager(mgr)
}
