package worker

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hivev1 "github.com/agentboot/agentboot/api/hive/v1"
	"github.com/agentboot/agentboot/internal/binding"
)

// waiting is an error that is expected for a while (a kubeconfig not yet
// published); it is shown, not logged as a failure.
type waiting struct{ msg string }

func (w waiting) Error() string { return w.msg }

// clients caches one client per ClusterDeployment, with the kubeconfig it was
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
	// read is when the kubeconfig was last read, from the Secret of
	// secret named by the ClusterDeployment of UID cd.
	read   time.Time
	cd     types.UID
	secret string
}

// hosted returns a client for the hosted cluster an Agent is bound to,
// through the admin kubeconfig its ClusterDeployment names
// (spec.clusterMetadata.adminKubeconfigSecretRef, key "kubeconfig"), once
// the binding holds (binding.Resolve, through the cache: callers confirm it
// before they act on it).
func (r *Reconciler) hosted(ctx context.Context, a *v1beta1.Agent) (kubernetes.Interface, *binding.Binding, error) {
	b, err := binding.Resolve(ctx, r.Bindings, a)
	if err != nil {
		return nil, nil, err
	}
	c, err := r.clientFor(ctx, b.ClusterDeployment)
	return c, b, err
}

// hostedQPS is the requests a second agentboot makes at most to one hosted
// cluster's apiserver: a poll is a GET of the Node, and the kubelet CSRs
// are listed once a second for all the cluster's hosts (two calls), so 200
// hosts joining one cluster at once, polled every 2 s, are about 102.
const hostedQPS = 200

// restConfig builds a client configuration from a kubeconfig's current
// context, taking its server, CA and credentials only. Whoever can write the
// kubeconfig Secret in a control-plane namespace must not make the manager
// run a command (exec, auth-provider plugins), read its own files (paths
// to certificates or tokens), talk through a proxy, act as someone else
// (impersonation), or trust any server (insecure-skip-tls-verify).
func restConfig(raw []byte) (*rest.Config, error) {
	kc, err := clientcmd.Load(raw)
	if err != nil {
		return nil, fmt.Errorf("not a kubeconfig: %w", err)
	}
	cx := kc.Contexts[kc.CurrentContext]
	if cx == nil {
		return nil, fmt.Errorf("current-context %q names no context", kc.CurrentContext)
	}
	cl, auth := kc.Clusters[cx.Cluster], kc.AuthInfos[cx.AuthInfo]
	if cl == nil || auth == nil {
		return nil, fmt.Errorf("context %q names no cluster or no user", kc.CurrentContext)
	}
	u, err := url.Parse(cl.Server)
	var refused []string
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "":
		refused = append(refused, fmt.Sprintf("server %q is not an https URL", cl.Server))
	case cl.InsecureSkipTLSVerify:
		refused = append(refused, "insecure-skip-tls-verify")
	case len(cl.CertificateAuthorityData) == 0:
		refused = append(refused, "no certificate-authority-data")
	}
	for what, set := range map[string]bool{
		"certificate-authority (a file path)": cl.CertificateAuthority != "",
		"proxy-url":                           cl.ProxyURL != "",
		"exec":                                auth.Exec != nil,
		"auth-provider":                       auth.AuthProvider != nil,
		"client-certificate or client-key (file paths)": auth.ClientCertificate != "" || auth.ClientKey != "",
		"tokenFile":             auth.TokenFile != "",
		"as (impersonation)":    auth.Impersonate != "" || auth.ImpersonateUID != "" || len(auth.ImpersonateGroups) > 0 || len(auth.ImpersonateUserExtra) > 0,
		"username and password": auth.Username != "" || auth.Password != "",
	} {
		if set {
			refused = append(refused, what)
		}
	}
	hasCert := len(auth.ClientCertificateData) > 0 && len(auth.ClientKeyData) > 0
	if !hasCert && auth.Token == "" {
		refused = append(refused, "no credentials (client-certificate-data and client-key-data, or token)")
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return nil, fmt.Errorf("refused: %s (agentboot takes a hosted cluster's server, CA and credentials only)", strings.Join(refused, ", "))
	}
	return &rest.Config{
		Host:        cl.Server,
		BearerToken: auth.Token,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: cl.TLSServerName,
			CAData:     cl.CertificateAuthorityData,
			CertData:   auth.ClientCertificateData,
			KeyData:    auth.ClientKeyData,
		},
		// No proxy from the manager's environment either.
		Proxy: func(*http.Request) (*url.URL, error) { return nil, nil },
		// client-go's default of 5 requests a second per cluster polled
		// 500 joining hosts of 10 clusters every 40 s instead of 10 (a
		// poll is a Node and the kubelet CSRs: 3 requests).
		QPS: hostedQPS, Burst: 2 * hostedQPS,
	}, nil
}

// clientFor returns the client of ClusterDeployment cd's cluster: the one
// made before while its kubeconfig is unchanged, a new one (closing the
// old one's idle connections) when it rotated. The kubeconfig Secret is
// read at most once a Poll per cluster, not once per host and poll: a
// cluster installing 200 hosts would otherwise have it read 20 times a
// second.
func (r *Reconciler) clientFor(ctx context.Context, cd *hivev1.ClusterDeployment) (kubernetes.Interface, error) {
	key := client.ObjectKeyFromObject(cd)
	md := cd.Spec.ClusterMetadata
	if md == nil || md.AdminKubeconfigSecretRef.Name == "" {
		return nil, waiting{fmt.Sprintf("ClusterDeployment %s has no spec.clusterMetadata.adminKubeconfigSecretRef yet", key)}
	}
	now := r.Now()
	// One reader at a time (the worker polls several hosts at once): a
	// poll that read the Secret before a rotation must not put its client
	// back after one that read it since, and a cluster's Secret is read
	// once, not by every poll that found it due. A read is one GET of the
	// management cluster's apiserver, once a poll interval per cluster.
	r.clients.mu.Lock()
	defer r.clients.mu.Unlock()
	cur, ok := r.clients.m[key]
	if ok && cur.cd == cd.UID && cur.secret == md.AdminKubeconfigSecretRef.Name && now.Sub(cur.read) < r.Poll {
		return cur.client, nil
	}
	var s corev1.Secret
	sk := client.ObjectKey{Namespace: cd.Namespace, Name: md.AdminKubeconfigSecretRef.Name}
	if err := r.APIReader.Get(ctx, sk, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of ClusterDeployment %s does not exist", sk, key)}
		}
		return nil, err
	}
	raw := s.Data["kubeconfig"]
	if len(raw) == 0 {
		return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of ClusterDeployment %s has no key \"kubeconfig\"", sk, key)}
	}
	sum := sha256.Sum256(raw)
	if ok && cur.sum == sum {
		cur.read, cur.cd, cur.secret = now, cd.UID, sk.Name
		r.clients.m[key] = cur
		return cur.client, nil
	}
	cfg, err := restConfig(raw)
	if err != nil {
		return nil, &binding.Refused{Msg: fmt.Sprintf("kubeconfig Secret %s of ClusterDeployment %s: %v", sk, key, err)}
	}
	cfg.Timeout = r.CallTimeout
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, waiting{fmt.Sprintf("kubeconfig Secret %s of ClusterDeployment %s is not a usable kubeconfig: %v", sk, key, err)}
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
	r.clients.m[key] = hostedClient{sum: sum, client: c, http: httpClient, read: now, cd: cd.UID, secret: sk.Name}
	return c, nil
}
