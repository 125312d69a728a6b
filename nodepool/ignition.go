package nodepool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/nodepool/internal/binder"
)

// UserDataAnnotation on HyperShift's user-data Secrets names their NodePool
// as <namespace>/<name>.
const UserDataAnnotation = "hypershift.openshift.io/nodePool"

// Ignition returns, for an Agent the binder bound, how to fetch the pointer
// Ignition config HyperShift keeps for its NodePool: the newest Secret named
// user-data-<nodepool>-<hash> in the control-plane namespace annotated with
// the NodePool, key "value". Agents bound by anyone else are not ours
// (ours false), which it tells without reading anything. Secrets are listed
// uncached, by their metadata only, and the one chosen is read.
func Ignition(r client.Reader) func(a *v1beta1.Agent) (func(ctx context.Context) (string, error), bool) {
	return func(a *v1beta1.Agent) (func(ctx context.Context) (string, error), bool) {
		name, ns := a.Labels[binder.NodePoolLabel], a.Labels[binder.NodePoolNamespaceLabel]
		cd := a.Spec.ClusterDeploymentName
		if name == "" || cd == nil {
			return nil, false
		}
		return func(ctx context.Context) (string, error) { return userData(ctx, r, cd.Namespace, ns, name) }, true
	}
}

// userData reads the user-data of NodePool ns/name from the control-plane
// namespace cp.
func userData(ctx context.Context, r client.Reader, cp, ns, name string) (string, error) {
	// Metadata only: the other Secrets' data is never read.
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.List(ctx, list, client.InNamespace(cp)); err != nil {
		return "", fmt.Errorf("list the user-data Secrets of NodePool %s/%s in %s: %w", ns, name, cp, err)
	}
	var newest *metav1.PartialObjectMetadata
	for i := range list.Items {
		s := &list.Items[i]
		if s.Annotations[UserDataAnnotation] != ns+"/"+name || !strings.HasPrefix(s.Name, "user-data-"+name+"-") {
			continue
		}
		if newest == nil || s.CreationTimestamp.After(newest.CreationTimestamp.Time) ||
			s.CreationTimestamp.Equal(&newest.CreationTimestamp) && s.Name > newest.Name {
			newest = s
		}
	}
	if newest == nil {
		return "", fmt.Errorf("NodePool %s/%s has no user-data Secret in namespace %s yet (HyperShift writes user-data-%s-<hash> there, annotated %s: %s/%s)",
			ns, name, cp, name, UserDataAnnotation, ns, name)
	}
	var secret corev1.Secret
	if err := r.Get(ctx, client.ObjectKeyFromObject(newest), &secret); err != nil {
		return "", fmt.Errorf("read user-data Secret %s/%s: %w", newest.Namespace, newest.Name, err)
	}
	value := secret.Data["value"]
	var cfg struct {
		Ignition struct {
			Version string `json:"version"`
		} `json:"ignition"`
	}
	if len(value) == 0 {
		return "", fmt.Errorf("user-data Secret %s/%s has no key \"value\"", newest.Namespace, newest.Name)
	}
	if err := json.Unmarshal(value, &cfg); err != nil || cfg.Ignition.Version == "" {
		return "", fmt.Errorf("user-data Secret %s/%s: key \"value\" is not an Ignition config (no ignition.version)", newest.Namespace, newest.Name)
	}
	return string(value), nil
}
