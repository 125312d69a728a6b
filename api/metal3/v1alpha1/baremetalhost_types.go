// Package v1alpha1 contains the subset of metal3.io/v1alpha1 BareMetalHost
// that agentboot acts on, with metal3's field names, so that the YAML users
// write for metal3 enrolls hosts here too.
//
// +kubebuilder:object:generate=true
// +groupName=metal3.io
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of BareMetalHost.
var GroupVersion = schema.GroupVersion{Group: "metal3.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers BareMetalHost with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &BareMetalHost{}, &BareMetalHostList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds BareMetalHost to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Annotations on a BareMetalHost that agentboot copies onto its matched Agent
// while that Agent is not yet approved.
const (
	HostnameAnnotation = "bmac.agent-install.openshift.io/hostname"
	RoleAnnotation     = "bmac.agent-install.openshift.io/role"
)

// BMCDetails says how to reach the host's baseboard management controller.
type BMCDetails struct {
	// Address of the BMC: ipmi://host[:port],
	// redfish[+http|+https]://host[:port]/redfish/v1/Systems/<id>, or a
	// virtual-media scheme: redfish-virtualmedia, idrac-virtualmedia,
	// ilo5-virtualmedia (each with optional +http or +https).
	// +kubebuilder:validation:MinLength=1
	Address string `json:"address"`
	// CredentialsName is a Secret in the same namespace with keys username
	// and password.
	// +kubebuilder:validation:MinLength=1
	CredentialsName string `json:"credentialsName"`
	// DisableCertificateVerification skips TLS verification of the BMC.
	// +optional
	DisableCertificateVerification bool `json:"disableCertificateVerification,omitempty"`
}

// BootMode is the firmware boot mode.
// +kubebuilder:validation:Enum=UEFI;UEFISecureBoot;legacy
type BootMode string

// Boot modes.
const (
	BootModeUEFI           BootMode = "UEFI"
	BootModeUEFISecureBoot BootMode = "UEFISecureBoot"
	BootModeLegacy         BootMode = "legacy"
)

// AutomatedCleaningMode says whether disks are cleaned between uses.
// +kubebuilder:validation:Enum=metadata;disabled
type AutomatedCleaningMode string

// Image is the image a host should boot.
type Image struct {
	// URL of the image.
	URL string `json:"url"`
	// Checksum of the image.
	// +optional
	Checksum string `json:"checksum,omitempty"`
	// ChecksumType of Checksum.
	// +kubebuilder:validation:Enum=md5;sha256;sha512;auto
	// +optional
	ChecksumType string `json:"checksumType,omitempty"`
	// DiskFormat of the image; live-iso boots it as virtual media.
	// +kubebuilder:validation:Enum=raw;qcow2;vdi;vmdk;live-iso
	// +optional
	DiskFormat *string `json:"format,omitempty"`
}

// RootDeviceHints choose the installation disk; every hint given must match.
type RootDeviceHints struct {
	// DeviceName is a /dev path, such as /dev/sda or /dev/disk/by-path/....
	// +optional
	DeviceName string `json:"deviceName,omitempty"`
	// HCTL is the SCSI address, such as 0:0:0:0.
	// +optional
	HCTL string `json:"hctl,omitempty"`
	// Model is a substring of the disk model.
	// +optional
	Model string `json:"model,omitempty"`
	// Vendor is a substring of the disk vendor.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// SerialNumber is the disk serial number.
	// +optional
	SerialNumber string `json:"serialNumber,omitempty"`
	// MinSizeGigabytes is the smallest acceptable size in GB.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinSizeGigabytes int `json:"minSizeGigabytes,omitempty"`
	// WWN is the World Wide Name.
	// +optional
	WWN string `json:"wwn,omitempty"`
	// WWNWithExtension is the WWN with the vendor extension.
	// +optional
	WWNWithExtension string `json:"wwnWithExtension,omitempty"`
	// WWNVendorExtension is the WWN vendor extension.
	// +optional
	WWNVendorExtension string `json:"wwnVendorExtension,omitempty"`
	// Rotational selects spinning (true) or solid-state (false) disks.
	// +optional
	Rotational *bool `json:"rotational,omitempty"`
}

// BareMetalHostSpec is the desired state of a server.
type BareMetalHostSpec struct {
	// BMC says how to reach the server's BMC.
	// +optional
	BMC BMCDetails `json:"bmc,omitempty"`
	// BootMACAddress is the MAC of the NIC the server boots from; it matches
	// the server's Agent.
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`
	// +optional
	BootMACAddress string `json:"bootMACAddress,omitempty"`
	// Online says whether the server should be powered on.
	Online bool `json:"online"`
	// Image is the image to boot; agentboot sets it to the InfraEnv's ISO.
	// +optional
	Image *Image `json:"image,omitempty"`
	// BootMode is the firmware boot mode (UEFI by default).
	// +optional
	BootMode BootMode `json:"bootMode,omitempty"`
	// RootDeviceHints choose the installation disk.
	// +optional
	RootDeviceHints *RootDeviceHints `json:"rootDeviceHints,omitempty"`
	// AutomatedCleaningMode: metadata or disabled.
	// +kubebuilder:default:=metadata
	// +optional
	AutomatedCleaningMode AutomatedCleaningMode `json:"automatedCleaningMode,omitempty"`
	// ConsumerRef names the object that uses this host.
	// +optional
	ConsumerRef *corev1.ObjectReference `json:"consumerRef,omitempty"`
	// ExternallyProvisioned means something else manages the server's disks:
	// agentboot manages power only and never boots it into discovery.
	// +optional
	ExternallyProvisioned bool `json:"externallyProvisioned,omitempty"`
	// Description is free text for the administrator.
	// +optional
	Description string `json:"description,omitempty"`
}

// OperationalStatus summarises a host's health.
// +kubebuilder:validation:Enum="";OK;discovered;error;delayed;detached;servicing
type OperationalStatus string

// Operational statuses.
const (
	OperationalStatusOK         OperationalStatus = "OK"
	OperationalStatusDiscovered OperationalStatus = "discovered"
	OperationalStatusError      OperationalStatus = "error"
	OperationalStatusDetached   OperationalStatus = "detached"
)

// ErrorType classifies the last error.
// +kubebuilder:validation:Enum="";provisioned registration error;registration error;inspection error;preparation error;provisioning error;power management error;detach error;servicing error
type ErrorType string

// Error types.
const (
	RegistrationError    ErrorType = "registration error"
	ProvisioningError    ErrorType = "provisioning error"
	PowerManagementError ErrorType = "power management error"
)

// ProvisioningState is a step of a host's lifecycle.
type ProvisioningState string

// Provisioning states agentboot uses.
const (
	StateNone                    ProvisioningState = ""
	StateRegistering             ProvisioningState = "registering"
	StateAvailable               ProvisioningState = "available"
	StateProvisioning            ProvisioningState = "provisioning"
	StateProvisioned             ProvisioningState = "provisioned"
	StateExternallyProvisioned   ProvisioningState = "externally provisioned"
	StateDeprovisioning          ProvisioningState = "deprovisioning"
	StatePoweringOffBeforeDelete ProvisioningState = "powering off before delete"
	StateDeleting                ProvisioningState = "deleting"
)

// ProvisionStatus is where the host is in its lifecycle.
type ProvisionStatus struct {
	// State of the host: registering, available, provisioning, provisioned,
	// deprovisioning, powering off before delete, deleting.
	// +optional
	State ProvisioningState `json:"state"`
	// ID identifies the host to the provisioner.
	// +optional
	ID string `json:"ID"`
	// Image last booted into the host.
	// +optional
	Image Image `json:"image,omitempty"`
	// BootMode in use.
	// +optional
	BootMode BootMode `json:"bootMode,omitempty"`
}

// HardwareSystemVendor identifies the machine.
type HardwareSystemVendor struct {
	// Manufacturer of the machine.
	// +optional
	Manufacturer string `json:"manufacturer,omitempty"`
	// ProductName of the machine.
	// +optional
	ProductName string `json:"productName,omitempty"`
	// SerialNumber of the machine.
	// +optional
	SerialNumber string `json:"serialNumber,omitempty"`
}

// CPU summarises the processor.
type CPU struct {
	// Arch is the architecture.
	// +optional
	Arch string `json:"arch,omitempty"`
	// Model of the processor.
	// +optional
	Model string `json:"model,omitempty"`
	// ClockMegahertz is the clock.
	// +optional
	ClockMegahertz int64 `json:"clockMegahertz,omitempty"`
	// Count of logical CPUs.
	// +optional
	Count int `json:"count,omitempty"`
	// Flags of the processor.
	// +optional
	Flags []string `json:"flags,omitempty"`
}

// NIC summarises one network interface.
type NIC struct {
	// Name of the interface.
	// +optional
	Name string `json:"name,omitempty"`
	// Model of the device.
	// +optional
	Model string `json:"model,omitempty"`
	// MAC address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// IP is the first address on the interface.
	// +optional
	IP string `json:"ip,omitempty"`
	// SpeedGbps is the link speed.
	// +optional
	SpeedGbps int `json:"speedGbps,omitempty"`
	// PXE is true for the interface the host booted from.
	// +optional
	PXE bool `json:"pxe,omitempty"`
}

// Storage summarises one disk.
type Storage struct {
	// Name is the device path.
	// +optional
	Name string `json:"name,omitempty"`
	// Rotational is true for spinning disks.
	// +optional
	Rotational bool `json:"rotational,omitempty"`
	// SizeBytes is the capacity.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Vendor of the disk.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// Model of the disk.
	// +optional
	Model string `json:"model,omitempty"`
	// SerialNumber of the disk.
	// +optional
	SerialNumber string `json:"serialNumber,omitempty"`
	// WWN of the disk.
	// +optional
	WWN string `json:"wwn,omitempty"`
	// HCTL of the disk.
	// +optional
	HCTL string `json:"hctl,omitempty"`
}

// HardwareDetails summarises the host's hardware, filled from its Agent's
// inventory.
type HardwareDetails struct {
	// SystemVendor identifies the machine.
	// +optional
	SystemVendor HardwareSystemVendor `json:"systemVendor,omitempty"`
	// RAMMebibytes is the memory size.
	// +optional
	RAMMebibytes int `json:"ramMebibytes,omitempty"`
	// NIC lists the network interfaces.
	// +optional
	NIC []NIC `json:"nics,omitempty"`
	// Storage lists the disks.
	// +optional
	Storage []Storage `json:"storage,omitempty"`
	// CPU summarises the processor.
	// +optional
	CPU CPU `json:"cpu,omitempty"`
	// Hostname the host reported.
	// +optional
	Hostname string `json:"hostname,omitempty"`
}

// BareMetalHostStatus is what agentboot observed about a server.
type BareMetalHostStatus struct {
	// OperationalStatus: OK, discovered, error or detached.
	// +optional
	OperationalStatus OperationalStatus `json:"operationalStatus"`
	// ErrorType classifies the last error.
	// +optional
	ErrorType ErrorType `json:"errorType,omitempty"`
	// ErrorMessage describes the last error; empty when there is none.
	// +optional
	ErrorMessage string `json:"errorMessage"`
	// ErrorCount counts consecutive failed attempts.
	// +optional
	ErrorCount int `json:"errorCount"`
	// LastUpdated is when the status was last written.
	// +optional
	LastUpdated *metav1.Time `json:"lastUpdated,omitempty"`
	// PoweredOn is the power state last read from the BMC.
	// +optional
	PoweredOn bool `json:"poweredOn"`
	// Provisioning is where the host is in its lifecycle.
	// +optional
	Provisioning ProvisionStatus `json:"provisioning"`
	// HardwareDetails summarises the hardware.
	// +optional
	HardwareDetails *HardwareDetails `json:"hardware,omitempty"`
}

// BareMetalHost is a server agentboot manages through its BMC.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=bmh;bmhost
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.operationalStatus",description="Operational status",priority=1
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=".status.provisioning.state",description="Provisioning state"
// +kubebuilder:printcolumn:name="Consumer",type="string",JSONPath=".spec.consumerRef.name",description="Consumer using this host"
// +kubebuilder:printcolumn:name="BMC",type="string",JSONPath=".spec.bmc.address",description="Address of the BMC",priority=1
// +kubebuilder:printcolumn:name="Online",type="string",JSONPath=".spec.online",description="Whether the host should be powered on"
// +kubebuilder:printcolumn:name="Error",type="string",JSONPath=".status.errorType",description="Type of the most recent error"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp",description="Time since creation"
type BareMetalHost struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the server.
	Spec BareMetalHostSpec `json:"spec,omitempty"`
	// Status is what agentboot observed.
	Status BareMetalHostStatus `json:"status,omitempty"`
}

// BareMetalHostList is a list of BareMetalHosts.
//
// +kubebuilder:object:root=true
type BareMetalHostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BareMetalHost `json:"items"`
}
