// Package infraenv makes the benchmarks' InfraEnvs.
package infraenv

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
)

// Ready creates namespace ns with a pull secret and an x86_64 InfraEnv of
// that name carrying labels, and returns it once its image is created.
func Ready(ctx context.Context, c client.Client, ns string, labels map[string]string) (*v1beta1.InfraEnv, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pull-secret"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"quay.io":{"auth":"eDp5"}}}`)},
	}); err != nil {
		return nil, err
	}
	ie := &v1beta1.InfraEnv{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ns, Labels: labels},
		Spec: v1beta1.InfraEnvSpec{PullSecretRef: &corev1.LocalObjectReference{Name: "pull-secret"}, CPUArchitecture: "x86_64",
			SSHAuthorizedKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBench bench"},
	}
	if err := c.Create(ctx, ie); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(ie), ie); err == nil && conditions.IsTrue(ie.Status.Conditions, v1beta1.ImageCreatedCondition) {
			return ie, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("InfraEnv %s/%s: image not created in 2 minutes: %+v", ns, ns, ie.Status.Conditions)
}
