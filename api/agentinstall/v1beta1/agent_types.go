package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of an Agent.
const (
	SpecSyncedCondition      ConditionType = "SpecSynced"
	ConnectedCondition       ConditionType = "Connected"
	RequirementsMetCondition ConditionType = "RequirementsMet"
	ValidatedCondition       ConditionType = "Validated"
	InstalledCondition       ConditionType = "Installed"
	BoundCondition           ConditionType = "Bound"
)

// Condition reasons of an Agent, grouped by condition type.
const (
	SyncOKReason       = "SyncOK"
	BackendErrorReason = "BackendError"
	InputErrorReason   = "InputError"

	AgentConnectedReason    = "AgentIsConnected"
	AgentDisconnectedReason = "AgentIsDisconnected"

	AgentReadyReason               = "AgentIsReady"
	AgentNotReadyReason            = "AgentNotReady"
	AgentIsNotApprovedReason       = "AgentIsNotApproved"
	AgentAlreadyInstallingReason   = "AgentAlreadyInstalling"
	AgentInstallationStoppedReason = "AgentInstallationStopped"
	AgentRequirementsBinding       = "Binding"
	AgentRequirementsUnbinding     = "Unbinding"
	ValidationsPassingReason       = "ValidationsPassing"
	ValidationsFailingReason       = "ValidationsFailing"
	ValidationsUserPendingReason   = "ValidationsUserPending"
	ValidationsUnknownReason       = "ValidationsUnknown"
	InstallationNotStartedReason   = "InstallationNotStarted"
	InstallationInProgressReason   = "InstallationInProgress"
	InstallationCompletedReason    = "InstallationCompleted"
	InstallationFailedReason       = "InstallationFailed"
	BoundReason                    = "Bound"
	UnboundReason                  = "Unbound"
	BindingReason                  = "Binding"
	UnbindingReason                = "Unbinding"
	UnbindingPendingUserActionRsn  = "UnbindingPendingUserAction"
)

// AgentRole is the role a host takes in its cluster.
// +kubebuilder:validation:Enum="";auto-assign;master;worker
type AgentRole string

// Agent roles.
const (
	AgentRoleAutoAssign AgentRole = "auto-assign"
	AgentRoleMaster     AgentRole = "master"
	AgentRoleWorker     AgentRole = "worker"
)

// Labels kept on Agents.
const (
	// BMHLabel marks an Agent matched to a BareMetalHost (value: its name).
	BMHLabel = "agent-install.openshift.io/bmh"
	// InventoryLabelPrefix prefixes the inventory summary labels.
	InventoryLabelPrefix = "inventory.agent-install.openshift.io/"
)

// IgnitionEndpointTokenReference names the Secret holding the token for the
// cluster's Ignition endpoint.
type IgnitionEndpointTokenReference struct {
	// Namespace of the Secret.
	Namespace string `json:"namespace"`
	// Name of the Secret, whose key "ignition-token" holds the token.
	Name string `json:"name"`
}

// AgentSpec is what the administrator (or a binder) decides about a host.
type AgentSpec struct {
	// ClusterDeploymentName is the cluster this host is bound to; empty means
	// it is in the free pool.
	// +optional
	ClusterDeploymentName *ClusterReference `json:"clusterDeploymentName,omitempty"`
	// Role of the host in its cluster.
	Role AgentRole `json:"role"`
	// Hostname requested for the host; empty keeps the discovered one.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// MachineConfigPool the host joins.
	// +optional
	MachineConfigPool string `json:"machineConfigPool,omitempty"`
	// Approved lets the host be bound and installed. False until an
	// administrator approves it, unless it was declared through a
	// BareMetalHost or its InfraEnv approves automatically.
	Approved bool `json:"approved"`
	// InstallationDiskID is the id of the inventory disk to install to; empty
	// picks the best eligible disk.
	// +optional
	InstallationDiskID string `json:"installation_disk_id,omitempty"`
	// InstallationDiskPath is a /dev/disk/by-id or by-path path of the disk to
	// install to, as an alternative to InstallationDiskID.
	// +optional
	InstallationDiskPath string `json:"installation_disk_path,omitempty"`
	// InstallerArgs are extra installer arguments, as a JSON array of strings.
	// +optional
	InstallerArgs string `json:"installerArgs,omitempty"`
	// IgnitionConfigOverrides is an Ignition config (JSON) merged into the
	// host's installation Ignition.
	// +optional
	IgnitionConfigOverrides string `json:"ignitionConfigOverrides,omitempty"`
	// IgnitionEndpointTokenReference names the Secret with the token for the
	// cluster's Ignition endpoint.
	// +optional
	IgnitionEndpointTokenReference *IgnitionEndpointTokenReference `json:"ignitionEndpointTokenReference,omitempty"`
	// IgnitionEndpointHTTPHeaders are sent with requests to the cluster's
	// Ignition endpoint.
	// +optional
	IgnitionEndpointHTTPHeaders map[string]string `json:"ignitionEndpointHTTPHeaders,omitempty"`
	// NodeLabels are applied to the host's Node once it joins.
	// +optional
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
}

