// Package hosted plays, for tests, a hosted cluster and its nodes: a second
// kube-apiserver as the hosted cluster, its Ignition endpoint, and a
// kubelet bootstrapping against it. test/capiagent plays the management
// cluster's side (HyperShift, Cluster API, cluster-api-provider-agent).
package hosted

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// Cluster is a second kube-apiserver playing the hosted cluster.
type Cluster struct {
	Env   *testenv.Env
	Admin kubernetes.Interface
}

// Start gives t a hosted cluster's apiserver until t ends. Under
// stack.Main the tests of a binary take turns on one: what kubelets leave
// in it (CSRs, Nodes) is deleted before the next test gets it.
func Start(t testing.TB) *Cluster {
	t.Helper()
	env := stack.Borrow(t, testenv.Options{NoCRDs: true}, empty)
	c := &Cluster{Env: env, Admin: kubernetes.NewForConfigOrDie(env.Config)}
	// Kubelets (bootstrapping or not) may ask for certificates, as in a
	// real cluster.
	_, err := c.Admin.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelets-request-certificates"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:authenticated"}},
	}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	return c
}

// empty is the hosted clusters' stack.Emptier: it deletes the CSRs and
// Nodes a test's kubelets left.
func empty(env *testenv.Env) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return "", err
	}
	all := metav1.ListOptions{}
	csrs, err := c.CertificatesV1().CertificateSigningRequests().List(ctx, all)
	if err != nil {
		return "", err
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, all)
	if err != nil {
		return "", err
	}
	if len(csrs.Items)+len(nodes.Items) == 0 {
		return "", nil
	}
	if err := c.CertificatesV1().CertificateSigningRequests().DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		return "", fmt.Errorf("delete the CSRs: %w", err)
	}
	if err := c.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		return "", fmt.Errorf("delete the Nodes: %w", err)
	}
	return fmt.Sprintf("%d CSRs and %d Nodes", len(csrs.Items), len(nodes.Items)), nil
}

// Signers, identities and key usages of kubelet CSRs.
const (
	ClientSigner  = certificatesv1.KubeAPIServerClientKubeletSignerName
	ServingSigner = certificatesv1.KubeletServingSignerName
	// Bootstrapper is the identity an OpenShift node's kubelet bootstraps as.
	Bootstrapper = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper"
)

var (
	ClientUsages  = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	ServingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
)

// Kubelet plays a host's kubelet against the hosted cluster.
type Kubelet struct {
	T    testing.TB
	C    *Cluster
	Name string
}

// CSR submits a CSR for CN system:node:<cn> as user, with the SANs.
func (k *Kubelet) CSR(name, signer, user, cn string, dns []string, ips []net.IP, usages ...certificatesv1.KeyUsage) {
	k.T.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(k.T, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + cn, Organization: []string{"system:nodes"}}, DNSNames: dns, IPAddresses: ips}, key)
	require.NoError(k.T, err)
	cfg := rest.CopyConfig(k.C.Env.Config)
	groups := []string{"system:authenticated"}
	switch {
	case strings.HasPrefix(user, "system:node:"):
		groups = append(groups, "system:nodes")
	case user == Bootstrapper:
		// A ServiceAccount's groups, as the apiserver gives them.
		groups = append(groups, "system:serviceaccounts", "system:serviceaccounts:openshift-machine-config-operator")
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c := kubernetes.NewForConfigOrDie(cfg)
	_, err = c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: signer, Usages: usages},
	}, metav1.CreateOptions{})
	require.NoError(k.T, err)
}

// Approved reports whether CSR name was approved.
func (k *Kubelet) Approved(name string) bool {
	csr, err := k.C.Admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(k.T, err)
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Register creates the Node, as kubelet does once it has its certificate.
func (k *Kubelet) Register() {
	k.T.Helper()
	_, err := k.C.Admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.Name}}, metav1.CreateOptions{})
	require.NoError(k.T, err)
}

// Ready reports the Node Ready.
func (k *Kubelet) Ready() {
	k.T.Helper()
	ctx := context.Background()
	n, err := k.C.Admin.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
	require.NoError(k.T, err)
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	_, err = k.C.Admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	require.NoError(k.T, err)
}
