package worker

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// The identity OpenShift kubelets bootstrap with, exactly as
// cluster-machine-approver wants it (csr_check.go): the node-bootstrapper
// ServiceAccount with exactly its groups. Bootstrap tokens
// (system:bootstrap:*) are not accepted: anyone holding one could ask.
const nodeBootstrapper = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper"

var nodeBootstrapperGroups = []string{"system:authenticated", "system:serviceaccounts", "system:serviceaccounts:openshift-machine-config-operator"}

// Limits of automatic approval, as cluster-machine-approver's.
const (
	// MaxPendingCSRs is how many undecided CSRs a hosted cluster may hold
	// before nothing more is approved there: a flood is an attack or a
	// fault for a person to look at.
	MaxPendingCSRs = 100
	// maxClientCSRAge: a client CSR older than this is not looked at.
	maxClientCSRAge = time.Hour
	// defaultClockSkew: a CSR may predate its AgentMachine by this much
	// (Reconciler.ClockSkew).
	defaultClockSkew = 10 * time.Second
	// maxListedCSRs bounds how many kubelet CSRs are read from one hosted
	// cluster per visit (pages of csrPage, by signer): past it, nothing is
	// approved there.
	maxListedCSRs = 2000
)

// csrPage is how many CSRs one list call asks for (a variable: tests page
// through a few).
var csrPage int64 = 250

// kubeletSigners are the signers of the CSRs agentboot approves; the
// hosted cluster's CSRs are listed by them (a field selector), never all.
var kubeletSigners = []string{certificatesv1.KubeAPIServerClientKubeletSignerName, certificatesv1.KubeletServingSignerName}

// listKubeletCSRs lists the hosted cluster's kubelet CSRs, page by page,
// up to maxListedCSRs, all as of one resourceVersion: the first list's.
// (Two lists at different versions let a flood seen in an older one hide
// from a CSR seen in a newer one: a serving CSR created after 101 others was
// approved beside a count of 69.)
func listKubeletCSRs(ctx context.Context, hc kubernetes.Interface) ([]certificatesv1.CertificateSigningRequest, error) {
	var out []certificatesv1.CertificateSigningRequest
	rv := ""
	for _, signer := range kubeletSigners {
		opts := metav1.ListOptions{FieldSelector: "spec.signerName=" + signer, Limit: csrPage}
		if rv != "" {
			opts.ResourceVersion, opts.ResourceVersionMatch = rv, metav1.ResourceVersionMatchExact
		}
		for {
			list, err := hc.CertificatesV1().CertificateSigningRequests().List(ctx, opts)
			if err != nil {
				return nil, fmt.Errorf("list CertificateSigningRequests of %s: %w", signer, err)
			}
			if rv == "" {
				rv = list.ResourceVersion
			}
			out = append(out, list.Items...)
			if len(out) > maxListedCSRs {
				return nil, fmt.Errorf("the hosted cluster holds more than %d kubelet CSRs: nothing is approved there until they are cleared", maxListedCSRs)
			}
			if list.Continue == "" {
				break
			}
			// A continue token carries its version; it may not be given twice.
			opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = list.Continue, "", ""
		}
	}
	return out, nil
}

// csrListAge is how long one list of a hosted cluster's kubelet CSRs
// serves all its hosts' polls: 200 hosts joining a cluster, polled every
// 2 s, list them once a second, not 100 times. A CSR is approved only on
// a list made for that poll (approveCSRs lists again first).
const csrListAge = time.Second

// csrLists are the latest kubelet CSRs of each hosted cluster (by its
// client), listed at most once per csrListAge, and again at once after
// an approval there. One list call at a time per cluster: the others
// wait for it (or for their own request's end), and share its answer,
// its error too, so that a cluster whose apiserver hangs holds one poll
// for the call's timeout, not each of them in turn.
type csrLists struct {
	mu sync.Mutex
	m  map[kubernetes.Interface]*csrList
}

type csrList struct {
	// changes counts approvals in the cluster: a list begun before one is
	// not served after it.
	changes atomic.Uint64
	// The rest under csrLists.mu.
	stored   uint64 // lists kept so far: a waiter takes only one made while it waited
	seen     uint64 // changes when it was listed
	at       time.Time
	items    []certificatesv1.CertificateSigningRequest
	err      error
	inflight chan struct{} // closed when the list being made is done
	used     time.Time
}

