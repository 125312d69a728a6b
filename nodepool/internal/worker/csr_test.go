package worker

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func request(t *testing.T, cn string, orgs, dns []string, ips []net.IP) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}, DNSNames: dns, IPAddresses: ips}, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestCheckCSR(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
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
		groups     []string
		age        time.Duration // of the CSR (1m)
		machineAge time.Duration // of the AgentMachine (30m)
		approved   string
		rebooted   time.Duration // ago the host reported Rebooting (0: not known)
		clients    []string      // pending client CSRs naming the Node
		seen       []net.IP      // source addresses
		behindNAT  bool
		want       string
	}{
		{name: "client from the bootstrapper", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu},
		{name: "client from a bootstrap token", signer: client, user: "system:bootstrap:abcdef", cn: "system:node:w1", orgs: nodes, usages: cu, want: `requested by "system:bootstrap:abcdef"`},
		{name: "client from the bootstrapper's name with other groups", signer: client, user: nodeBootstrapper, groups: []string{"system:authenticated"}, cn: "system:node:w1", orgs: nodes, usages: cu, want: "not exactly the node bootstrapper's"},
		{name: "client with an extra group", signer: client, user: nodeBootstrapper, groups: append([]string{"system:masters"}, nodeBootstrapperGroups...), cn: "system:node:w1", orgs: nodes, usages: cu, want: "not exactly the node bootstrapper's"},
		{name: "client planted before the machine", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, age: 25 * time.Hour, want: "not made for this installation"},
		{name: "serving planted before the machine", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su, age: 25 * time.Hour, want: "not made for this installation"},
		{name: "client pending over an hour", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, age: 61 * time.Minute, machineAge: 2 * time.Hour, want: "more than 1h0m0s"},
		{name: "second client for the Node", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, approved: "csr-first", want: "csr-first was already approved"},
		{name: "client after the host rebooted", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, rebooted: 5 * time.Minute},
		{name: "client before the host rebooted", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, age: 10 * time.Minute, rebooted: 5 * time.Minute, want: "before the host reported Rebooting"},
		{name: "one of two pending clients", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, clients: []string{"csr-a", "csr-b"}, want: "2 pending client CSRs name Node w1 (csr-a, csr-b)"},
		{name: "another host", signer: client, user: nodeBootstrapper, cn: "system:node:w2", orgs: nodes, usages: cu, want: errNotThisHost},
		{name: "not a node", signer: client, user: nodeBootstrapper, cn: "admin", orgs: nodes, usages: cu, want: errNotThisHost},
		{name: "client once the Node exists", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, nodeExists: true, want: "already exists"},
		{name: "client from anyone else", signer: client, user: "mallory", cn: "system:node:w1", orgs: nodes, usages: cu, want: `requested by "mallory"`},
		{name: "client with addresses", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, ips: hostIPs[:1], usages: cu, want: "must not carry names"},
		{name: "client with server usage", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: su, want: `usage "server auth"`},
		{name: "wrong organization", signer: client, user: nodeBootstrapper, cn: "system:node:w1", orgs: []string{"system:masters"}, usages: cu, want: "organization"},
		{name: "serving", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, ips: hostIPs, seen: hostIPs, usages: su},
		{name: "serving with only a name", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su},
		{name: "serving from another identity", signer: serving, user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su, want: "not by system:node:w1"},
		{name: "serving for a foreign name", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"api.example.com"}, usages: su, want: `DNS name "api.example.com"`},
		{name: "serving for a foreign address", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, ips: []net.IP{net.ParseIP("10.0.0.1")}, usages: su, want: "IP address 10.0.0.1"},
		{name: "serving, seen using its address", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, ips: hostIPs[:1], seen: hostIPs[:1], usages: su},
		{name: "serving claiming a reported address never used (a VIP)", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, ips: hostIPs, seen: hostIPs[:1], usages: su, want: "IP address 2001:db8::10 is one the host reported but was never seen using (it connected from 198.18.0.10)"},
		{name: "serving from a host that left its source address out of its report", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, ips: hostIPs[1:], seen: []net.IP{net.ParseIP("10.128.0.5")}, usages: su, want: "was never seen using"},
		{name: "serving behind NAT (--agent-api-behind-nat): the report is all there is", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, ips: hostIPs, seen: []net.IP{net.ParseIP("10.128.0.5")}, behindNAT: true, usages: su},
		{name: "serving without names", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, usages: su, want: "needs a name or an address"},
		{name: "serving without server auth", signer: serving, user: "system:node:w1", cn: "system:node:w1", orgs: nodes, dns: []string{"w1"}, usages: su[:2], want: "lack"},
		{name: "other signer", signer: "example.com/custom", user: nodeBootstrapper, cn: "system:node:w1", orgs: nodes, usages: cu, want: errNotThisHost},
	} {
		t.Run(c.name, func(t *testing.T) {
			groups := c.groups
			if groups == nil && c.user == nodeBootstrapper {
				groups = []string{"system:serviceaccounts:openshift-machine-config-operator", "system:authenticated", "system:serviceaccounts"}
			}
			age, machineAge := cmp.Or(c.age, time.Minute), cmp.Or(c.machineAge, 30*time.Minute)
			csr := &certificatesv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-age))},
				Spec: certificatesv1.CertificateSigningRequestSpec{
					Request: request(t, c.cn, c.orgs, c.dns, c.ips), SignerName: c.signer, Username: c.user, Groups: groups, Usages: c.usages}}
			cc := csrContext{hostname: "w1", ips: hostIPs, seen: c.seen, behindNAT: c.behindNAT, nodeExists: c.nodeExists, machineCreated: now.Add(-machineAge), clockSkew: defaultClockSkew, approved: c.approved, clients: c.clients}
			if c.rebooted > 0 {
				cc.rebooted = now.Add(-c.rebooted)
			}
			got := checkCSR(csr, cc, now)
			if c.want == "" {
				require.Empty(t, got)
			} else {
				require.Contains(t, got, c.want)
			}
		})
	}
	garbage := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{Request: []byte("not PEM"), SignerName: client}}
	require.Equal(t, errNotThisHost, checkCSR(garbage, csrContext{hostname: "w1", ips: hostIPs}, now))
}
