package bmc

import (
	"net/netip"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/agentboot/agentboot/bmc/internal/baremetalhost"
	"github.com/agentboot/agentboot/bmc/internal/driver"
	"github.com/agentboot/agentboot/internal/eventnote"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/signing"
)

// Config tunes the BareMetalHost controller; zero values are the
// documented defaults (docs/bmc.md).
type Config struct {
	// MaxConcurrent bounds the BMCs talked to at once (8).
	MaxConcurrent int
	// CallTimeout bounds each power or boot call (30s); MediaTimeout each
	// virtual media call (2m).
	CallTimeout, MediaTimeout time.Duration
	// PowerPoll is the longest interval between reads of a pending power
	// change (5s; the first reads come sooner), and PowerTimeout how long
	// a BMC may take to report a state it accepted before the request is
	// sent again (1m).
	PowerPoll, PowerTimeout time.Duration
	// SoftPowerOffTimeout is how long the OS gets to shut down after a
	// graceful shutdown request before the power is cut (3m).
	SoftPowerOffTimeout time.Duration
	// EjectOnDeleteTimeout is how long a deleted host's virtual media
	// eject is retried before the host is let go with a warning (10m).
	EjectOnDeleteTimeout time.Duration
	// Resync re-reads every host's credentials and power state this often
	// (1m, as Ironic syncs power state).
	Resync time.Duration
	// BackoffBase and BackoffCap shape retries after errors (5s, 3m).
	BackoffBase, BackoffCap time.Duration
	// IPMITool is the ipmitool binary (ipmitool on PATH).
	IPMITool string
	// Keys sign the boot proofs in the ISOs inserted through BMCs (the
	// manager's; set by the caller).
	Keys signing.Source
	// Networks, when set, are the only networks BMC addresses may be in.
	Networks []netip.Prefix
	// Clock measures the power and media windows (the real clock; tests
	// may give one they step).
	Clock clock.PassiveClock
	// Passes, when set, is told of each finished reconcile pass of a host
	// and what it returned: tests wait on passes instead of sleeping.
	Passes observe.Hook
}

// SetupWithManager adds the BareMetalHost controller to mgr (it runs on
// the leader).
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	return (&baremetalhost.Reconciler{
		Client:  mgr.GetClient(),
		Secrets: mgr.GetAPIReader(),
		Events:  eventnote.Recorder(mgr.GetEventRecorder("agentboot-baremetalhost-controller")),
		Driver: driver.Options{
			CallTimeout:  cfg.CallTimeout,
			MediaTimeout: cfg.MediaTimeout,
			IPMITool:     cfg.IPMITool,
		},
		MaxConcurrent:        cfg.MaxConcurrent,
		PowerPoll:            cfg.PowerPoll,
		PowerTimeout:         cfg.PowerTimeout,
		SoftPowerOffTimeout:  cfg.SoftPowerOffTimeout,
		EjectOnDeleteTimeout: cfg.EjectOnDeleteTimeout,
		Resync:               cfg.Resync,
		BackoffBase:          cfg.BackoffBase,
		BackoffCap:           cfg.BackoffCap,
		Keys:                 cfg.Keys,
		Networks:             cfg.Networks,
		Clock:                cfg.Clock,
		Passes:               cfg.Passes,
	}).SetupWithManager(mgr)
}
