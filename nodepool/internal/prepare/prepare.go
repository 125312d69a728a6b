// Package prepare hands the agent API the installation of every bound
// Agent agentboot installs, sealed (package handover): the agent API runs
// under a ServiceAccount that may read no Secret, and the pointer Ignition
// holds the hosted cluster's join token. The manager resolves the binding
// (package binding), reads the token and CA Secrets and the OS disk image
// from its catalog, and writes the handover; it reads them all again every
// Refresh while the host has not started installing, so that a token
// HyperShift rotated reaches the host, and removes the handover once the
// host started installing or is no longer bound.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentrecord"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/internal/signing"
)

// Catalog is what the preparation needs of the OS image catalog.
type Catalog interface {
	Resolve(arch, version string) (osimage.Key, error)
	DiskStatus(k osimage.Key) osimage.Status
}

// AgentIndex is the cache index of handover ConfigMaps by the Agent
// (namespace/name) they are for.
const AgentIndex = "agentboot.handoverAgent"

// Reconciler prepares the handovers.
type Reconciler struct {
	// Client reads Agents, InfraEnvs and the handovers (cached) and writes
	// the handovers.
	Client client.Client
	// APIReader reads the Secrets, uncached.
	APIReader client.Reader
	// Bindings reads what a binding rests on (package binding): the
	// manager's informer cache. Its resolution only prepares: the agent API
	// resolves the binding afresh before it hands the installation out,
	// and opens only a handover made from that same binding. Nil:
	// APIReader (SetupWithManager).
	Bindings client.Reader
	Catalog  Catalog
	Settings discovery.Settings
	Keys     signing.Source
	// Sanitization is the erase policy by InfraEnv.
	Sanitization sanitize.Policy
	// Namespace is agentboot's own, where handovers live.
	Namespace string
	// Refresh is how often a handover is made again from what it is made
	// of (30s); Downloading how often while the OS disk image downloads
	// (5s).
	Refresh, Downloading time.Duration
	Now                  func() time.Time
	Log                  logr.Logger
}

// SetupWithManager follows bound Agents and their handovers.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Refresh <= 0 {
		r.Refresh = 30 * time.Second
	}
	if r.Downloading <= 0 {
		r.Downloading = 5 * time.Second
	}
	if r.Bindings == nil {
		r.Bindings = r.APIReader
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.ConfigMap{}, AgentIndex, agentrecord.IndexBy(handover.Label)); err != nil {
		return err
	}
	// Bound Agents, and those that just stopped being bound (their
	// handover goes).
	bound := predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return lifecycle.Bound(e.Object.(*v1beta1.Agent)) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return lifecycle.Bound(e.ObjectOld.(*v1beta1.Agent)) || lifecycle.Bound(e.ObjectNew.(*v1beta1.Agent))
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	return agentrecord.Watch(ctrl.NewControllerManagedBy(mgr).
		Named("nodepool-handover").
		For(&v1beta1.Agent{}, builder.WithPredicates(bound)), r.Namespace, handover.Label).
		Complete(r)
}