// HostMemory is the host's memory.
type HostMemory struct {
	// PhysicalBytes is the installed memory.
	// +optional
	PhysicalBytes int64 `json:"physicalBytes,omitempty"`
	// UsableBytes is the memory the kernel can use.
	// +optional
	UsableBytes int64 `json:"usableBytes,omitempty"`
}

// HostCPU is the host's processor.
type HostCPU struct {
	// Count is the number of logical CPUs.
	// +optional
	Count int64 `json:"count,omitempty"`
	// ClockMegahertz is the nominal clock.
	// +optional
	ClockMegahertz int64 `json:"clockMegahertz,omitempty"`
	// Flags are the CPU feature flags, as in /proc/cpuinfo.
	// +optional
	Flags []string `json:"flags,omitempty"`
	// ModelName is the processor model.
	// +optional
	ModelName string `json:"modelName,omitempty"`
	// Architecture, such as x86_64 or aarch64.
	// +optional
	Architecture string `json:"architecture,omitempty"`
}

// HostInterface is one network interface.
type HostInterface struct {
	// Name of the interface, such as eth0.
	// +optional
	Name string `json:"name,omitempty"`
	// MacAddress of the interface.
	// +optional
	MacAddress string `json:"macAddress,omitempty"`
	// IPV4Addresses in CIDR notation.
	IPV4Addresses []string `json:"ipV4Addresses"`
	// IPV6Addresses in CIDR notation.
	IPV6Addresses []string `json:"ipV6Addresses"`
	// Mtu of the interface.
	// +optional
	Mtu int64 `json:"mtu,omitempty"`
	// SpeedMbps is the negotiated link speed; absent when unknown.
	// +optional
	SpeedMbps int64 `json:"speedMbps,omitempty"`
	// HasCarrier is true when the link is up.
	// +optional
	HasCarrier bool `json:"hasCarrier,omitempty"`
	// Vendor of the network device.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// Product name of the network device.
	// +optional
	Product string `json:"product,omitempty"`
	// Biosdevname is the firmware's name for the interface.
	// +optional
	Biosdevname string `json:"biosDevName,omitempty"`
	// ClientID is the DHCP client identifier.
	// +optional
	ClientID string `json:"clientID,omitempty"`
	// Flags of the interface, such as up, broadcast, multicast.
	Flags []string `json:"flags"`
}

// HostInstallationEligibility says whether the host can be installed to a disk.
type HostInstallationEligibility struct {
	// Eligible is true when the disk can be the installation disk.
	// +optional
	Eligible bool `json:"eligible,omitempty"`
	// NotEligibleReasons explain why it cannot.
	NotEligibleReasons []string `json:"notEligibleReasons"`
}

// HostDisk is one block device.
type HostDisk struct {
	// ID is the stable identifier to use as installation_disk_id: the
	// /dev/disk/by-id path when there is one, else the by-path one, else the
	// /dev path.
	ID string `json:"id"`
	// Name of the device, such as sda.
	// +optional
	Name string `json:"name,omitempty"`
	// Path of the device, such as /dev/sda.
	// +optional
	Path string `json:"path,omitempty"`
	// ByPath is the /dev/disk/by-path link.
	// +optional
	ByPath string `json:"byPath,omitempty"`
	// ByID is the /dev/disk/by-id link.
	// +optional
	ByID string `json:"byID,omitempty"`
	// DriveType: HDD, SSD, ODD (optical), FDD or Unknown.
	// +optional
	DriveType string `json:"driveType,omitempty"`
	// Vendor of the disk.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// Model of the disk.
	// +optional
	Model string `json:"model,omitempty"`
	// Serial number of the disk.
	// +optional
	Serial string `json:"serial,omitempty"`
	// Wwn is the World Wide Name.
	// +optional
	Wwn string `json:"wwn,omitempty"`
	// Hctl is the SCSI host:channel:target:lun address.
	// +optional
	Hctl string `json:"hctl,omitempty"`
	// SizeBytes is the capacity.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Bootable is true when the disk carries a boot loader or EFI partition.
	// +optional
	Bootable bool `json:"bootable,omitempty"`
	// InstallationEligibility says whether the host can be installed here.
	// +optional
	InstallationEligibility HostInstallationEligibility `json:"installationEligibility,omitempty"`
}

