package infraenvcontroller

import (
	"errors"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/agentboot/agentboot/infraenv-controller/internal/publish"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/eventnote"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
)

// Config is what the InfraEnv controller needs.
type Config struct {
	Catalog  *osimage.Catalog
	Keys     *signing.Keeper
	Settings discovery.Settings
	Log      logr.Logger
	// PullSecretRecheck is how often a failing pull secret is read again
	// (pull secrets are read, not watched); zero means 30 seconds.
	PullSecretRecheck time.Duration
}

// SetupWithManager adds the controller to mgr.
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	if cfg.Catalog == nil || cfg.Keys == nil {
		return errors.New("infraenv-controller: Catalog and Keys are required")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return err
	}
	return (&publish.Reconciler{
		Client:   mgr.GetClient(),
		Secrets:  mgr.GetAPIReader(),
		Events:   eventnote.Recorder(mgr.GetEventRecorder("agentboot-infraenv-controller")),
		Catalog:  cfg.Catalog,
		Keys:     cfg.Keys,
		Settings: cfg.Settings,

		PullSecretRecheck: cfg.PullSecretRecheck,
	}).SetupWithManager(mgr)
}
