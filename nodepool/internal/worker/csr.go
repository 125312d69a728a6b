package worker

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// Identities kubelets bootstrap with: OpenShift's node-bootstrapper
// ServiceAccount, and kubeadm-style bootstrap tokens.
const (
	nodeBootstrapper   = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper"
	bootstrapTokenUser = "system:bootstrap:"
)

// approveCSRs approves this host's pending kubelet CSRs: a client CSR from
// a bootstrap identity while its Node does not exist yet, and serving CSRs
// from the Node itself; each only when the names and addresses are this
// host's. It returns how many pending CSRs are this host's.
func (r *Reconciler) approveCSRs(ctx context.Context, hc kubernetes.Interface, a *v1beta1.Agent, hostname string, nodeExists bool) (int, error) {
	list, err := hc.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list CertificateSigningRequests: %w", err)
	}
	ips := addresses(a)
	mine := 0
	for i := range list.Items {
		csr := &list.Items[i]
		if decided(csr) {
			continue
		}
		why := checkCSR(csr, hostname, ips, nodeExists)
		if why == errNotThisHost {
			continue
		}
		mine++
		if why != "" {
			r.Events.Eventf(a, nil, corev1.EventTypeWarning, "CSRNotApproved", "ApproveCSR", "CSR %s names this host but is not approved: %s", csr.Name, why)
			continue
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AgentbootApproved",
			Message: fmt.Sprintf("agentboot approved the kubelet CSR of Agent %s/%s", a.Namespace, a.Name),
		})
		if _, err := hc.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return mine, fmt.Errorf("approve CSR %s: %w", csr.Name, err)
		}
		r.Events.Eventf(a, nil, corev1.EventTypeNormal, "CSRApproved", "ApproveCSR", "approved %s CSR %s", csr.Spec.SignerName, csr.Name)
	}
	return mine, nil
}

func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return true
		}
	}
	return false
}

const errNotThisHost = "not this host"

// checkCSR returns errNotThisHost for CSRs of other hosts, "" for a CSR to
// approve, or why this host's CSR is refused.
func checkCSR(csr *certificatesv1.CertificateSigningRequest, hostname string, ips []net.IP, nodeExists bool) string {
	node := "system:node:" + hostname
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return errNotThisHost
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || req.Subject.CommonName != node {
		return errNotThisHost
	}
	if err := req.CheckSignature(); err != nil {
		return "its signature does not verify"
	}
	if !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return fmt.Sprintf("organization %q, want [system:nodes]", req.Subject.Organization)
	}
	usages := func(allowed ...certificatesv1.KeyUsage) string {
		for _, u := range csr.Spec.Usages {
			if !slices.Contains(allowed, u) {
				return fmt.Sprintf("usage %q is not one a kubelet asks for", u)
			}
		}
		if !slices.Contains(csr.Spec.Usages, allowed[len(allowed)-1]) {
			return fmt.Sprintf("usages %q lack %q", csr.Spec.Usages, allowed[len(allowed)-1])
		}
		return ""
	}
	switch csr.Spec.SignerName {
	case certificatesv1.KubeAPIServerClientKubeletSignerName:
		switch {
		case nodeExists:
			return "Node " + hostname + " already exists; a new client certificate is the kubelet's own rotation to ask for"
		case csr.Spec.Username != nodeBootstrapper && !strings.HasPrefix(csr.Spec.Username, bootstrapTokenUser):
			return fmt.Sprintf("requested by %q, not a node bootstrap identity", csr.Spec.Username)
		case len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0:
			return "a client certificate must not carry names or addresses"
		}
		return usages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth)
	case certificatesv1.KubeletServingSignerName:
		switch {
		case csr.Spec.Username != node:
			return fmt.Sprintf("requested by %q, not by %s", csr.Spec.Username, node)
		case len(req.EmailAddresses)+len(req.URIs) > 0:
			return "a serving certificate must not carry email addresses or URIs"
		case len(req.DNSNames)+len(req.IPAddresses) == 0:
			return "a serving certificate needs a name or an address"
		}
		for _, d := range req.DNSNames {
			if d != hostname && d != strings.SplitN(hostname, ".", 2)[0] {
				return fmt.Sprintf("DNS name %q is not the host's name %q", d, hostname)
			}
		}
		for _, ip := range req.IPAddresses {
			if !slices.ContainsFunc(ips, ip.Equal) {
				return fmt.Sprintf("IP address %s is not one of the host's", ip)
			}
		}
		return usages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth)
	}
	return errNotThisHost
}

// addresses are the IPs the host reported in its inventory.
func addresses(a *v1beta1.Agent) []net.IP {
	var out []net.IP
	for _, n := range a.Status.Inventory.Interfaces {
		for _, cidr := range append(slices.Clone(n.IPV4Addresses), n.IPV6Addresses...) {
			if ip, _, err := net.ParseCIDR(cidr); err == nil {
				out = append(out, ip)
			} else if ip := net.ParseIP(cidr); ip != nil {
				out = append(out, ip)
			}
		}
	}
	return out
}
