package lifecycle

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// The agent API's record of a host's registration (status.registration)
// and what the host reports of itself (status.inventory,
// status.ntpSources) change only through these functions.

// MaxSourceAddresses is how many source addresses an Agent keeps: the
// latest ones.
const MaxSourceAddresses = 8

// Session is a registration the agent API accepted: a new boot of the
// discovery image (or a retried one) of the host.
type Session struct {
	// InfraEnv and InfraEnvUID are the InfraEnv it registered through.
	InfraEnv, InfraEnvUID string
	// Identity is the digest of what the host said it is; MACs its MAC
	// addresses.
	Identity string
	MACs     []string
	// ID names the session (derived from its secret, never the secret).
	ID      string
	Started time.Time
	// BootedBy is the UID of the BareMetalHost whose virtual media the
	// host proved it booted from, or "".
	BootedBy string
	// From is the address the registration came from, or "".
	From string
	// AgentVersion is what the host's agent reported of itself.
	AgentVersion string
}

// BeginSession records a new session in the Agent's registration record.
// What outlives a session stays: the addresses the host was seen from, a
// dispute, the Node name of its installation. A contest of the last
// session is over.
func BeginSession(a *v1beta1.Agent, s Session) {
	rec := Registration(a)
	rec.InfraEnv, rec.InfraEnvUID = s.InfraEnv, s.InfraEnvUID
	rec.Identity, rec.MACAddresses = s.Identity, s.MACs
	rec.Session = s.ID
	rec.SessionStarted = s.Started.UTC().Format(time.RFC3339Nano)
	rec.BootedBy, rec.Contested = s.BootedBy, ""
	rec.AgentVersion = s.AgentVersion
	rec.SourceAddresses = withSource(rec.SourceAddresses, s.From)
	a.Status.Registration = &rec
}

// SeenFrom records an address the host connected from, and says whether it
// was new. An Agent with no registration record records nothing.
func SeenFrom(a *v1beta1.Agent, ip string) bool {
	rec := a.Status.Registration
	if rec == nil || ip == "" || slices.Contains(rec.SourceAddresses, ip) {
		return false
	}
	rec.SourceAddresses = withSource(rec.SourceAddresses, ip)
	return true
}

func withSource(seen []string, ip string) []string {
	if ip == "" || slices.Contains(seen, ip) {
		return seen
	}
	seen = append(slices.Clone(seen), ip)
	if len(seen) > MaxSourceAddresses {
		seen = seen[len(seen)-MaxSourceAddresses:]
	}
	return seen
}

// Contest records that a registration with the Agent's identity was
// refused while its host was alive (note says when and from where), unless
// one is recorded already; it says whether it recorded this one.
func Contest(a *v1beta1.Agent, note string) bool {
	rec := a.Status.Registration
	if rec == nil || rec.Contested != "" {
		return false
	}
	rec.Contested = note
	return true
}

// Dispute marks the Agent's identity disputed with msg (a contested
// session was heard from again: two hosts are alive under one identity),
// unless it is already, and ends the contest. It says whether the dispute
// is new.
func Dispute(a *v1beta1.Agent, msg string) bool {
	rec := a.Status.Registration
	if rec == nil {
		return false
	}
	rec.Contested = ""
	if rec.Disputed != "" {
		return false
	}
	rec.Disputed = msg
	return true
}

// RecordInventory stores the host's inventory as reported (its report
// time set by the caller, who decided it is worth a write).
func RecordInventory(a *v1beta1.Agent, inv v1beta1.HostInventory) {
	a.Status.Inventory = inv
}

// SameNTPSources reports whether the Agent records these time sources
// already (none and an empty list are the same).
func SameNTPSources(a *v1beta1.Agent, sources []v1beta1.HostNTPSource) bool {
	return len(sources) == 0 && len(a.Status.NTPSources) == 0 || equality.Semantic.DeepEqual(sources, a.Status.NTPSources)
}

// RecordNTPSources stores the host's time sources.
func RecordNTPSources(a *v1beta1.Agent, sources []v1beta1.HostNTPSource) {
	a.Status.NTPSources = sources
}
