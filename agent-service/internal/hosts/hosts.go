// Package hosts holds what the agent API and the Agent controller agree on:
// how an Agent's liveness Lease is named and labelled, how a host's identity
// and session are recorded, and a host's effective hostname.
package hosts

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"sort"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// Labels and annotations agentboot keeps.
const (
	// LeaseLabel marks agentboot's Agent liveness Leases (in agentboot's
	// own namespace, so that its RBAC on Leases stays there).
	LeaseLabel          = "agentboot.io/agent-lease"
	LeaseNamespaceLabel = "agentboot.io/agent-namespace"
	LeaseNameLabel      = "agentboot.io/agent-name"
	// ClockOffsetAnnotation on a Lease is the host's clock minus the
	// service's, in seconds, at the last renewal.
	ClockOffsetAnnotation = "agentboot.io/clock-offset-seconds"
	// HostnameIndex is the cache index of Agents by effective hostname.
	HostnameIndex = "agentboot.hostname"
	// InfraEnvIndex is the cache index of Agents by the UID of the
	// InfraEnv their host registered through (status.registration), which
	// no tenant can write: an InfraEnv's caps count by it.
	InfraEnvIndex = "agentboot.registration.infraEnvUID"
)

// LeaseName names the Lease of the Agent ns/name.
func LeaseName(ns, name string) string { return "agent." + ns + "." + name }

// LeaseOf returns the Agent a Lease belongs to.
func LeaseOf(l *coordinationv1.Lease) (ns, name string, ok bool) {
	if l.Labels[LeaseLabel] != "true" {
		return "", "", false
	}
	return l.Labels[LeaseNamespaceLabel], l.Labels[LeaseNameLabel], true
}

// MACs returns MAC addresses lower-cased and sorted, as an Agent's
// registration record keeps them.
func MACs(macs []string) []string {
	out := make([]string, 0, len(macs))
	for _, m := range macs {
		out = append(out, strings.ToLower(m))
	}
	sort.Strings(out)
	return out
}

// A host's registration session begins each time a host registers and is
// accepted; the agent token names it, so a token of an earlier session
// stops working. The Agent's registration record (status.registration,
// which tenants cannot write) keeps the session's ID: whoever reads the
// Agent cannot continue the session or make a token from it.

// SessionID is what an Agent records of a session: a SHA-256 digest of its
// secret (128 random bits, so a digest without a key cannot be reversed or
// guessed, and stays valid when the service's signing key changes).
func SessionID(secret string) string {
	sum := sha256.Sum256([]byte("agentboot.io/session\x00" + secret))
	return hex.EncodeToString(sum[:16])
}

// InSession reports, in constant time, whether secret is that of the
// Agent's current session.
func InSession(a *v1beta1.Agent, secret string) bool {
	cur := ""
	if r := a.Status.Registration; r != nil {
		cur = r.Session
	}
	return secret != "" && cur != "" && subtle.ConstantTimeCompare([]byte(SessionID(secret)), []byte(cur)) == 1
}