// Reconcile makes the handover of one Agent current, or removes it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// A bound on the whole pass: one request the apiserver never answers
	// would otherwise hold the controller's worker, and every host's
	// handover, for good (seen in tests under load).
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a := &v1beta1.Agent{}
	if err := r.Client.Get(ctx, req.NamespacedName, a); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		a = nil
	}
	// For an Agent gone, recreated (another UID), installing or no longer
	// bound: nothing to hand over.
	var want *corev1.ConfigMap
	var after time.Duration
	var failed error
	switch {
	case a == nil:
	case a.DeletionTimestamp.IsZero() && lifecycle.Bound(a) && !lifecycle.Started(a):
		// On an error the handover goes (want stays nil) rather than
		// stay as it was: what cannot be checked now is not handed out.
		want, after, failed = r.prepare(ctx, a)
	case lifecycle.Bound(a):
		// Installing, or being deleted: nothing to hand over, but looked
		// at again, so that a handover is never missing for long for a
		// bound host that needs one.
		after = r.Refresh
	}
	if want == nil {
		var have corev1.ConfigMapList
		if err := r.Client.List(ctx, &have, client.InNamespace(r.Namespace), client.MatchingFields{AgentIndex: req.Namespace + "/" + req.Name}); err == nil && len(have.Items) > 0 {
			why := "the Agent is gone"
			switch {
			case failed != nil:
				why = "it could not be prepared: " + failed.Error()
			case a != nil && !lifecycle.Bound(a):
				why = "the Agent is not bound"
			case a != nil && lifecycle.Started(a):
				why = "the host started installing"
			case a != nil:
				why = "the Agent is being deleted"
			}
			r.Log.Info("handover withdrawn", "agent", req.String(), "why", why)
		}
	}
	now := r.now()
	again, err := agentrecord.Sync(ctx, r.Client, r.APIReader, r.Namespace, AgentIndex, req.Namespace+"/"+req.Name, want, func(have, want *corev1.ConfigMap) bool {
		return handover.Same(have, want, now)
	})
	switch {
	case failed != nil:
		return ctrl.Result{}, failed
	case again:
		return ctrl.Result{Requeue: true}, err
	}
	// A tenth of jitter: refreshes of Agents bound together spread out.
	return ctrl.Result{RequeueAfter: after + time.Duration(rand.Int64N(int64(after/10)+1))}, err
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// prepare builds the handover of a bound Agent, and says when to look
// again. An error is the apiserver's or the key's (retried); everything
// that is the binding's, the InfraEnv's or the image's is a waiting
// handover the agent API shows on the Agent.
func (r *Reconciler) prepare(ctx context.Context, a *v1beta1.Agent) (*corev1.ConfigMap, time.Duration, error) {
	// The OS image of the InfraEnv the host registered through.
	rec := lifecycle.Registration(a)
	ie := &v1beta1.InfraEnv{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: rec.InfraEnv}, ie)
	wait := func(err error, again time.Duration) (*corev1.ConfigMap, time.Duration, error) {
		reason := "InstallationWaiting"
		var e interface{ EventReason() string }
		if errors.As(err, &e) {
			reason = e.EventReason()
		}
		return handover.Waiting(r.Namespace, a, ie, err.Error(), reason), again, nil
	}
	switch {
	case rec.InfraEnv == "" || apierrors.IsNotFound(err) || (err == nil && string(ie.UID) != rec.InfraEnvUID):
		ie = &v1beta1.InfraEnv{}
		return wait(fmt.Errorf("the InfraEnv the host registered through (%q) is gone: nothing says which OS image to install", rec.InfraEnv), r.Refresh)
	case err != nil:
		return nil, 0, err
	}
	key, err := r.Keys.Key()
	if err != nil {
		return nil, 0, err
	}
	b, err := binding.Resolve(ctx, r.Bindings, a)
	if binding.IsRefused(err) && r.Bindings != r.APIReader {
		// The cache may not have what the provider wrote a moment ago
		// (an AgentMachine's agentRef): a refusal is shown only once the
		// apiserver says it too. Only refused Agents cost these reads.
		b, err = binding.Resolve(ctx, r.APIReader, a)
	}
	if err != nil {
		if binding.IsRefused(err) {
			return wait(err, r.Refresh)
		}
		return nil, 0, err
	}
	k, err := r.Catalog.Resolve(ie.Spec.CPUArchitecture, ie.Spec.OSImageVersion)
	if err != nil {
		return wait(fmt.Errorf("OS image of InfraEnv %s: %w", ie.Name, err), r.Refresh)
	}
	st := r.Catalog.DiskStatus(k)
	switch {
	case st.State == osimage.Ready:
	case st.Err != nil:
		return wait(fmt.Errorf("OS disk image of %s: %w", k, st.Err), r.Refresh)
	default:
		return wait(fmt.Errorf("waiting for the OS disk image of %s to download %s", k, st.Progress), r.Downloading)
	}
	ign, err := PointerIgnition(ctx, r.APIReader, a, b)
	if err != nil {
		if binding.IsRefused(err) {
			return wait(err, r.Refresh)
		}
		return nil, 0, err
	}
	cm, err := handover.Sealed(key, r.Namespace, a, ie, b.Digest(), handover.Install{Ignition: ign, ImageURL: discovery.DiskImageURL(r.Settings, k), ImageSHA256: st.Image.SHA256,
		OnRelease: string(r.Sanitization.For(ie.Namespace, ie.Name))}, r.now())
	return cm, r.Refresh, err
}
