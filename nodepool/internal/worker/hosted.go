package worker

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/nodepool/internal/binder"
)

// waiting is an error that is expected for a while (a kubeconfig not yet
// published); it is shown, not logged as a failure.
type waiting struct{ msg string }

func (w waiting) Error() string { return w.msg }

// clients caches one client per HostedCluster, with the kubeconfig it was
// made from: a rotated kubeconfig replaces it (closing its idle
// connections), an unchanged one is reused.
type clients struct {
	mu sync.Mutex
	m  map[client.ObjectKey]hostedClient
}

type hostedClient struct {
	sum    [32]byte
	client kubernetes.Interface
	http   *http.Client
}

// hosted returns a client for the hosted cluster an Agent is bound to,
// from its HostedCluster's status.kubeConfig Secret (key "kubeconfig").
func (r *Reconciler) hosted(ctx context.Context, a *v1beta1.Agent) (kubernetes.Interface, error) {
	key := client.ObjectKey{Namespace: a.Labels[binder.NodePoolNamespaceLabel], Name: a.Spec.ClusterDeploymentName.Name}
	hc := &hypershift.HostedCluster{}
	if err := r.Client.Get(ctx, key, hc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, waiting{fmt.Sprintf("HostedCluster %s does not exist", key)}
		}
		return nil, err
	}
	if hc.Status.KubeConfig == nil || hc.Status.KubeConfig.Name == "" {
		return nil, waiting{fmt.Sprintf("HostedCluster %s has not published status.kubeConfig yet", key)}
	}
	var s corev1.Secret
	sk := client.ObjectKey{Namespace: hc.Namespace, Name: hc.Status.KubeConfig.Name}
	if err := r.APIReader.Get(ctx, sk, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of HostedCluster %s does not exist", sk, key)}
		}
		return nil, err
	}
	raw := s.Data["kubeconfig"]
	if len(raw) == 0 {
		return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of HostedCluster %s has no key \"kubeconfig\"", sk, key)}
	}
	sum := sha256.Sum256(raw)
	r.clients.mu.Lock()
	defer r.clients.mu.Unlock()
	cur, ok := r.clients.m[key]
	if ok && cur.sum == sum {
		return cur.client, nil
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of HostedCluster %s is not a usable kubeconfig: %v", sk, key, err)}
	}
	cfg.Timeout = r.CallTimeout
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of HostedCluster %s is not a usable kubeconfig: %v", sk, key, err)}
	}
	c, err := kubernetes.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	if ok {
		cur.http.CloseIdleConnections()
	}
	if r.clients.m == nil {
		r.clients.m = map[client.ObjectKey]hostedClient{}
	}
	r.clients.m[key] = hostedClient{sum: sum, client: c, http: httpClient}
	return c, nil
}
