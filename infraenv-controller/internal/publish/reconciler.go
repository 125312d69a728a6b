// Package publish is the InfraEnv controller's reconcile loop.
package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/nmstate"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/internal/signing"
)

// Reasons of ImageCreated beyond assisted-service's two.
const (
	// ImageDownloadingReason: the OS image is still being downloaded.
	ImageDownloadingReason = "ImageDownloading"
	// AgentBinaryMissingReason: agentboot has no agent binary for the
	// InfraEnv's architecture; its hosts could boot but not register.
	AgentBinaryMissingReason = "AgentBinaryMissing"
)

// Polling intervals, for what the controller cannot watch.
const (
	// Pull secrets are read, not watched: watching would need permission to
	// list every Secret in the cluster.
	defaultPullSecretRecheck = 30 * time.Second
	// A safety net next to the catalog's notifications.
	imageRecheck = time.Minute
	keyRecheck   = 2 * time.Second
)

// Reconciler publishes an InfraEnv's discovery image.
type Reconciler struct {
	Client   client.Client
	Secrets  client.Reader // uncached: pull secrets are read one by one
	Events   events.EventRecorder
	Catalog  *osimage.Catalog
	Keys     *signing.Keeper
	Settings discovery.Settings
	// PullSecretRecheck is how often a failing pull secret is read again.
	PullSecretRecheck time.Duration
}

// SetupWithManager watches InfraEnvs, the NMStateConfigs they select, the
// catalog and the signing key.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	images := make(chan event.TypedGenericEvent[struct{}], 16)
	go forward(r.Catalog.Subscribe(), images)
	keys := make(chan event.TypedGenericEvent[struct{}], 1)
	go forward(r.Keys.Changes(), keys)
	all := handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ struct{}) []reconcile.Request {
		return r.allInfraEnvs(ctx, "")
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("infraenv").
		For(&v1beta1.InfraEnv{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, rotated{}))).
		Watches(&v1beta1.NMStateConfig{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.allInfraEnvs(ctx, o.GetNamespace())
		})).
		WatchesRawSource(source.TypedChannel(images, all)).
		WatchesRawSource(source.TypedChannel(keys, all)).
		Complete(r)
}

// forward turns a notification channel into controller events.
func forward[T any](in <-chan T, out chan<- event.TypedGenericEvent[struct{}]) {
	for range in {
		out <- event.TypedGenericEvent[struct{}]{}
	}
}

func (r *Reconciler) allInfraEnvs(ctx context.Context, namespace string) []reconcile.Request {
	var list v1beta1.InfraEnvList
	if err := r.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		log.FromContext(ctx).Error(err, "list InfraEnvs")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, ie := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ie)})
	}
	return reqs
}

// Reconcile observes, renders, and patches the status once.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ie v1beta1.InfraEnv
	if err := r.Client.Get(ctx, req.NamespacedName, &ie); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !ie.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	key, err := r.Keys.Key()
	if err != nil {
		return reconcile.Result{RequeueAfter: keyRecheck}, nil
	}
	obs, err := r.observe(ctx, &ie, key)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.patchStatus(ctx, &ie, obs); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: obs.recheck}, nil
}

// observation is what one pass found out.
type observation struct {
	ok      bool
	reason  string
	message string
	output  *discovery.Output
	recheck time.Duration
}

func failed(reason string, recheck time.Duration, format string, args ...any) observation {
	return observation{reason: reason, message: fmt.Sprintf(format, args...), recheck: recheck}
}

func (r *Reconciler) observe(ctx context.Context, ie *v1beta1.InfraEnv, key signing.Key) (observation, error) {
	if msg := r.checkPullSecret(ctx, ie); msg != "" {
		recheck := r.PullSecretRecheck
		if recheck == 0 {
			recheck = defaultPullSecretRecheck
		}
		return failed(v1beta1.ImageCreationErrorReason, recheck, "%s", msg), nil
	}
	img, imgKey, obs := r.image(ie)
	if img == nil {
		return obs, nil
	}
	nm, err := nmstate.Select(ctx, r.Client, ie)
	if err != nil {
		return observation{}, err
	}
	out, err := discovery.Render(discovery.Input{InfraEnv: ie, NMStateConfigs: nm, Image: img, ImageKey: imgKey, Key: key}, r.Settings)
	var inputErr *discovery.InputError
	var noAgent *discovery.NoAgentError
	switch {
	case errors.As(err, &noAgent):
		return failed(AgentBinaryMissingReason, 0, "%s", noAgent.Error()), nil
	case errors.As(err, &inputErr):
		return failed(v1beta1.ImageCreationErrorReason, 0, "%s", inputErr.Error()), nil
	case err != nil:
		return observation{}, fmt.Errorf("render discovery image: %w", err)
	}
	if out.ImageType == v1beta1.ImageTypeMinimalISO {
		_, err, ready := img.MinimalIfReady()
		switch {
		case !ready:
			return failed(ImageDownloadingReason, imageRecheck, "preparing the minimal ISO of OS image %s", imgKey), nil
		case err != nil:
			return failed(v1beta1.ImageCreationErrorReason, imageRecheck, "minimal ISO: %v", err), nil
		}
	}
	return observation{ok: true, reason: v1beta1.ImageCreatedReason, message: createdMessage(out.Notes), output: out}, nil
}

