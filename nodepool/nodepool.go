package nodepool

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"

	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/eventnote"
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
	// Poll is how often a hosted cluster is looked at for a joining host
	// (10s).
	Poll time.Duration
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
	Log          logr.Logger
}

// SetupWithManager adds the worker controller, which follows bound hosts
// into their hosted clusters, and, when HyperShift's NodePool kind exists,
// the controller that explains NodePool shortfalls (restart the manager
// after installing HyperShift).
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	if cfg.Off {
		cfg.Log.Info("installing bound Agents is off (--nodepools=false)")
		return nil
	}
	if err := (&worker.Reconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		Events:        eventnote.Recorder(mgr.GetEventRecorder("agentboot-nodepool-worker")),
		Timeouts:      cfg.Timeouts,
		Poll:          cfg.Poll,
		NoCSRApproval: cfg.NoCSRApproval,
		BehindNAT:     cfg.AgentAPIBehindNAT,
		ClockSkew:     cfg.CSRClockSkew,
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
