package testenv

import (
	"context"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/agentboot/agentboot/internal/scheme"
)

// LateCache is a client of the control plane that reads like a
// controller's cache that has not seen objects of unseen's type yet: it
// says NotFound to every Get of one, and is otherwise direct.
func (e *Env) LateCache(unseen client.Object) (client.Client, error) {
	s, err := scheme.New()
	if err != nil {
		return nil, err
	}
	direct, err := client.NewWithWatch(e.Config, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	t := reflect.TypeOf(unseen)
	return interceptor.NewClient(direct, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if reflect.TypeOf(obj) == t {
				return apierrors.NewNotFound(schema.GroupResource{Resource: t.Elem().Name()}, key.Name)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}), nil
}