// HostBoot describes how the host booted.
type HostBoot struct {
	// CurrentBootMode is uefi or bios.
	// +optional
	CurrentBootMode string `json:"currentBootMode,omitempty"`
	// PxeInterface is the MAC of the interface the host network-booted from.
	// +optional
	PxeInterface string `json:"pxeInterface,omitempty"`
	// SecureBootState is Enabled, Disabled or Unknown.
	// +optional
	SecureBootState string `json:"secureBootState,omitempty"`
}

// HostSystemVendor identifies the machine.
type HostSystemVendor struct {
	// Manufacturer of the machine.
	// +optional
	Manufacturer string `json:"manufacturer,omitempty"`
	// ProductName of the machine.
	// +optional
	ProductName string `json:"productName,omitempty"`
	// SerialNumber of the machine.
	// +optional
	SerialNumber string `json:"serialNumber,omitempty"`
	// Virtual is true for a virtual machine.
	// +optional
	Virtual bool `json:"virtual,omitempty"`
}

// HostGPU is one graphics or compute accelerator.
type HostGPU struct {
	// Address is the PCI address.
	// +optional
	Address string `json:"address,omitempty"`
	// Vendor name.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// VendorID is the PCI vendor id.
	// +optional
	VendorID string `json:"vendorID,omitempty"`
	// DeviceID is the PCI device id.
	// +optional
	DeviceID string `json:"deviceID,omitempty"`
	// Name of the device.
	// +optional
	Name string `json:"name,omitempty"`
}

// Virtualization verdicts.
const (
	VirtSupported                   = "supported"
	VirtDisabledInFirmware          = "disabled-in-firmware"
	VirtNotSupportedByCPU           = "not-supported-by-cpu"
	VirtVirtualMachineWithoutNested = "virtual-machine-without-nesting"
)

// HostVirtualization is agentboot's answer to "can this host run virtual
// machines?", checked on the host rather than inferred from CPU flags alone.
type HostVirtualization struct {
	// Verdict: supported, disabled-in-firmware (the CPU has the extension but
	// KVM cannot use it), not-supported-by-cpu, or
	// virtual-machine-without-nesting.
	// +kubebuilder:validation:Enum=supported;disabled-in-firmware;not-supported-by-cpu;virtual-machine-without-nesting
	// +optional
	Verdict string `json:"verdict,omitempty"`
	// Reason explains the verdict in a sentence.
	// +optional
	Reason string `json:"reason,omitempty"`
	// CPUFlag is the virtualization flag the CPU reports: vmx, svm, or empty.
	// +optional
	CPUFlag string `json:"cpuFlag,omitempty"`
	// KVMDevicePresent is true when /dev/kvm exists.
	// +optional
	KVMDevicePresent bool `json:"kvmDevicePresent,omitempty"`
	// KVMUsable is true when KVM answered KVM_GET_API_VERSION and created a VM.
	// +optional
	KVMUsable bool `json:"kvmUsable,omitempty"`
	// KVMError is what KVM answered when it was not usable.
	// +optional
	KVMError string `json:"kvmError,omitempty"`
	// Nested is the kvm_intel/kvm_amd nested setting: enabled, disabled or
	// empty when the module is not loaded.
	// +optional
	Nested string `json:"nested,omitempty"`
	// IOMMUGroups is the number of IOMMU groups (0: no IOMMU for passthrough).
	// +optional
	IOMMUGroups int64 `json:"iommuGroups,omitempty"`
}