// list returns hc's kubelet CSRs, shared: the slice and its CSRs must not
// be changed. fresh asks for a list made now (not one up to csrListAge
// old); cached says the answer was shared.
func (l *csrLists) list(ctx context.Context, hc kubernetes.Interface, now time.Time, fresh bool) (items []certificatesv1.CertificateSigningRequest, cached bool, err error) {
	l.mu.Lock()
	e := l.entry(hc, now)
	if !fresh && e.stored > 0 && e.seen == e.changes.Load() && now.Sub(e.at) < csrListAge && !now.Before(e.at) {
		items, err := e.items, e.err
		l.mu.Unlock()
		return items, true, err
	}
	for e.inflight != nil {
		done, stored := e.inflight, e.stored
		l.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		l.mu.Lock()
		// The list that was being made when this poll came is its answer,
		// however long it took (a hung apiserver's error too), unless an
		// approval was made since or a list made now is asked for.
		if !fresh && e.stored != stored && e.seen == e.changes.Load() {
			items, err := e.items, e.err
			l.mu.Unlock()
			return items, true, err
		}
	}
	done := make(chan struct{})
	e.inflight = done
	changes := e.changes.Load()
	l.mu.Unlock()
	finished := false
	defer func() { // also when the list panics: its waiters list again
		l.mu.Lock()
		defer l.mu.Unlock()
		// Kept unless this poll's own request ended: its error is not the
		// cluster's.
		if finished && ctx.Err() == nil {
			e.items, e.err, e.seen, e.at = items, err, changes, now
			e.stored++
		}
		e.inflight = nil
		close(done)
	}()
	items, err = listKubeletCSRs(ctx, hc)
	finished = true
	return items, false, err
}

// changed says an approval was made (or tried) in hc's cluster.
func (l *csrLists) changed(hc kubernetes.Interface) {
	l.mu.Lock()
	e := l.m[hc]
	l.mu.Unlock()
	if e != nil {
		e.changes.Add(1)
	}
}

// entry is hc's list, made on first use; lists unused for a minute (a
// cluster without joining hosts, a client replaced on rotation) are
// dropped. l.mu is held.
func (l *csrLists) entry(hc kubernetes.Interface, now time.Time) *csrList {
	if l.m == nil {
		l.m = map[kubernetes.Interface]*csrList{}
	}
	for k, e := range l.m {
		if k != hc && e.inflight == nil && now.Sub(e.used) > time.Minute {
			delete(l.m, k)
		}
	}
	e, ok := l.m[hc]
	if !ok {
		e = &csrList{}
		l.m[hc] = e
	}
	e.used = now
	return e
}

// csrContext is what a CSR of this host is checked against.
type csrContext struct {
	hostname string
	// ips are the addresses the host reported; seen those it was seen
	// connecting to the agent API from.
	ips, seen  []net.IP
	behindNAT  bool
	nodeExists bool
	// machineCreated is when the host's AgentMachine was created; a CSR
	// created more than clockSkew before it was not made for this
	// installation. rebooted, when known, is when the host reported
	// Rebooting: its kubelet starts after that, so a client CSR from
	// before was not its kubelet's. approved is the client CSR already
	// approved for this Node; clients are the pending client CSRs that
	// name it (more than one: which is the kubelet's cannot be told).
	machineCreated time.Time
	rebooted       time.Time
	clockSkew      time.Duration
	approved       string
	clients        []string
}

// notBefore is the earliest creation time of a CSR made for this
// installation.
func (cc csrContext) notBefore() time.Time { return cc.machineCreated.Add(-cc.clockSkew) }

// clientNotBefore is the earliest creation time of this host's kubelet's
// client CSR, and what that time is.
func (cc csrContext) clientNotBefore() (time.Time, string) {
	if cc.rebooted.After(cc.machineCreated) {
		return cc.rebooted.Add(-cc.clockSkew), "the host reported Rebooting"
	}
	return cc.notBefore(), "this host's machine was created"
}

