// Package agentrecord keeps ConfigMaps in agentboot's own namespace that
// the manager derives from one Agent each (the installation handed over
// to the agent API, the record that a host boots from its disk): out of
// tenants' reach, found by the Agent they are for through a cache index,
// rewritten only when they would say something else, and deleted when the
// Agent no longer needs one, was recreated, or is gone.
package agentrecord

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// AgentKey is the data key of a record that names its Agent
// ("namespace/name").
const AgentKey = "agent"

// Of is the AgentKey value of a's records.
func Of(a *v1beta1.Agent) string { return a.Namespace + "/" + a.Name }

// IndexBy is the cache index function of records labelled label=true: by
// the Agent they are for.
func IndexBy(label string) client.IndexerFunc {
	return func(o client.Object) []string {
		cm, ok := o.(*corev1.ConfigMap)
		if !ok || cm.Labels[label] != "true" || cm.Data[AgentKey] == "" {
			return nil
		}
		return []string{cm.Data[AgentKey]}
	}
}

// Watch has a controller of Agents look again at an Agent whenever one of
// its records (labelled label=true, in namespace) changes or goes, so that
// a record someone deleted or edited is made again at once.
func Watch(b *builder.TypedBuilder[reconcile.Request], namespace, label string) *builder.TypedBuilder[reconcile.Request] {
	own := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == namespace && o.GetLabels()[label] == "true"
	})
	return b.Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ns, name, ok := strings.Cut(o.(*corev1.ConfigMap).Data[AgentKey], "/")
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
	}), builder.WithPredicates(own))
}

// Sync makes the ConfigMaps in namespace that index finds for agent
// ("namespace/name") exactly want: none when want is nil. An existing one
// of want's name is rewritten only when same(have, want) is false. It
// reports whether to look again soon (someone else wrote meanwhile).
//
// fresh, when not nil, reads want's name from the apiserver instead of
// trusting the cache: a record the cache still holds after it was deleted
// would otherwise never be made again.
func Sync(ctx context.Context, c client.Client, fresh client.Reader, namespace, index, agent string, want *corev1.ConfigMap, same func(have, want *corev1.ConfigMap) bool) (again bool, err error) {
	var have corev1.ConfigMapList
	if err := c.List(ctx, &have, client.InNamespace(namespace), client.MatchingFields{index: agent}); err != nil {
		return false, err
	}
	var current *corev1.ConfigMap
	for i := range have.Items {
		cm := &have.Items[i]
		if want != nil && cm.Name == want.Name {
			current = cm
			continue
		}
		if err := c.Delete(ctx, cm, client.Preconditions{UID: &cm.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, fmt.Errorf("remove %s/%s (Agent %s): %w", namespace, cm.Name, agent, err)
		}
	}
	if want != nil && fresh != nil {
		var have corev1.ConfigMap
		switch err := fresh.Get(ctx, client.ObjectKeyFromObject(want), &have); {
		case apierrors.IsNotFound(err):
			current = nil
		case err != nil:
			return false, err
		default:
			current = &have
		}
	}
	switch {
	case want == nil:
	case current == nil:
		err := c.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) {
			// One of that name the index does not know as this Agent's
			// (someone relabelled or edited it): made what it should be.
			var have corev1.ConfigMap
			if err := c.Get(ctx, client.ObjectKeyFromObject(want), &have); err != nil {
				return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
			}
			current, err = &have, nil
			if !same(current, want) {
				return update(ctx, c, current, want, agent)
			}
		}
		if err != nil {
			return false, fmt.Errorf("create %s/%s (Agent %s): %w", namespace, want.Name, agent, err)
		}
	case !same(current, want):
		return update(ctx, c, current, want, agent)
	}
	return false, nil
}

func update(ctx context.Context, c client.Client, current, want *corev1.ConfigMap, agent string) (bool, error) {
	current.Labels, current.Data = want.Labels, want.Data
	if err := c.Update(ctx, current); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("update %s/%s (Agent %s): %w", current.Namespace, current.Name, agent, err)
	}
	return false, nil
}
