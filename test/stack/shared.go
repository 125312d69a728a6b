package stack

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/agentboot/agentboot/internal/testenv"
)

// A control plane costs seconds to start (etcd and kube-apiserver), more
// than most tests that use one. Main lets the stacks of a test binary take
// turns on one: each Stack still starts its own manager and servers, and
// when it stops, every custom resource is deleted, so the next one starts
// on a cluster as empty as a new one.
var shared struct {
	sync.Mutex
	main  bool // Main runs this binary's tests
	env   *testenv.Env
	inUse bool
}

// Main runs a package's tests (call it from TestMain) with one control
// plane for their stacks, and stops it before the process exits. A stack
// that starts while another still runs (two at once in a test) gets a
// control plane of its own, as every stack does in a binary without Main.
// Options.Identities run on the shared one again for each stack: they
// must be idempotent, as applying deploy/ (Deployed) is.
func Main(m *testing.M) {
	shared.Lock()
	shared.main = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the shared control plane:", err)
		}
	}
	shared.Unlock()
	os.Exit(code)
}

// controlPlane returns the control plane for a new stack and what gives it
// back when the stack stops.
func controlPlane() (*testenv.Env, func(), error) {
	envOpts := testenv.Options{HyperShift: true}
	own := func() (*testenv.Env, func(), error) {
		env, err := testenv.Start(envOpts)
		if err != nil {
			return nil, nil, err
		}
		return env, func() { _ = env.Stop() }, nil
	}
	shared.Lock()
	defer shared.Unlock()
	if !shared.main || shared.inUse {
		return own()
	}
	if shared.env == nil {
		env, err := testenv.Start(envOpts)
		if err != nil {
			return nil, nil, err
		}
		shared.env = env
	}
	shared.inUse = true
	env := shared.env
	return env, func() {
		err := empty(env)
		shared.Lock()
		defer shared.Unlock()
		if err != nil {
			// The next stack would find this one's objects: it gets a
			// control plane of its own instead.
			fmt.Fprintln(os.Stderr, "stack: empty the shared control plane:", err)
			_ = env.Stop()
			shared.env = nil
		}
		shared.inUse = false
	}, nil
}

// empty deletes every namespaced custom resource, removing its finalizers
// first: no controller is left to remove them.
func empty(env *testenv.Env) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	raw, err := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list CRDs: %w", err)
	}
	for _, u := range raw.Items {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
			return fmt.Errorf("CRD %s: %w", u.GetName(), err)
		}
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
			continue
		}
		version := ""
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				version = v.Name
			}
		}
		res := dyn.Resource(schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural})
		list, err := res.List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list %s: %w", crd.Name, err)
		}
		for _, o := range list.Items {
			r := res.Namespace(o.GetNamespace())
			if len(o.GetFinalizers()) > 0 {
				_, err := r.Patch(ctx, o.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("remove the finalizers of %s %s/%s: %w", crd.Spec.Names.Kind, o.GetNamespace(), o.GetName(), err)
				}
			}
			if err := r.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete %s %s/%s: %w", crd.Spec.Names.Kind, o.GetNamespace(), o.GetName(), err)
			}
		}
	}
	return nil
}