// approveCSRs approves this host's pending kubelet CSRs: one client CSR from
// the node bootstrapper while its Node does not exist yet, made for this
// installation, and serving CSRs from the Node itself; each only when the
// names and addresses are this host's. It returns how many pending CSRs
// are this host's, and how many it approved. machineCreated is when its
// AgentMachine was created, rebooted when the host reported Rebooting
// (zero: not known). confirm is asked before the first approval whether the
// binding still holds.
func (r *Reconciler) approveCSRs(ctx context.Context, hc kubernetes.Interface, a *v1beta1.Agent, hostname string, nodeExists bool, machineCreated, rebooted time.Time, confirm func() error) (mine, approved int, err error) {
	mine, approved, err = r.approveFrom(ctx, hc, a, hostname, nodeExists, machineCreated, rebooted, confirm, false)
	if errors.Is(err, errListAgain) {
		// Something to approve, seen in a shared list up to a second old:
		// decided again on one made now (a second client CSR for the same
		// Node, or a flood, made since must be seen).
		return r.approveFrom(ctx, hc, a, hostname, nodeExists, machineCreated, rebooted, confirm, true)
	}
	return mine, approved, err
}

var errListAgain = errors.New("approve on a list made now")

func (r *Reconciler) approveFrom(ctx context.Context, hc kubernetes.Interface, a *v1beta1.Agent, hostname string, nodeExists bool, machineCreated, rebooted time.Time, confirm func() error, fresh bool) (mine, approved int, err error) {
	items, cached, err := r.csrs.list(ctx, hc, r.Now(), fresh)
	if err != nil {
		return 0, 0, err
	}
	cc := csrContext{hostname: hostname, ips: addresses(a), seen: sourceAddresses(a), behindNAT: r.BehindNAT, nodeExists: nodeExists,
		machineCreated: machineCreated, rebooted: rebooted, clockSkew: r.ClockSkew}
	pending := 0
	for i := range items {
		csr := &items[i]
		switch {
		case !decided(csr):
			pending++
		case approvedClient(csr, hostname) && !csr.CreationTimestamp.Time.Before(cc.notBefore()):
			cc.approved = csr.Name
		}
	}
	// The client CSRs that pass every other check: with more than one,
	// which is the kubelet's cannot be told. One refused for its own
	// reason (planted before the reboot, say) blocks nobody.
	alone := cc // each judged as if it were the only one
	for i := range items {
		csr := &items[i]
		if !decided(csr) && clientOf(csr, hostname) && checkCSR(csr, alone, r.Now()) == "" {
			cc.clients = append(cc.clients, csr.Name)
		}
	}
	for i := range items {
		csr := &items[i]
		if decided(csr) {
			continue
		}
		why := checkCSR(csr, cc, r.Now())
		if why == errNotThisHost {
			continue
		}
		mine++
		switch {
		case why != "":
		case r.NoCSRApproval:
			why = "automatic approval is off (--approve-kubelet-csrs=false): approve it by hand once you have checked it"
		case pending > MaxPendingCSRs:
			why = fmt.Sprintf("the hosted cluster holds %d undecided CSRs, more than %d: nothing is approved there until they are cleared", pending, MaxPendingCSRs)
		}
		if why != "" {
			r.refuse(a, csr.Name, why)
			continue
		}
		if cached {
			return mine, approved, errListAgain
		}
		if err := confirm(); err != nil {
			return mine, approved, err
		}
		csr = csr.DeepCopy() // the list is shared with the cluster's other hosts' polls
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AgentbootApproved",
			Message: fmt.Sprintf("agentboot approved the kubelet CSR of Agent %s/%s", a.Namespace, a.Name),
		})
		_, err := hc.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		// Approved or not, the list no longer says what the cluster has.
		r.csrs.changed(hc)
		if err != nil {
			return mine, approved, fmt.Errorf("approve CSR %s: %w", csr.Name, err)
		}
		approved++
		if csr.Spec.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName {
			cc.approved = csr.Name
		}
		r.Events.Eventf(a, nil, corev1.EventTypeNormal, "CSRApproved", "ApproveCSR", "approved %s CSR %s", csr.Spec.SignerName, csr.Name)
	}
	return mine, approved, nil
}

func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return true
		}
	}
	return false
}

// refuse records, once per CSR and reason, why a CSR naming this host is
// left pending.
func (r *Reconciler) refuse(a *v1beta1.Agent, csr, why string) {
	key := a.Namespace + "/" + a.Name + "/" + csr
	if said, ok := r.refused.Get(key); ok && said == why {
		return
	}
	r.refused.Add(key, why)
	r.Events.Eventf(a, nil, corev1.EventTypeWarning, "CSRNotApproved", "ApproveCSR", "CSR %s names this host but is not approved: %s", csr, why)
}

