package worker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	hivev1 "github.com/agentboot/agentboot/api/hive/v1"
	"github.com/agentboot/agentboot/test/testenv"
)

// One client per hosted cluster: reused while its kubeconfig is unchanged,
// replaced (not added to) when it rotates. The kubeconfig is read at most
// once a poll interval per cluster.
func TestHostedClientPerCluster(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clusters-vcluster2"}}))
	kc, err := os.ReadFile(env.Kubeconfig)
	require.NoError(t, err)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters-vcluster2", Name: "admin-kubeconfig"}, Data: map[string][]byte{"kubeconfig": kc}}
	require.NoError(t, env.Client.Create(ctx, secret))
	cd := &hivev1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters-vcluster2", Name: "vcluster2"},
		Spec: hivev1.ClusterDeploymentSpec{Installed: true, ClusterMetadata: &hivev1.ClusterMetadata{AdminKubeconfigSecretRef: hivev1.LocalObjectReference{Name: secret.Name}}}}

	now := time.Now()
	r := &Reconciler{Client: env.Client, APIReader: env.Client, Poll: 10 * time.Second, Now: func() time.Time { return now }}
	first, err := r.clientFor(ctx, cd)
	require.NoError(t, err)
	now = now.Add(r.Poll)
	again, err := r.clientFor(ctx, cd)
	require.NoError(t, err)
	require.Same(t, first, again, "an unchanged kubeconfig reuses its client")

	for i := range 3 {
		secret.Data["kubeconfig"] = append(append([]byte{}, kc...), []byte("\n# rotated "+string(rune('a'+i))+"\n")...)
		require.NoError(t, env.Client.Update(ctx, secret))
		now = now.Add(r.Poll - time.Second)
		soon, err := r.clientFor(ctx, cd)
		require.NoError(t, err)
		require.Same(t, first, soon, "within a poll interval the kubeconfig is not read again")
		now = now.Add(time.Second)
		rotated, err := r.clientFor(ctx, cd)
		require.NoError(t, err)
		require.NotSame(t, first, rotated, "a rotated kubeconfig gets a new client")
		first = rotated
		_, err = rotated.Discovery().ServerVersion()
		require.NoError(t, err, "the new client works")
	}
	require.Len(t, r.clients.m, 1, "rotations replace the cluster's client")

	// Missing or broken kubeconfigs are said, not guessed: another
	// Secret named is read at once.
	cd.Spec.ClusterMetadata.AdminKubeconfigSecretRef.Name = "nope"
	_, err = r.clientFor(ctx, cd)
	require.ErrorContains(t, err, "kubeconfig Secret clusters-vcluster2/nope of ClusterDeployment clusters-vcluster2/vcluster2 does not exist")
	cd.Spec.ClusterMetadata = nil
	_, err = r.clientFor(ctx, cd)
	require.ErrorContains(t, err, "has no spec.clusterMetadata.adminKubeconfigSecretRef yet")
}

