// Package observe tells whoever asks (tests) of each reconcile pass a
// controller finishes: which object, and what the pass returned. A
// controller is wrapped with Passes where it is set up, so its Reconcile
// stays as it is; a pass that looked at nothing (its cache behind the
// controller's own last write) says so with Skip and is not told, so that
// "two passes since" means two looks.
//
// It never changes what a pass does or returns.
package observe

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Hook is told of a finished pass (testenv.Passes.Observe).
type Hook func(obj types.NamespacedName, res reconcile.Result, err error)

type skipKey struct{}

// Passes is r telling hook of each pass it finishes; r itself when hook
// is nil.
func Passes(r reconcile.Reconciler, hook Hook) reconcile.Reconciler {
	if hook == nil {
		return r
	}
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		skipped := new(bool)
		res, err := r.Reconcile(context.WithValue(ctx, skipKey{}, skipped), req)
		if !*skipped || err != nil {
			hook(req.NamespacedName, res, err)
		}
		return res, err
	})
}

// Skip marks the pass of ctx as one that looked at nothing.
func Skip(ctx context.Context) {
	if p, ok := ctx.Value(skipKey{}).(*bool); ok {
		*p = true
	}
}
