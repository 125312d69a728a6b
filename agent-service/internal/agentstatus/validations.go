package agentstatus

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Requirements are the minimums a host must meet.
type Requirements struct {
	MinCPUCores       int64
	MinMemoryBytes    int64
	MinDiskSizeBytes  int64
	CPUVirtualization bool
	SecureBoot        bool
}

// DefaultRequirements are the worker minimums.
var DefaultRequirements = Requirements{MinCPUCores: agentwire.DefaultMinCPUCores, MinMemoryBytes: agentwire.DefaultMinMemoryBytes, MinDiskSizeBytes: agentwire.DefaultMinDiskSizeBytes}

// For applies an InfraEnv's hostRequirements to the defaults.
func (r Requirements) For(ie *v1beta1.InfraEnv) Requirements {
	if ie == nil || ie.Spec.HostRequirements == nil {
		return r
	}
	h := ie.Spec.HostRequirements
	if h.MinCPUCores > 0 {
		r.MinCPUCores = int64(h.MinCPUCores)
	}
	if b := h.MinMemoryBytes(); b > 0 {
		r.MinMemoryBytes = b
	}
	if b := h.MinDiskSizeBytes(); b > 0 {
		r.MinDiskSizeBytes = b
	}
	r.CPUVirtualization = h.CPUVirtualization
	r.SecureBoot = h.SecureBoot
	return r
}

// Validation IDs: assisted-service's, plus agentboot's cpu-virtualization
// and identity-undisputed.
const (
	HasInventory     = "has-inventory"
	HasMinCPUCores   = "has-min-cpu-cores"
	HasMinMemory     = "has-min-memory"
	HasMinValidDisks = "has-min-valid-disks"
	HostnameValid    = "hostname-valid"
	HostnameUnique   = "hostname-unique"
	CPUVirt          = "cpu-virtualization"
	Connected        = "connected"
	NTPSynced        = "ntp-synced"
	CNVRequirements  = "cnv-requirements-satisfied"
	// IdentityUndisputed fails while two hosts were seen alive under the
	// Agent's identity (status.registration.disputed).
	IdentityUndisputed = "identity-undisputed"
	// DisksSanitized fails while the host owes a disk sanitization
	// (lifecycle.SanitizationOwed): cluster-api-provider-agent takes only
	// Validated Agents, so it skips the host until its evidence is in.
	DisksSanitized = "disks-sanitized"
	// SecureBootEnabled fails when the InfraEnv requires Secure Boot
	// (hostRequirements.secureBoot) and the host did not boot with it.
	SecureBootEnabled = "secure-boot-enabled"
)

// facts is everything a validation looks at.
type facts struct {
	agent        *v1beta1.Agent
	req          Requirements
	connected    bool
	lastSeen     time.Time
	clockOffset  time.Duration
	clockKnown   bool
	sameHostname []string // other Agents with this host's hostname
}

type result struct{ status, message string }

func ok(format string, args ...any) result {
	return result{v1beta1.ValidationSuccess, fmt.Sprintf(format, args...)}
}
func fail(format string, args ...any) result {
	return result{v1beta1.ValidationFailure, fmt.Sprintf(format, args...)}
}

var pending = result{v1beta1.ValidationPending, "Waiting for the host's inventory"}

type validation struct {
	id    string
	check func(f *facts) result
}

// validations by category, in the order they are reported.
var validations = []struct {
	category string
	list     []validation
}{
	{"hardware", []validation{
		{HasInventory, hasInventory},
		{HasMinCPUCores, hasMinCPUCores},
		{HasMinMemory, hasMinMemory},
		{HasMinValidDisks, hasMinValidDisks},
		{HostnameValid, hostnameValid},
		{HostnameUnique, hostnameUnique},
		{CPUVirt, cpuVirtualization},
		{SecureBootEnabled, secureBootEnabled},
		{DisksSanitized, disksSanitized},
	}},
	{"network", []validation{
		{Connected, connected},
		{NTPSynced, ntpSynced},
		{IdentityUndisputed, identityUndisputed},
	}},
	{"operators", []validation{
		{CNVRequirements, cnvRequirements},
	}},
}

