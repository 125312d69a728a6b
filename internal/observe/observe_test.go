package observe

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A pass is told as it returned, unless it skipped and did not fail; the
// reconciler is not wrapped at all without a hook.
func TestPasses(t *testing.T) {
	var told []reconcile.Result
	hook := func(_ types.NamespacedName, res reconcile.Result, _ error) { told = append(told, res) }
	skip, fail := false, false
	r := reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		if skip {
			Skip(ctx)
		}
		if fail {
			return reconcile.Result{RequeueAfter: 2}, errors.New("boom")
		}
		return reconcile.Result{RequeueAfter: 1}, nil
	})
	w := Passes(r, hook)
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "x"}}
	res, err := w.Reconcile(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{RequeueAfter: 1}, res, "what the pass returned")
	skip = true
	_, _ = w.Reconcile(context.Background(), req)
	require.Len(t, told, 1, "a skipped pass is not told")
	fail = true
	_, err = w.Reconcile(context.Background(), req)
	require.Error(t, err)
	require.Equal(t, []reconcile.Result{{RequeueAfter: 1}, {RequeueAfter: 2}}, told, "a failed pass is told even if it skipped")
	Skip(context.Background()) // outside a wrapped pass: nothing happens
	require.NotNil(t, Passes(r, nil))
}
