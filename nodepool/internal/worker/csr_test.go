package worker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
)

func request(t *testing.T, cn string, orgs, dns []string, ips []net.IP) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}, DNSNames: dns, IPAddresses: ips}, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestCheckCSR(t *testing.T) {
	hostIPs := []net.IP{net.ParseIP("198.18.0.10"), net.ParseIP("2001:db8::10")}
	nodes := []string{"system:nodes"}
	client := certificatesv1.KubeAPIServerClientKubeletSignerName
	serving := certificatesv1.KubeletServingSignerName
	cu := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth}
	su := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
	for _, c := range []struct {
		name       string
		signer     string
		user, cn   string
		orgs, dns  []string
		ips        []net.IP
		usages     []certificatesv1.KeyUsage
		nodeExists bool
		want       string
	}{
		{name: "client from the bootstrapper", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu},
		{name: "client from a bootstrap token", signer: client, user: "system:bootstrap:abcdef", cn: "system:node:w1", orgs: nodes, usages: cu},
		{name: "another host", signer: client, user: nodeBootstrapper, cn: "system:node:w2", orgs: nodes, usages: cu, want: errNotThisHost},
		{name: "not a node", signer: client, user: nodeBootstrapper, cn: "admin", orgs: nodes, usages: cu, want: errNotThisHost},
		{name: "client once the Node exists", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, nodeExists: true, want: "already exists"},
		{name: "client from anyone else", signer: client, user: "mallory", cn: "system:node:w1", orgs: nodes, usages: cu, want: `requested by "mallory"`},
		{name: "client with addresses", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, ips: hostIPs[:1], usages: cu, want: "must not carry names"},
		{name: "client with server usage", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: su, want: `usage "server auth"`},
		{name: "wrong organization", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: []string{"system:masters"}, usages: cu, want: "organization"},
		{name: "serving", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, ips: hostIPs, usages: su},
		{name: "serving with only a name", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su},
		{name: "serving from another identity", signer: serving, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su, want: "not by system:node:w1"},
		{name: "serving for a foreign name", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"api.example.com"}, usages: su, want: `DNS name "api.example.com"`},
		{name: "serving for a foreign address", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, ips: []net.IP{net.ParseIP("10.0.0.1")}, usages: su, want: "IP address 10.0.0.1"},
		{name: "serving without names", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, usages: su, want: "needs a name or an address"},
		{name: "serving without server auth", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su[:2], want: "lack"},
		{name: "other signer", signer: "example.com/custom", user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, want: errNotThisHost},
	} {
		t.Run(c.name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
				Request: request(t, c.cn, c.orgs, c.dns, c.ips), SignerName: c.signer, Username: c.user, Usages: c.usages}}
			got := checkCSR(csr, "w1", hostIPs, c.nodeExists)
			if c.want == "" {
				require.Empty(t, got)
			} else {
				require.Contains(t, got, c.want)
			}
		})
	}
	garbage := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{Request: []byte("not PEM"), SignerName: client}}
	require.Equal(t, errNotThisHost, checkCSR(garbage, "w1", hostIPs, false))
}