func inventoried(f *facts) bool { return f.agent.Status.Inventory.ReportTime != nil }

func hasInventory(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	return ok("Valid inventory exists for the host")
}

func hasMinCPUCores(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	n := f.agent.Status.Inventory.CPU.Count
	if n < f.req.MinCPUCores {
		return fail("The host has %d CPU cores; the minimum is %d", n, f.req.MinCPUCores)
	}
	return ok("Sufficient CPU cores (%d)", n)
}

func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func hasMinMemory(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	m := f.agent.Status.Inventory.Memory.PhysicalBytes
	// Firmware and the kernel keep some memory; allow 3% below the minimum.
	if float64(m) < float64(f.req.MinMemoryBytes)*0.97 {
		return fail("The host has %s of memory; the minimum is %s", gib(m), gib(f.req.MinMemoryBytes))
	}
	return ok("Sufficient memory (%s)", gib(m))
}

func hasMinValidDisks(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	var why []string
	for _, d := range f.agent.Status.Inventory.Disks {
		if d.SizeBytes < f.req.MinDiskSizeBytes {
			why = append(why, fmt.Sprintf("%s: %.1f GB, the minimum is %.0f GB", d.Name, float64(d.SizeBytes)/1e9, float64(f.req.MinDiskSizeBytes)/1e9))
			continue
		}
		if d.InstallationEligibility.Eligible {
			return ok("Sufficient disk: %s (%.1f GB)", d.Name, float64(d.SizeBytes)/1e9)
		}
		why = append(why, d.Name+": "+strings.Join(d.InstallationEligibility.NotEligibleReasons, "; "))
	}
	if len(why) == 0 {
		return fail("The host has no disks")
	}
	return fail("No eligible disk for installation (%s)", strings.Join(why, "; "))
}

var hostnamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func hostnameValid(f *facts) result {
	h := f.agent.Hostname()
	if h == "" {
		return pending
	}
	switch {
	case len(h) > 253 || !hostnamePattern.MatchString(h):
		return fail("Hostname %q is not a valid DNS name (lower-case letters, digits, '-' and '.')", h)
	case h == "localhost" || strings.HasPrefix(h, "localhost."):
		return fail("Hostname %q is not allowed", h)
	}
	return ok("Hostname %s is valid", h)
}

func hostnameUnique(f *facts) result {
	h := f.agent.Hostname()
	if h == "" {
		return pending
	}
	if len(f.sameHostname) > 0 {
		sort.Strings(f.sameHostname)
		return fail("Hostname %s is also used by agent %s: set spec.hostname on one of them", h, strings.Join(f.sameHostname, ", "))
	}
	return ok("Hostname %s is unique in the namespace", h)
}

// cpuVirtualization reports the host's virtualization verdict. It only gates
// readiness when the InfraEnv requires virtualization; otherwise an unusable
// CPU shows as disabled rather than failed.
func cpuVirtualization(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	v := f.agent.Status.Inventory.Virtualization
	if v == nil {
		return result{v1beta1.ValidationError, "The agent did not report CPU virtualization"}
	}
	if v.Verdict == v1beta1.VirtSupported {
		return ok("CPU virtualization is usable: %s", v.Reason)
	}
	if !f.req.CPUVirtualization {
		return result{v1beta1.ValidationDisabled, fmt.Sprintf("CPU virtualization is not usable (%s: %s); the InfraEnv does not require it", v.Verdict, v.Reason)}
	}
	return fail("CPU virtualization is not usable (%s): %s", v.Verdict, v.Reason)
}