// clientOf is a kubelet client CSR naming hostname's Node.
func clientOf(csr *certificatesv1.CertificateSigningRequest, hostname string) bool {
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		return false
	}
	req, err := parseRequest(csr)
	return err == nil && req.Subject.CommonName == "system:node:"+hostname
}

// approvedClient is an approved kubelet client CSR for hostname's Node.
func approvedClient(csr *certificatesv1.CertificateSigningRequest, hostname string) bool {
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		return false
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			req, err := parseRequest(csr)
			return err == nil && req.Subject.CommonName == "system:node:"+hostname
		}
	}
	return false
}

func parseRequest(csr *certificatesv1.CertificateSigningRequest) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("not a PEM certificate request")
	}
	return x509.ParseCertificateRequest(block.Bytes)
}

const errNotThisHost = "not this host"

// checkCSR returns errNotThisHost for CSRs of other hosts, "" for a CSR to
// approve, or why this host's CSR is refused.
func checkCSR(csr *certificatesv1.CertificateSigningRequest, cc csrContext, now time.Time) string {
	hostname, ips, nodeExists := cc.hostname, cc.ips, cc.nodeExists
	node := "system:node:" + hostname
	req, err := parseRequest(csr)
	if err != nil || req.Subject.CommonName != node {
		return errNotThisHost
	}
	if created := csr.CreationTimestamp.Time; created.Before(cc.notBefore()) {
		return fmt.Sprintf("it was created at %s, before this host's machine (%s): it was not made for this installation",
			created.UTC().Format(time.RFC3339), cc.machineCreated.UTC().Format(time.RFC3339))
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
		groups := slices.Sorted(slices.Values(csr.Spec.Groups))
		from, what := cc.clientNotBefore()
		switch {
		case nodeExists:
			return "Node " + hostname + " already exists; a new client certificate is the kubelet's own rotation to ask for"
		case cc.approved != "":
			return "client CSR " + cc.approved + " was already approved for this Node: one per installation"
		case csr.Spec.Username != nodeBootstrapper:
			return fmt.Sprintf("requested by %q, not by %s", csr.Spec.Username, nodeBootstrapper)
		case csr.CreationTimestamp.Time.Before(from):
			return fmt.Sprintf("it was created at %s, before %s (%s): it is not this installation's kubelet's",
				csr.CreationTimestamp.UTC().Format(time.RFC3339), what, from.Add(cc.clockSkew).UTC().Format(time.RFC3339))
		case !slices.Equal(slices.Compact(groups), nodeBootstrapperGroups):
			return fmt.Sprintf("requested with groups %q, not exactly the node bootstrapper's %q", csr.Spec.Groups, nodeBootstrapperGroups)
		case now.Sub(csr.CreationTimestamp.Time) > maxClientCSRAge:
			return fmt.Sprintf("it has been pending since %s, more than %s", csr.CreationTimestamp.UTC().Format(time.RFC3339), maxClientCSRAge)
		case len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0:
			return "a client certificate must not carry names or addresses"
		case len(cc.clients) > 1:
			// Last: each of them is told its own problem first.
			return fmt.Sprintf("%d pending client CSRs name Node %s (%s): which one is this host's kubelet cannot be told; approve it by hand and deny the others", len(cc.clients), hostname, strings.Join(cc.clients, ", "))
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
		// Every address must be one the host was seen connecting from,
		// not only one it reported (which could be a VIP); unless the
		// admin said the agent API sees no host's own address
		// (--agent-api-behind-nat): then the report is all there is.
		for _, ip := range req.IPAddresses {
			switch {
			case !slices.ContainsFunc(ips, ip.Equal):
				return fmt.Sprintf("IP address %s is not one of the host's", ip)
			case !cc.behindNAT && !slices.ContainsFunc(cc.seen, ip.Equal):
				return fmt.Sprintf("IP address %s is one the host reported but was never seen using (it connected from %s): a host may not claim an address it does not use, such as a VIP; approve it by hand if it is the host's", ip, joinIPs(cc.seen))
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

// sourceAddresses are the addresses the host was seen connecting from.
func sourceAddresses(a *v1beta1.Agent) []net.IP {
	var out []net.IP
	for _, s := range lifecycle.Registration(a).SourceAddresses {
		if ip := net.ParseIP(s); ip != nil {
			out = append(out, ip)
		}
	}
	return out
}

func joinIPs(ips []net.IP) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