// HostInventory is the hardware the agent reported.
type HostInventory struct {
	// ReportTime is when the service stored this inventory (agentboot
	// stamps it with its own clock: the host's may be off).
	// +optional
	ReportTime *metav1.Time `json:"reportTime,omitempty"`
	// Hostname the host reported.
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// BmcAddress is the IPv4 address of the host's BMC.
	// +optional
	BmcAddress string `json:"bmcAddress,omitempty"`
	// BmcV6Address is the IPv6 address of the host's BMC.
	// +optional
	BmcV6Address string `json:"bmcV6Address,omitempty"`
	// Memory of the host.
	// +optional
	Memory HostMemory `json:"memory,omitempty"`
	// CPU of the host.
	// +optional
	CPU HostCPU `json:"cpu,omitempty"`
	// Interfaces of the host.
	// +optional
	Interfaces []HostInterface `json:"interfaces,omitempty"`
	// Disks of the host (loop, zram and device-mapper devices are left out).
	// +optional
	Disks []HostDisk `json:"disks,omitempty"`
	// Boot describes how the host booted.
	// +optional
	Boot HostBoot `json:"boot,omitempty"`
	// SystemVendor identifies the machine.
	// +optional
	SystemVendor HostSystemVendor `json:"systemVendor,omitempty"`
	// GPUs of the host.
	// +optional
	GPUs []HostGPU `json:"gpus,omitempty"`
	// Virtualization says whether the host can run virtual machines.
	// +optional
	Virtualization *HostVirtualization `json:"virtualization,omitempty"`
}

// HostStage is one step of a host's installation.
type HostStage string

// Installation stages of a worker joining an existing (hosted) cluster, in
// order, plus Failed.
const (
	StageStartingInstallation HostStage = "Starting installation"
	StageInstalling           HostStage = "Installing"
	StageWritingImageToDisk   HostStage = "Writing image to disk"
	StageWaitingControlPlane  HostStage = "Waiting for control plane"
	StageRebooting            HostStage = "Rebooting"
	StageWaitingForIgnition   HostStage = "Waiting for ignition"
	StageConfiguring          HostStage = "Configuring"
	StageJoined               HostStage = "Joined"
	StageDone                 HostStage = "Done"
	StageFailed               HostStage = "Failed"
)

// HostProgressInfo is the installation progress.
type HostProgressInfo struct {
	// CurrentStage of the installation.
	// +optional
	CurrentStage HostStage `json:"currentStage,omitempty"`
	// ProgressStages are all stages of this installation, in order.
	// +optional
	ProgressStages []HostStage `json:"progressStages,omitempty"`
	// ProgressInfo is detail about the current stage.
	// +optional
	ProgressInfo string `json:"progressInfo,omitempty"`
	// InstallationPercentage is the overall progress, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	InstallationPercentage int64 `json:"installationPercentage,omitempty"`
	// StageStartTime is when the current stage started.
	// +optional
	StageStartTime *metav1.Time `json:"stageStartTime,omitempty"`
	// StageUpdateTime is when the current stage last reported progress.
	// +optional
	StageUpdateTime *metav1.Time `json:"stageUpdateTime,omitempty"`
}

// HostNTPSource is one NTP source the host uses.
type HostNTPSource struct {
	// SourceName is the server's name or address.
	// +optional
	SourceName string `json:"sourceName,omitempty"`
	// SourceState: synced, combined, not_combined, error, variable or
	// unreachable.
	// +optional
	SourceState string `json:"sourceState,omitempty"`
}

// Validation statuses.
const (
	ValidationSuccess  = "success"
	ValidationFailure  = "failure"
	ValidationPending  = "pending"
	ValidationError    = "error"
	ValidationDisabled = "disabled"
)

// ValidationResult is the outcome of one host validation.
type ValidationResult struct {
	// ID of the validation, such as has-min-cpu-cores.
	ID string `json:"id"`
	// Status: success, failure, pending, error or disabled.
	// +kubebuilder:validation:Enum=success;failure;pending;error;disabled
	Status string `json:"status"`
	// Message explains the outcome.
	Message string `json:"message"`
}

// ValidationResults are the validations of one category.
type ValidationResults []ValidationResult

// ValidationsStatus maps a category (hardware, network, operators) to its
// validations.
type ValidationsStatus map[string]ValidationResults

// AgentDebugInfo helps understand a host's state.
type AgentDebugInfo struct {
	// State of the host, such as known-unbound.
	// +optional
	State string `json:"state,omitempty"`
	// StateInfo explains the state.
	// +optional
	StateInfo string `json:"stateInfo,omitempty"`
	// EventsURL lists the host's events.
	// +optional
	EventsURL string `json:"eventsURL,omitempty"`
	// LogsURL serves the host's logs.
	// +optional
	LogsURL string `json:"logsURL,omitempty"`
}