// A hosted cluster's kubeconfig is read for its server, CA and credentials
// only: whoever writes the Secret in a control-plane namespace cannot make
// the manager run a command, read its own files, use a proxy, impersonate
// or skip the server's certificate. Each refusal names what it refused.
func TestKubeconfigTakesServerCAAndCredentialsOnly(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	good, err := os.ReadFile(env.Kubeconfig)
	require.NoError(t, err)
	cfg, err := restConfig(good)
	require.NoError(t, err, "the control plane's own kubeconfig")
	require.NotEmpty(t, cfg.CAData)
	require.GreaterOrEqual(t, cfg.QPS, float32(60), "200 hosts joining one cluster, polled every 10 s, are 60 requests a second")

	kc, err := clientcmd.Load(good)
	require.NoError(t, err)
	cx := kc.Contexts[kc.CurrentContext]
	for name, tc := range map[string]struct {
		change func(c *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo)
		want   string
	}{
		"exec plugin": {func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.Exec = &clientcmdapi.ExecConfig{Command: "/bin/sh"}
		}, "exec"},
		"auth provider": {func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}, "auth-provider"},
		"insecure":   {func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) { c.InsecureSkipTLSVerify = true }, "insecure-skip-tls-verify"},
		"plain http": {func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) { c.Server = "http://10.0.0.1:6443" }, `server "http://10.0.0.1:6443" is not an https URL`},
		"a file to read": {func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.TokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
		}, "tokenFile"},
		"CA from a file": {func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) { c.CertificateAuthority = "/etc/ssl/ca.crt" }, "certificate-authority (a file path)"},
		"proxy":          {func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) { c.ProxyURL = "http://10.0.0.2:3128" }, "proxy-url"},
		"impersonation":  {func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) { a.Impersonate = "system:admin" }, "as (impersonation)"},
		"no CA":          {func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) { c.CertificateAuthorityData = nil }, "no certificate-authority-data"},
		"no credentials": {func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.ClientCertificateData, a.ClientKeyData, a.Token = nil, nil, ""
		}, "no credentials"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := kc.DeepCopy()
			tc.change(bad.Clusters[cx.Cluster], bad.AuthInfos[cx.AuthInfo])
			raw, err := clientcmd.Write(*bad)
			require.NoError(t, err)
			_, err = restConfig(raw)
			require.ErrorContains(t, err, "refused: ")
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// The hosted cluster's kubelet CSRs are read page by page, by signer, all
// as of one version, and nothing of other signers.
func TestListKubeletCSRsPages(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	hc, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	defer func(p int64) { csrPage = p }(csrPage)
	csrPage = 2
	want := map[string]bool{}
	for i, signer := range []string{certificatesv1.KubeAPIServerClientKubeletSignerName, certificatesv1.KubeletServingSignerName, "example.com/other"} {
		for j := range 5 {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			require.NoError(t, err)
			der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:w1", Organization: []string{"system:nodes"}}}, key)
			require.NoError(t, err)
			name := fmt.Sprintf("csr-%d-%d", i, j)
			usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
			if signer == certificatesv1.KubeletServingSignerName {
				usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
			}
			_, err = hc.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Usages: usages,
					Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			if signer != "example.com/other" {
				want[name] = true
			}
		}
	}
	items, err := listKubeletCSRs(context.Background(), hc)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, c := range items {
		got[c.Name] = true
	}
	require.Equal(t, want, got)
}

// One list of a cluster's kubelet CSRs serves all its hosts' polls for a
// second, and none after an approval there; another cluster has its own.
func TestCSRListsShared(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	var calls atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.Contains(req.URL.Path, "certificatesigningrequests") {
				calls.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	hc, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	other, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	var lists csrLists
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	listAt := func(c kubernetes.Interface, at time.Duration) int64 {
		t.Helper()
		before := calls.Load()
		_, _, err := lists.list(ctx, c, t0.Add(at), false)
		require.NoError(t, err)
		return calls.Load() - before
	}
	perList := int64(len(kubeletSigners)) // one call per signer: no CSRs, one page each
	require.Equal(t, perList, listAt(hc, 0), "the first poll lists")
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _, _ = lists.list(ctx, hc, t0.Add(500*time.Millisecond), false) }()
	}
	wg.Wait()
	require.Equal(t, perList, calls.Load(), "50 polls within the second share the list")
	require.Equal(t, perList, listAt(other, 600*time.Millisecond), "another cluster lists its own")
	lists.changed(hc)
	require.Equal(t, perList, listAt(hc, 700*time.Millisecond), "after an approval the next poll lists again")
	require.Zero(t, listAt(hc, 800*time.Millisecond))
	require.Equal(t, perList, listAt(hc, 1800*time.Millisecond), "a second later, again")
	before := calls.Load()
	_, cached, err := lists.list(ctx, hc, t0.Add(1900*time.Millisecond), true)
	require.NoError(t, err)
	require.False(t, cached)
	require.Equal(t, perList, calls.Load()-before, "a list asked fresh (to approve on) is made now")

	// A cluster whose apiserver fails: the error is shared too, and a
	// poll whose request ends stops waiting.
	broken, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	require.NoError(t, err)
	_, _, err = lists.list(ctx, broken, t0, false)
	require.Error(t, err)
	_, cached, err = lists.list(ctx, broken, t0.Add(100*time.Millisecond), false)
	require.Error(t, err)
	require.True(t, cached, "the error is shared for the second, not met again by each poll")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
