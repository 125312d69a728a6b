package agentwire

import (
	"regexp"
	"time"
)

// Paths of the agent API (HTTPS). Versioned: a breaking change adds /v2.
const (
	// RegisterPath is POSTed with the InfraEnv's registration token.
	RegisterPath = "/api/v1/infraenvs/{namespace}/{name}/hosts"
	// Per-host paths take the per-agent token.
	InventoryPath    = "/api/v1/namespaces/{namespace}/agents/{id}/inventory"
	InstructionsPath = "/api/v1/namespaces/{namespace}/agents/{id}/instructions"
	StepResultPath   = "/api/v1/namespaces/{namespace}/agents/{id}/steps/{step}"
	ProgressPath     = "/api/v1/namespaces/{namespace}/agents/{id}/progress"
)

// The worker minimums a host must meet unless its InfraEnv's
// hostRequirements say otherwise: the service validates against them (its
// --min-* flags default to them) and tells the agent the disk minimum, by
// which the agent marks disks eligible.
const (
	DefaultMinCPUCores      = 2
	DefaultMinMemoryBytes   = 8 << 30
	DefaultMinDiskSizeBytes = 100_000_000_000 // 100 GB
)

// DefaultPollInterval is how often a host asks for instructions (its
// heartbeat) unless the service says otherwise (InstructionsResponse's
// PollSeconds; the service's --agent-poll-interval).
const DefaultPollInterval = 20 * time.Second

// MaxInventoryBytes bounds an inventory upload.
const MaxInventoryBytes = 1 << 20

// MaxStoredInventoryBytes bounds the inventory kept in an Agent's status,
// as JSON: a large 2-socket server (256 threads, 26 disks, 8 NICs with
// five addresses each, 8 GPUs; stack.LargeServerInventory) is 18 KiB, the
// 2-core VM CI runs on 2 KiB. Anyone holding a discovery token can upload, so etcd
// holds at most this much per Agent, times the Agents an InfraEnv may have.
const MaxStoredInventoryBytes = 64 << 10

// RegisterRequest is what a host sends to join an InfraEnv.
type RegisterRequest struct {
	// InfraEnvUID is the UID of the InfraEnv the discovery image was made for.
	InfraEnvUID string `json:"infraEnvUID"`
	// HostID is the host's identity: its SMBIOS UUID, or a derived one.
	HostID string `json:"hostID"`
	// Identity is what the host ID was derived from.
	Identity HostIdentity `json:"identity"`
	// AgentVersion of the agent binary (AgentVersionForm; "" from agents
	// that report none).
	AgentVersion string `json:"agentVersion,omitempty"`
	// BootProof, when the host booted an ISO its BareMetalHost's BMC
	// inserted, is the proof that ISO carried (BootProofPath).
	BootProof *BootProof `json:"bootProof,omitempty"`
	// Session is not sent by agents: a live session is never continued
	// (its token is handed out once). A registration naming one while the
	// host is heard from is refused with a SessionRefused event.
	Session string `json:"session,omitempty"`
}