// AgentStatus is what agentboot observed about a host.
type AgentStatus struct {
	// Role the host has: auto-assign while unbound.
	// +optional
	Role AgentRole `json:"role,omitempty"`
	// Inventory is the hardware the agent reported.
	// +optional
	Inventory HostInventory `json:"inventory,omitempty"`
	// Progress of the installation.
	// +optional
	Progress HostProgressInfo `json:"progress,omitempty"`
	// NTPSources the host uses.
	// +optional
	NTPSources []HostNTPSource `json:"ntpSources,omitempty"`
	// Conditions: SpecSynced, Connected, RequirementsMet, Validated,
	// Installed, Bound.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
	// DebugInfo holds the host state and debugging URLs.
	// +optional
	DebugInfo AgentDebugInfo `json:"debugInfo"`
	// ValidationsInfo maps a category to its validation results.
	// +optional
	ValidationsInfo ValidationsStatus `json:"validationsInfo,omitempty"`
	// InstallationDiskID is the disk the host installs (or installed) to.
	// +optional
	InstallationDiskID string `json:"installation_disk_id,omitempty"`
	// DiskSanitization is agentboot's own: what the host owes before it
	// can be bound again after it left a cluster, and the evidence of its
	// last sanitization. Only the service writes it.
	// +optional
	DiskSanitization *AgentDiskSanitization `json:"diskSanitization,omitempty"`
	// Registration is agentboot's own: its record of the host behind the
	// Agent, which the service decides by. Only the service writes it.
	// +optional
	Registration *AgentRegistration `json:"registration,omitempty"`
}

// AgentRegistration is what agentboot relies on about an Agent's host: who
// the host said it is, its current session, where it was heard from, what
// booted it, and the InfraEnv it registered through. It lives in the status
// because tenants are granted Agents, never agents/status: whoever may edit
// an Agent changes none of it (docs/security.md). Nothing in it is secret.
type AgentRegistration struct {
	// InfraEnv is the name of the InfraEnv (in the Agent's namespace) the
	// host registered through in its current session.
	// +optional
	InfraEnv string `json:"infraEnv,omitempty"`
	// InfraEnvUID is that InfraEnv's UID.
	// +optional
	InfraEnvUID string `json:"infraEnvUID,omitempty"`
	// Identity is a keyed digest of everything the host said it is (host
	// ID, SMBIOS UUID and serial, every MAC address): a later
	// registration must say exactly the same to continue as this Agent.
	// +optional
	Identity string `json:"identity,omitempty"`
	// MACAddresses the host registered with, sorted.
	// +optional
	MACAddresses []string `json:"macAddresses,omitempty"`
	// Session is the current session's ID: a digest of its secret, which
	// only the host holds (in its agent token).
	// +optional
	Session string `json:"session,omitempty"`
	// SessionStarted is when the current session began (RFC 3339, to the
	// nanosecond).
	// +optional
	SessionStarted string `json:"sessionStarted,omitempty"`
	// BootedBy is the UID of the BareMetalHost whose virtual media the
	// host of the current session proved it booted from.
	// +optional
	BootedBy string `json:"bootedBy,omitempty"`
	// SourceAddresses the host's agent was seen connecting from (the last
	// few): addresses a host actually uses, unlike those it reports.
	// +optional
	SourceAddresses []string `json:"sourceAddresses,omitempty"`
	// Contested is when (and from where) a registration with this identity
	// was refused because the current session was still alive. If the
	// current session is heard from after that, two hosts claim one
	// identity.
	// +optional
	Contested string `json:"contested,omitempty"`
	// Disputed says why the Agent's identity is disputed: two hosts were
	// alive under it. Such an Agent fails its identity-undisputed
	// validation and is never bound or approved automatically until an
	// administrator clears it (kubectl patch --subresource=status) or
	// deletes the Agent.
	// +optional
	Disputed string `json:"disputed,omitempty"`
	// NodeName is the hostname the host's installation named its Node,
	// recorded when the installation was handed out: the Node and CSRs
	// agentboot looks for, whatever spec.hostname says later.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// AgentVersion is the version the host's agent reported when its
	// current session began ("" for an agent that reports none); which
	// agent versions a service accepts is docs/releases.md's promise.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	AgentVersion string `json:"agentVersion,omitempty"`
}

