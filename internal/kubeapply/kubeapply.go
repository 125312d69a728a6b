// Package kubeapply server-side applies YAML manifests and waits for the
// CustomResourceDefinitions among them to be served. `agentboot dev` uses it
// to install the CRDs; it touches nothing it was not given.
package kubeapply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldOwner is the server-side apply field manager of everything applied here.
const FieldOwner = "agentboot"

// Decode splits YAML documents into objects, skipping empty documents.
func Decode(docs ...[]byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, doc := range docs {
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decode manifest: %w", err)
			}
			if len(u.Object) == 0 {
				continue
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}

// Apply server-side applies objs in order, then waits until every CRD among
// them is Established, so that their kinds can be used right away.
func Apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	var crds []string
	for _, u := range objs {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, u.GetName())
		}
	}
	for _, name := range crds {
		if err := waitEstablished(ctx, c, name); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// Unstructured, so that callers need no apiextensions scheme.
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == string(apiextensionsv1.Established) && m["status"] == string(apiextensionsv1.ConditionTrue) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", name, err)
	}
	return nil
}
