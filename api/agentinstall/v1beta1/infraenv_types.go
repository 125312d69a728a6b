package v1beta1

import (
	"math"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InfraEnvNameLabel is set on every Agent to the name of the InfraEnv it
// registered through; an InfraEnv's status.agentLabelSelector selects on it.
const InfraEnvNameLabel = "infraenvs.agent-install.openshift.io"

// PXEDefaultLabel ("true") marks the InfraEnv that network-booting hosts
// no BareMetalHost claims boot into (an agentboot extension). At most one
// InfraEnv in the cluster may carry it.
const PXEDefaultLabel = "agentboot.io/pxe-default"

// ImageCreatedCondition reports whether the discovery image can be served.
const ImageCreatedCondition ConditionType = "ImageCreated"

// Reasons of the ImageCreated condition.
const (
	ImageCreatedReason       = "ImageCreated"
	ImageCreationErrorReason = "ImageCreationError"
)

// CPU architectures an InfraEnv can ask for. arm64 and aarch64 are the same
// architecture under two names; both are accepted, as in assisted-service.
const (
	CPUArchitectureX86_64  = "x86_64"
	CPUArchitectureAarch64 = "aarch64"
	CPUArchitectureArm64   = "arm64"
	CPUArchitecturePPC64le = "ppc64le"
	CPUArchitectureS390x   = "s390x"
)

// ImageType selects the discovery ISO flavour.
// +kubebuilder:validation:Enum=full-iso;minimal-iso
type ImageType string

// Discovery ISO flavours.
const (
	// ImageTypeFullISO carries the whole live OS (the default).
	ImageTypeFullISO ImageType = "full-iso"
	// ImageTypeMinimalISO leaves out the root filesystem, which the host then
	// downloads at boot from the URL in its kernel arguments.
	ImageTypeMinimalISO ImageType = "minimal-iso"
)

// IPXEScriptType selects what the InfraEnv's iPXE script does.
// +kubebuilder:validation:Enum="";DiscoveryImageAlways;BootOrderControl
type IPXEScriptType string

// iPXE script behaviours.
const (
	// DiscoveryImageAlways boots the discovery image every time.
	DiscoveryImageAlways IPXEScriptType = "DiscoveryImageAlways"
	// BootOrderControl boots discovery until the host is installed, then lets
	// iPXE fall through to the local disk, for hosts that always boot from the
	// network first.
	BootOrderControl IPXEScriptType = "BootOrderControl"
)

// Proxy is the HTTP proxy configuration for discovery and installation.
type Proxy struct {
	// HTTPProxy is the URL of the proxy for HTTP requests.
	// +optional
	HTTPProxy string `json:"httpProxy,omitempty"`
	// HTTPSProxy is the URL of the proxy for HTTPS requests.
	// +optional
	HTTPSProxy string `json:"httpsProxy,omitempty"`
	// NoProxy is a comma-separated list of destinations that bypass the proxy.
	// +optional
	NoProxy string `json:"noProxy,omitempty"`
}

// KernelArgument changes one kernel argument of the discovery image.
type KernelArgument struct {
	// Operation is what to do with Value: append it, replace the argument of
	// the same key ("key=value"), or delete it.
	// +kubebuilder:validation:Enum=append;replace;delete
	// +kubebuilder:default=append
	// +optional
	Operation string `json:"operation,omitempty"`
	// Value is one kernel argument, such as "console=ttyS0,115200n8". Spaces
	// are allowed only inside double quotes; newlines, control characters and
	// '#' are rejected because they would break out of the iPXE script or the
	// ISO's kernel-argument area. iPXE knows no quotes: it splits a line at
	// spaces and ends a command at a word ";", "&&" or "||", and it expands
	// "${...}" from settings a DHCP server can set, so none of these may
	// appear either.
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^| )(;|&&|[|][|])( |$)') && !self.contains('${')",message="must not hold a word ';', '&&' or '||' (iPXE command separators) or '${' (iPXE settings expansion)"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches('^(?:[^\\\\x00-\\\\x20\\\\x7f\"#]+|\"[^\\\\x00-\\\\x1f\\\\x7f\"#]*\")+$')",message="must be one kernel argument: no newline, control character or '#', and spaces only inside double quotes"
	Value string `json:"value"`
}

// AgentApproval decides how new Agents of an InfraEnv get approved.
type AgentApproval struct {
	// AutoApprove approves every Agent of this InfraEnv on registration.
	// Without it an administrator approves each one
	// (kubectl patch agent X --type merge --patch '{"spec":{"approved":true}}'),
	// unless the host was declared through a BareMetalHost.
	// +kubebuilder:default=false
	// +optional
	AutoApprove bool `json:"autoApprove,omitempty"`
}

// HostRequirements are what a host of this InfraEnv needs to be ready for a
// cluster; unset fields use the service's defaults (2 cores, 8 GiB, 100 GB).
type HostRequirements struct {
	// CPUVirtualization requires hosts that can run virtual machines (for
	// KubeVirt workloads): hosts whose CPU virtualization is unusable fail
	// the cnv-requirements-satisfied validation and are not ready.
	// +optional
	CPUVirtualization bool `json:"cpuVirtualization,omitempty"`
	// SecureBoot requires hosts that booted discovery with UEFI Secure
	// Boot enforced: hosts that report it disabled, or booted with BIOS,
	// fail the secure-boot-enabled validation and are not ready.
	// +optional
	SecureBoot bool `json:"secureBoot,omitempty"`
	// MinCPUCores is the fewest logical CPUs a host may have.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinCPUCores int32 `json:"minCPUCores,omitempty"`
	// MinMemoryMiB is the least memory a host may have, in MiB.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinMemoryMiB int64 `json:"minMemoryMiB,omitempty"`
	// MinDiskSizeGB is the smallest installation disk, in GB (10^9 bytes).
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinDiskSizeGB int64 `json:"minDiskSizeGB,omitempty"`
}

// MinDiskSizeBytes is MinDiskSizeGB in bytes (0 when unset), saturated
// rather than overflowed for a value no disk has.
func (h *HostRequirements) MinDiskSizeBytes() int64 {
	if h == nil || h.MinDiskSizeGB <= 0 {
		return 0
	}
	return min(h.MinDiskSizeGB, math.MaxInt64/1_000_000_000) * 1_000_000_000
}

// MinMemoryBytes is MinMemoryMiB in bytes (0 when unset), saturated.
func (h *HostRequirements) MinMemoryBytes() int64 {
	if h == nil || h.MinMemoryMiB <= 0 {
		return 0
	}
	return min(h.MinMemoryMiB, math.MaxInt64>>20) << 20
}

// InfraEnvSpec describes a discovery environment: what goes into the
// discovery image that hosts boot to register as Agents.
// +kubebuilder:validation:XValidation:rule="self.cpuArchitecture == oldSelf.cpuArchitecture",message="cpuArchitecture is immutable: create a new InfraEnv for another architecture"
type InfraEnvSpec struct {
	// PullSecretRef names a Secret of type kubernetes.io/dockerconfigjson in the
	// InfraEnv's namespace, used to pull images during installation.
	PullSecretRef *corev1.LocalObjectReference `json:"pullSecretRef"`

	// SSHAuthorizedKey is added for user core on discovered hosts, for
	// debugging.
	// +optional
	SSHAuthorizedKey string `json:"sshAuthorizedKey,omitempty"`

	// Proxy configures an HTTP proxy for the discovery agent.
	// +optional
	Proxy *Proxy `json:"proxy,omitempty"`

	// AdditionalNTPSources are NTP servers (names or addresses) that
	// discovered hosts use in addition to those from DHCP.
	// +optional
	AdditionalNTPSources []string `json:"additionalNTPSources,omitempty"`

	// AdditionalTrustBundle is a PEM bundle of CA certificates trusted by
	// discovered hosts, for example for a proxy or a mirror registry.
	// +optional
	AdditionalTrustBundle string `json:"additionalTrustBundle,omitempty"`

	// AgentLabels are copied onto every Agent that registers through this
	// InfraEnv.
	// +optional
	AgentLabels map[string]string `json:"agentLabels,omitempty"`

	// NMStateConfigLabelSelector selects the NMStateConfigs (in the same
	// namespace) whose static network configuration is baked into the image.
	// +optional
	NMStateConfigLabelSelector metav1.LabelSelector `json:"nmStateConfigLabelSelector,omitempty"`

	// ClusterRef binds every Agent of this InfraEnv to one cluster at
	// registration. Empty means late binding: Agents join a free pool and are
	// bound later (for example by a NodePool).
	// +optional
	ClusterRef *ClusterReference `json:"clusterRef,omitempty"`

	// CPUArchitecture of the hosts this image boots. Immutable.
	// +kubebuilder:validation:Enum=x86_64;aarch64;arm64;ppc64le;s390x
	// +kubebuilder:default=x86_64
	// +optional
	CPUArchitecture string `json:"cpuArchitecture,omitempty"`

	// OSImageVersion picks the discovery OS image from the catalog; empty
	// picks the newest one for the architecture.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	OSImageVersion string `json:"osImageVersion,omitempty"`

	// ImageType is the discovery ISO flavour: full-iso (the default) or
	// minimal-iso.
	// +optional
	ImageType ImageType `json:"imageType,omitempty"`

	// IPXEScriptType is DiscoveryImageAlways (the default) or
	// BootOrderControl.
	// +kubebuilder:default=DiscoveryImageAlways
	// +optional
	IPXEScriptType IPXEScriptType `json:"ipxeScriptType"`

	// KernelArguments change the kernel command line of the discovery image.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	KernelArguments []KernelArgument `json:"kernelArguments,omitempty"`

	// IgnitionConfigOverride is an Ignition config (JSON) merged into the
	// discovery Ignition.
	// +optional
	IgnitionConfigOverride string `json:"ignitionConfigOverride,omitempty"`

	// AgentApproval decides whether Agents are approved on registration.
	// +optional
	AgentApproval *AgentApproval `json:"agentApproval,omitempty"`

	// HostRequirements are what hosts need to be ready (agentboot
	// extension).
	// +optional
	HostRequirements *HostRequirements `json:"hostRequirements,omitempty"`
}

// BootArtifacts are the URLs for booting the discovery image from the network.
type BootArtifacts struct {
	// InitrdURL is the discovery initrd, with the discovery Ignition appended.
	// +optional
	InitrdURL string `json:"initrd"`
	// RootfsURL is the live root filesystem.
	// +optional
	RootfsURL string `json:"rootfs"`
	// KernelURL is the kernel.
	// +optional
	KernelURL string `json:"kernel"`
	// IpxeScriptURL is an iPXE script that boots the above.
	// +optional
	IpxeScriptURL string `json:"ipxeScript"`
	// DiscoveryIgnitionURL is the discovery Ignition config itself.
	// +optional
	DiscoveryIgnitionURL string `json:"discoveryIgnitionURL"`
}

// InfraEnvDebugInfo holds URLs that help debugging.
type InfraEnvDebugInfo struct {
	// EventsURL lists the InfraEnv's events.
	// +optional
	EventsURL string `json:"eventsURL"`
}

// InfraEnvStatus is what the InfraEnv controller observed and published.
type InfraEnvStatus struct {
	// ISODownloadURL is the signed URL of the discovery ISO. It changes
	// whenever the image content changes.
	// +optional
	ISODownloadURL string `json:"isoDownloadURL,omitempty"`
	// CreatedTime is when the current image content was generated.
	// +optional
	CreatedTime *metav1.Time `json:"createdTime,omitempty"`
	// Conditions: ImageCreated.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
	// AgentLabelSelector selects the Agents of this InfraEnv.
	// +optional
	AgentLabelSelector metav1.LabelSelector `json:"agentLabelSelector,omitempty"`
	// DebugInfo holds URLs that help debugging.
	// +optional
	DebugInfo InfraEnvDebugInfo `json:"debugInfo"`
	// BootArtifacts are the signed URLs for network boot.
	// +optional
	BootArtifacts BootArtifacts `json:"bootArtifacts"`
}

// InfraEnv is a discovery environment: it publishes a discovery ISO and
// network-boot artifacts; hosts that boot them register as Agents.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="ISO Created At",type="string",JSONPath=".status.createdTime",description="When the discovery image content was generated"
// +kubebuilder:printcolumn:name="ISO URL",type="string",JSONPath=".status.isoDownloadURL",description="The discovery ISO download URL",priority=1
type InfraEnv struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired discovery environment.
	Spec InfraEnvSpec `json:"spec,omitempty"`
	// Status is what the controller observed and published.
	Status InfraEnvStatus `json:"status,omitempty"`
}

// InfraEnvList is a list of InfraEnvs.
//
// +kubebuilder:object:root=true
type InfraEnvList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InfraEnv `json:"items"`
}