// Disk sanitization states.
const (
	// SanitizationPending: owed, not yet handed to the host.
	SanitizationPending = "Pending"
	// SanitizationRunning: the host is erasing its disks.
	SanitizationRunning = "Sanitizing"
	// SanitizationFailed: the last attempt failed; Message says why and
	// what an administrator can do. A new boot of the host tries again.
	SanitizationFailed = "Failed"
	// SanitizationDone: nothing is owed; Disks is the evidence.
	SanitizationDone = "Done"
)

// AgentDiskSanitization records a host's disk sanitization.
type AgentDiskSanitization struct {
	// OnRelease is the level the host will owe when its installation is
	// forgotten (released from its cluster, or failed), recorded when the
	// installation was handed out, from the policy for the InfraEnv it
	// installed through.
	// +optional
	OnRelease string `json:"onRelease,omitempty"`
	// Required is the level the host's disks must be sanitized at before
	// it can be bound again (metadata or erase); empty when nothing is
	// owed.
	// +optional
	Required string `json:"required,omitempty"`
	// Reason says why it is owed.
	// +optional
	Reason string `json:"reason,omitempty"`
	// State is Pending, Sanitizing, Failed or Done.
	// +optional
	State string `json:"state,omitempty"`
	// Message says what is happening, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// Session is the registration session the last attempt was handed to.
	// +optional
	Session string `json:"session,omitempty"`
	// StartTime is when the last attempt was handed to the host.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the host's report of the last attempt came.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Level of the last completed sanitization.
	// +optional
	Level string `json:"level,omitempty"`
	// Disks is the evidence of the last attempt, per disk.
	// +optional
	Disks []DiskSanitizationRecord `json:"disks,omitempty"`
	// Keep lists the disks an administrator marked never to erase (the
	// agentboot.io/sanitize-keep annotation of the host's
	// BareMetalHost): /dev/disk/by-id or by-path links, serial numbers or
	// WWNs, as the host's inventory reports them. Written by the
	// BareMetalHost controller only.
	// +optional
	Keep []string `json:"keep,omitempty"`
}

// DiskSanitizationRecord is the evidence of one disk's sanitization, as the
// host reported it.
type DiskSanitizationRecord struct {
	// Disk is the device.
	Disk string `json:"disk"`
	// Kept is true for a disk the host was told to keep (an
	// administrator's mark, resolved when the attempt was handed out).
	// +optional
	Kept bool `json:"kept,omitempty"`
	// Method used.
	Method string `json:"method"`
	// Why that method (or why the disk was spared).
	// +optional
	Why string `json:"why,omitempty"`
	// Bytes the method covered.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// Duration of the erase and its check.
	// +optional
	Duration metav1.Duration `json:"duration,omitempty"`
	// Verification names the check.
	// +optional
	Verification string `json:"verification,omitempty"`
	// Checked says what the check read.
	// +optional
	Checked string `json:"checked,omitempty"`
	// Error says why this disk is not sanitized.
	// +optional
	Error string `json:"error,omitempty"`
}

// Agent is a host that booted a discovery image and registered. agentboot
// creates Agents; administrators approve them and binders bind them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".spec.clusterDeploymentName.name",description="The cluster the Agent is bound to"
// +kubebuilder:printcolumn:name="Approved",type="boolean",JSONPath=".spec.approved",description="Whether the Agent is approved"
// +kubebuilder:printcolumn:name="Role",type="string",JSONPath=".status.role",description="The role of the Agent"
// +kubebuilder:printcolumn:name="Stage",type="string",JSONPath=".status.progress.currentStage",description="The installation stage of the Agent"
// +kubebuilder:printcolumn:name="Hostname",type="string",JSONPath=".status.inventory.hostname",description="The hostname the Agent reported",priority=1
// +kubebuilder:printcolumn:name="Requested Hostname",type="string",JSONPath=".spec.hostname",description="The requested hostname",priority=1
type Agent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the administrator or a binder decided.
	Spec AgentSpec `json:"spec,omitempty"`
	// Status is what agentboot observed.
	Status AgentStatus `json:"status,omitempty"`
}

// Hostname is the name the host goes by: spec.hostname when set, else the
// one it reported. Its Node in a cluster has this name.
func (a *Agent) Hostname() string {
	if a.Spec.Hostname != "" {
		return a.Spec.Hostname
	}
	return a.Status.Inventory.Hostname
}

// AgentList is a list of Agents.
//
// +kubebuilder:object:root=true
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Agent `json:"items"`
}