// maxNotes is how many of an image's notes the condition spells out: one
// per NMStateConfig could be hundreds, and the message is also an event's
// note.
const maxNotes = 3

// createdMessage is ImageCreated's message for an image made with notes,
// seen in the condition and, when it changes, as an event.
func createdMessage(notes []string) string {
	msg := "Image has been created"
	if len(notes) == 0 {
		return msg
	}
	shown := notes[:min(len(notes), maxNotes)]
	msg += "; " + strings.Join(shown, "; ")
	if more := len(notes) - len(shown); more > 0 {
		msg += fmt.Sprintf("; and %d more like them", more)
	}
	return msg
}

// checkPullSecret returns why the pull secret is unusable, or "".
func (r *Reconciler) checkPullSecret(ctx context.Context, ie *v1beta1.InfraEnv) string {
	ref := ie.Spec.PullSecretRef
	if ref == nil || ref.Name == "" {
		return "spec.pullSecretRef is required"
	}
	var s corev1.Secret
	err := r.Secrets.Get(ctx, client.ObjectKey{Namespace: ie.Namespace, Name: ref.Name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("pull secret %s/%s not found", ie.Namespace, ref.Name)
	case err != nil:
		return fmt.Sprintf("pull secret %s/%s: %v", ie.Namespace, ref.Name, err)
	case s.Type != corev1.SecretTypeDockerConfigJson:
		return fmt.Sprintf("pull secret %s/%s has type %q, want %s", ie.Namespace, ref.Name, s.Type, corev1.SecretTypeDockerConfigJson)
	}
	var parsed struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &parsed); err != nil || len(parsed.Auths) == 0 {
		return fmt.Sprintf("pull secret %s/%s: key %s is not a docker config with auths", ie.Namespace, ref.Name, corev1.DockerConfigJsonKey)
	}
	return ""
}

// image returns the ready OS image, or the observation explaining why there
// is none yet.
func (r *Reconciler) image(ie *v1beta1.InfraEnv) (*osimage.Image, osimage.Key, observation) {
	k, err := r.Catalog.Resolve(ie.Spec.CPUArchitecture, ie.Spec.OSImageVersion)
	if err != nil {
		return nil, k, failed(v1beta1.ImageCreationErrorReason, imageRecheck, "%v", err)
	}
	st := r.Catalog.Status(k)
	switch st.State {
	case osimage.Ready:
		return st.Image, k, observation{}
	case osimage.Failed:
		return nil, k, failed(v1beta1.ImageCreationErrorReason, imageRecheck, "OS image %s: %v (retrying)", k, st.Err)
	default:
		progress := st.Progress
		if progress == "" {
			progress = "queued"
		}
		return nil, k, failed(ImageDownloadingReason, imageRecheck, "downloading OS image %s: %s", k, progress)
	}
}

// patchStatus derives the status from the observation and writes it when it
// differs from what is stored.
func (r *Reconciler) patchStatus(ctx context.Context, ie *v1beta1.InfraEnv, obs observation) error {
	now := metav1.Now()
	st := ie.Status.DeepCopy()
	st.AgentLabelSelector = metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}}
	if obs.ok {
		u := obs.output.URLs
		if st.ISODownloadURL != u.ISO || st.CreatedTime == nil {
			st.CreatedTime = &now
		}
		st.ISODownloadURL = u.ISO
		st.BootArtifacts = v1beta1.BootArtifacts{KernelURL: u.Kernel, InitrdURL: u.Initrd, RootfsURL: u.Rootfs, IpxeScriptURL: u.IPXE, DiscoveryIgnitionURL: u.Ignition}
	} else {
		// URLs of content that cannot be built would only answer errors.
		st.ISODownloadURL = ""
		st.BootArtifacts = v1beta1.BootArtifacts{}
	}
	before := conditions.Find(ie.Status.Conditions, v1beta1.ImageCreatedCondition)
	st.Conditions = conditions.Set(st.Conditions, conditions.New(v1beta1.ImageCreatedCondition, obs.ok, obs.reason, obs.message), now)
	if equality.Semantic.DeepEqual(st, &ie.Status) {
		return nil
	}
	patch := client.MergeFrom(ie.DeepCopy())
	ie.Status = *st
	if err := r.Client.Status().Patch(ctx, ie, patch); err != nil {
		return fmt.Errorf("patch InfraEnv status: %w", err)
	}
	r.recordTransition(ie, before, obs)
	return nil
}

func (r *Reconciler) recordTransition(ie *v1beta1.InfraEnv, before *v1beta1.Condition, obs observation) {
	if before != nil && before.Reason == obs.reason && before.Message == obs.message {
		return
	}
	if obs.ok {
		r.Events.Eventf(ie, nil, corev1.EventTypeNormal, v1beta1.ImageCreatedReason, "PublishImage", "discovery image %s published", obs.output.Version)
		return
	}
	eventType := corev1.EventTypeWarning
	if obs.reason == ImageDownloadingReason {
		eventType = corev1.EventTypeNormal
	}
	r.Events.Eventf(ie, nil, eventType, obs.reason, "PublishImage", "%s", obs.message)
}

// rotated lets through an InfraEnv whose registration token was rotated.
type rotated struct{ predicate.Funcs }

func (rotated) Update(e event.UpdateEvent) bool {
	return e.ObjectOld.GetAnnotations()[signing.RotateAnnotation] != e.ObjectNew.GetAnnotations()[signing.RotateAnnotation]
}
