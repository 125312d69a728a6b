// Package hosts holds what the agent API and the Agent controller agree on:
// how an Agent's liveness Lease is named and labelled, the annotations that
// record a host's identity, and a host's effective hostname.
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
	// MACsAnnotation records every MAC address the host registered with;
	// an Agent registered before IdentityAnnotation existed is continued
	// only by a host naming all of them.
	MACsAnnotation = "agentboot.io/mac-addresses"
	// ClockOffsetAnnotation on a Lease is the host's clock minus the
	// service's, in seconds, at the last renewal.
	ClockOffsetAnnotation = "agentboot.io/clock-offset-seconds"
	// HostnameIndex is the cache index of Agents by effective hostname.
	HostnameIndex = "agentboot.hostname"
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

// MACs joins sorted, lower-cased MAC addresses for the annotation.
func MACs(macs []string) string {
	out := make([]string, 0, len(macs))
	for _, m := range macs {
		out = append(out, strings.ToLower(m))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// InfraEnvUID is the UID of the InfraEnv that owns an Agent.
func InfraEnvUID(a *v1beta1.Agent) string {
	for _, o := range a.OwnerReferences {
		if o.Kind == "InfraEnv" && o.APIVersion == v1beta1.GroupVersion.String() {
			return string(o.UID)
		}
	}
	return ""
}

// Annotations of a host's registration session. A session begins each time
// a host registers and is accepted; the agent token names it, so a token of
// an earlier session stops working.
const (
	// SessionAnnotation is the current session's ID (SessionID): a digest
	// of the session's secret, which only the host holds (in its agent
	// token). Whoever reads the Agent cannot continue the session or make
	// a token from it; whoever writes it can only end the session.
	SessionAnnotation = "agentboot.io/session"
	// IdentityAnnotation is a keyed digest of everything the host said it
	// is (host ID, SMBIOS UUID and serial, every MAC address): a later
	// registration must say exactly the same to continue as this Agent.
	IdentityAnnotation = "agentboot.io/identity"
	// ContestedAnnotation is when a registration with this identity was
	// refused because the current session was still alive. If the current
	// session is heard from after that, two hosts claim one identity.
	ContestedAnnotation = "agentboot.io/contested-at"
)

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
	cur := a.Annotations[SessionAnnotation]
	return secret != "" && cur != "" && subtle.ConstantTimeCompare([]byte(SessionID(secret)), []byte(cur)) == 1
}