func secureBootEnabled(f *facts) result {
	if !inventoried(f) {
		return pending
	}
	b := f.agent.Status.Inventory.Boot
	state := b.SecureBootState
	switch {
	case b.CurrentBootMode == "":
		state = "Unknown (the host did not say how it booted)"
	case b.CurrentBootMode != "uefi":
		state = "not available (the host booted with " + b.CurrentBootMode + ")"
	case state == "":
		state = "Unknown"
	}
	switch {
	case state == "Enabled":
		return ok("The host booted with Secure Boot enabled")
	case !f.req.SecureBoot:
		return result{v1beta1.ValidationDisabled, fmt.Sprintf("Secure Boot is %s; the InfraEnv does not require it", state)}
	}
	return fail("Secure Boot is %s; the InfraEnv requires hosts that boot with Secure Boot enabled (firmware setup, or the BareMetalHost's bootMode UEFISecureBoot)", state)
}

func connected(f *facts) result {
	if f.connected {
		return ok("Host is connected")
	}
	if f.lastSeen.IsZero() {
		return fail("Host has not checked in")
	}
	return fail("Host has not checked in since %s", f.lastSeen.UTC().Format(time.RFC3339))
}

func identityUndisputed(f *facts) result {
	if why := lifecycle.Registration(f.agent).Disputed; why != "" {
		return fail("The host's identity is disputed: %s", why)
	}
	return ok("No other host claims this host's identity")
}

func disksSanitized(f *facts) result {
	ds := f.agent.Status.DiskSanitization
	if !lifecycle.SanitizationOwed(f.agent) {
		return ok("The host owes no disk sanitization")
	}
	owed := fmt.Sprintf("The host's disks must be sanitized (level %s) before it can be bound again (%s)", ds.Required, ds.Reason)
	switch ds.State {
	case v1beta1.SanitizationRunning:
		// Not its progress: that changes every few seconds, and each
		// change would be a status write and an event.
		return fail("%s: sanitizing (status.diskSanitization shows how far)", owed)
	case v1beta1.SanitizationFailed:
		return fail("%s: the last attempt failed: %s", owed, ds.Message)
	}
	return fail("%s: waiting for the host", owed)
}

// maxClockOffset is how far a host's clock may be from the service's.
const maxClockOffset = 4 * time.Minute

func ntpSynced(f *facts) result {
	for _, s := range f.agent.Status.NTPSources {
		if s.SourceState == "synced" {
			return ok("Host NTP is synced to %s", s.SourceName)
		}
	}
	if !f.clockKnown {
		return result{v1beta1.ValidationPending, "Waiting for the host's clock"}
	}
	off := f.clockOffset
	if math.Abs(off.Seconds()) > maxClockOffset.Seconds() {
		return fail("Host clock is %s away from the service's; the maximum is %s: configure NTP (spec.additionalNTPSources)", off.Round(time.Second).String(), maxClockOffset)
	}
	return ok("Host clock is within %s of the service's", maxClockOffset)
}

func cnvRequirements(f *facts) result {
	if !f.req.CPUVirtualization {
		return ok("The InfraEnv does not require CPU virtualization")
	}
	if !inventoried(f) {
		return pending
	}
	if v := f.agent.Status.Inventory.Virtualization; v == nil || v.Verdict != v1beta1.VirtSupported {
		return fail("CPU does not have virtualization support")
	}
	return ok("CPU virtualization is usable for KubeVirt")
}

// validate runs every validation.
func validate(f *facts) v1beta1.ValidationsStatus {
	out := v1beta1.ValidationsStatus{}
	for _, c := range validations {
		var res v1beta1.ValidationResults
		for _, v := range c.list {
			r := v.check(f)
			res = append(res, v1beta1.ValidationResult{ID: v.id, Status: r.status, Message: r.message})
		}
		out[c.category] = res
	}
	return out
}

// summary tells whether validations pass and which do not.
func summary(vs v1beta1.ValidationsStatus) (passing bool, pendingIDs, failing []string) {
	for _, c := range validations {
		for _, v := range vs[c.category] {
			switch v.Status {
			case v1beta1.ValidationFailure, v1beta1.ValidationError:
				failing = append(failing, v.ID)
			case v1beta1.ValidationPending:
				pendingIDs = append(pendingIDs, v.ID)
			}
		}
	}
	return len(failing) == 0 && len(pendingIDs) == 0, pendingIDs, failing
}