// AgentVersionForm is what an agent's reported version may look like: a
// release (v0.2.0), git describe's output (v0.2.0-3-gabc1234-dirty) or a
// development build's (dev).
var AgentVersionForm = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}$`)

// BootProofPath is where a discovery ISO inserted for one BareMetalHost
// holds its BootProof.
const BootProofPath = "/etc/agentboot/boot-proof.json"

// BootProof ties a boot to the BareMetalHost whose BMC inserted the ISO.
type BootProof struct {
	// BareMetalHost is the host's name, in the InfraEnv's namespace.
	BareMetalHost string `json:"bareMetalHost"`
	// Proof is the manager's signature over the BareMetalHost.
	Proof string `json:"proof"`
}

// HostIdentity are the facts that tell hosts apart.
type HostIdentity struct {
	SystemUUID   string   `json:"systemUUID,omitempty"`
	SerialNumber string   `json:"serialNumber,omitempty"`
	MACAddresses []string `json:"macAddresses"`
}

// RegisterResponse tells the agent how to continue.
type RegisterResponse struct {
	// Namespace and HostID name the Agent resource.
	Namespace string `json:"namespace"`
	HostID    string `json:"hostID"`
	// AgentToken authorises the per-host calls of this host only.
	AgentToken string `json:"agentToken"`
	// PollSeconds is how often to ask for instructions.
	PollSeconds int `json:"pollSeconds"`
	// MinDiskSizeBytes is the smallest disk eligible for installation.
	MinDiskSizeBytes int64 `json:"minDiskSizeBytes"`
}

// Error is the body of every error answer.
type Error struct {
	// Code is a stable identifier the agent branches on.
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	// CodeHostIDConflict: another host already registered with this ID; the
	// agent registers again with its derived ID.
	CodeHostIDConflict = "HostIDConflict"
	// CodeInfraEnvGone: the InfraEnv was deleted; the agent stops.
	CodeInfraEnvGone = "InfraEnvGone"
	// CodeAgentCap: the InfraEnv has as many Agents as it may; the agent
	// retries later.
	CodeAgentCap = "AgentCapReached"
	// CodeUnapprovedCap: the InfraEnv has as many unapproved Agents as it
	// may; the agent retries until some are approved or deleted.
	CodeUnapprovedCap = "UnapprovedCapReached"
	// CodeReleased answers a step result of a host that was unbound from
	// its cluster while it installed: the installation is void, and the
	// agent wipes what it wrote and stays in discovery instead of
	// rebooting into it.
	CodeReleased = "Released"
	// CodeHostActive: the Agent with this identity is still heard from
	// (its host has not stopped, or another host claims to be it); the
	// agent retries after Retry-After. A host rebooting waits out the
	// silence of its earlier boot; a second live host makes the Agent
	// disputed.
	CodeHostActive = "HostActive"
	// CodeIdentityInDoubt: the Agent with this identity is bound to a
	// cluster or installing, and a new registration cannot prove it is the
	// same host: it gets nothing, and the Agent's events say so. The agent
	// retries; once the Agent is unbound it registers into the free pool.
	CodeIdentityInDoubt = "IdentityInDoubt"
)

// InstructionsRequest is the heartbeat: the agent's clock, for the
// ntp-synced validation, and its NTP sources.
type InstructionsRequest struct {
	Time       time.Time   `json:"time"`
	NTPSources []NTPSource `json:"ntpSources,omitempty"`
	// WaitSeconds is how long the agent lets the service hold a heartbeat
	// that has no work for it yet, answering as soon as some comes (a long
	// poll): a host bound to a cluster gets its install step at once, not
	// at its next heartbeat. The service holds it at most MaxWaitSeconds;
	// 0 (older agents): answer at once.
	WaitSeconds int `json:"waitSeconds,omitempty"`
}

// MaxWaitSeconds is the longest a heartbeat is held: well inside the HTTP
// timeouts of the agent (30 s for the answer to begin) and of the service
// (30 s to write it).
const MaxWaitSeconds = 15

// NTPSource is one time source of the host.
type NTPSource struct {
	SourceName  string `json:"sourceName"`
	SourceState string `json:"sourceState"`
}

// Instructions are what the service wants done.
type Instructions struct {
	// Steps to run, in order; empty when there is nothing to do.
	Steps []Step `json:"steps"`
	// PollSeconds until the next heartbeat.
	PollSeconds int `json:"pollSeconds"`
}

// Step kinds.
const (
	StepInstall  = "install"
	StepReboot   = "reboot"
	StepSanitize = "sanitize"
)

// Step is one instruction.
type Step struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Install is set for StepInstall.
	Install *InstallStep `json:"install,omitempty"`
	// Sanitize is set for StepSanitize.
	Sanitize *SanitizeStep `json:"sanitize,omitempty"`
}

// SanitizeStep tells the agent to erase the host's disks before it can be
// bound again (docs/security.md).
type SanitizeStep struct {
	// Level is internal/sanitize's level: metadata or erase.
	Level string `json:"level"`
	// Disks are the disks to sanitize (/dev paths); the agent spares the
	// boot medium and says so.
	Disks []string `json:"disks"`
	// Keep are those of Disks the administrator marked to keep: never
	// erased, reported as skipped.
	Keep []string `json:"keep,omitempty"`
}

// StageSanitizing is the progress stage of a sanitize step: Percentage
// over all its disks, Info what is being erased.
const StageSanitizing = "Sanitizing"

// InstallStep tells the agent to write the OS to a disk.
type InstallStep struct {
	// DiskPath is the target disk (a /dev path).
	DiskPath string `json:"diskPath"`
	// ImageURL is the raw OS disk image to write, with its sha256.
	ImageURL    string `json:"imageURL"`
	ImageSHA256 string `json:"imageSHA256"`
	// Ignition is the config the installed OS reads on first boot.
	Ignition string `json:"ignition"`
}

// DiskSanitization is the evidence of one disk's sanitization: what was
// done, to how many bytes, in how long, and how the result was checked.
type DiskSanitization struct {
	// Disk is the device (a /dev path).
	Disk string `json:"disk"`
	// Method is internal/sanitize's method, and Why the reason for it.
	Method string `json:"method"`
	Why    string `json:"why,omitempty"`
	// Bytes the method covered (the whole disk, or the metadata regions).
	Bytes           int64   `json:"bytes"`
	DurationSeconds float64 `json:"durationSeconds"`
	// Verification names the check, and Checked says what it read.
	Verification string `json:"verification,omitempty"`
	Checked      string `json:"checked,omitempty"`
	// Error is why this disk is not sanitized; empty when it is.
	Error string `json:"error,omitempty"`
}

// StepResult reports how a step went.
type StepResult struct {
	ExitCode int    `json:"exitCode"`
	Output   string `json:"output,omitempty"`
	Error    string `json:"error,omitempty"`
	// Sanitization is a sanitize step's evidence, one entry per disk.
	Sanitization []DiskSanitization `json:"sanitization,omitempty"`
}

// Progress reports an installation stage.
type Progress struct {
	Stage      string `json:"stage"`
	Percentage int    `json:"percentage"`
	Info       string `json:"info,omitempty"`
}
