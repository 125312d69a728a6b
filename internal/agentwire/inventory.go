package agentwire

import "time"

// Inventory is the hardware a host reports. Its JSON is exactly the Agent's
// status.inventory (agent-install.openshift.io HostInventory), so the
// service decodes an upload straight into the API type; a test keeps the two
// in step.
type Inventory struct {
	ReportTime     *time.Time      `json:"reportTime,omitempty"`
	Hostname       string          `json:"hostname,omitempty"`
	BmcAddress     string          `json:"bmcAddress,omitempty"`
	BmcV6Address   string          `json:"bmcV6Address,omitempty"`
	Memory         Memory          `json:"memory,omitempty"`
	CPU            CPU             `json:"cpu,omitempty"`
	Interfaces     []Interface     `json:"interfaces,omitempty"`
	Disks          []Disk          `json:"disks,omitempty"`
	Boot           Boot            `json:"boot,omitempty"`
	SystemVendor   SystemVendor    `json:"systemVendor,omitempty"`
	GPUs           []GPU           `json:"gpus,omitempty"`
	Virtualization *Virtualization `json:"virtualization,omitempty"`
}

// Memory of the host.
type Memory struct {
	PhysicalBytes int64 `json:"physicalBytes,omitempty"`
	UsableBytes   int64 `json:"usableBytes,omitempty"`
}

// CPU of the host.
type CPU struct {
	Count          int64    `json:"count,omitempty"`
	ClockMegahertz int64    `json:"clockMegahertz,omitempty"`
	Flags          []string `json:"flags,omitempty"`
	ModelName      string   `json:"modelName,omitempty"`
	Architecture   string   `json:"architecture,omitempty"`
}

// Interface is one NIC.
type Interface struct {
	Name          string   `json:"name,omitempty"`
	MacAddress    string   `json:"macAddress,omitempty"`
	IPV4Addresses []string `json:"ipV4Addresses"`
	IPV6Addresses []string `json:"ipV6Addresses"`
	Mtu           int64    `json:"mtu,omitempty"`
	SpeedMbps     int64    `json:"speedMbps,omitempty"`
	HasCarrier    bool     `json:"hasCarrier,omitempty"`
	Vendor        string   `json:"vendor,omitempty"`
	Product       string   `json:"product,omitempty"`
	Biosdevname   string   `json:"biosDevName,omitempty"`
	ClientID      string   `json:"clientID,omitempty"`
	Flags         []string `json:"flags"`
}

// InstallationEligibility says whether a disk can be the installation disk.
type InstallationEligibility struct {
	Eligible           bool     `json:"eligible,omitempty"`
	NotEligibleReasons []string `json:"notEligibleReasons"`
}

// Disk is one block device.
type Disk struct {
	ID                      string                  `json:"id"`
	Name                    string                  `json:"name,omitempty"`
	Path                    string                  `json:"path,omitempty"`
	ByPath                  string                  `json:"byPath,omitempty"`
	ByID                    string                  `json:"byID,omitempty"`
	DriveType               string                  `json:"driveType,omitempty"`
	Vendor                  string                  `json:"vendor,omitempty"`
	Model                   string                  `json:"model,omitempty"`
	Serial                  string                  `json:"serial,omitempty"`
	Wwn                     string                  `json:"wwn,omitempty"`
	Hctl                    string                  `json:"hctl,omitempty"`
	SizeBytes               int64                   `json:"sizeBytes,omitempty"`
	Bootable                bool                    `json:"bootable,omitempty"`
	InstallationEligibility InstallationEligibility `json:"installationEligibility,omitempty"`
}

// Reasons a disk is not eligible for installation, as the agent reports
// them; DiskMounted is followed by what is mounted where.
const (
	DiskRemovable = "Disk is removable"
	DiskHoldsISO  = "Disk holds ISO 9660 media (the discovery image?)"
	DiskOptical   = "Disk is an optical drive"
	DiskReadOnly  = "Disk is read-only"
	DiskMounted   = "Disk has mounted partitions"
)

// Boot says how the host booted.
type Boot struct {
	CurrentBootMode string `json:"currentBootMode,omitempty"`
	PxeInterface    string `json:"pxeInterface,omitempty"`
	SecureBootState string `json:"secureBootState,omitempty"`
}

// SystemVendor identifies the machine.
type SystemVendor struct {
	Manufacturer string `json:"manufacturer,omitempty"`
	ProductName  string `json:"productName,omitempty"`
	SerialNumber string `json:"serialNumber,omitempty"`
	Virtual      bool   `json:"virtual,omitempty"`
}

// GPU is one display or compute accelerator.
type GPU struct {
	Address  string `json:"address,omitempty"`
	Vendor   string `json:"vendor,omitempty"`
	VendorID string `json:"vendorID,omitempty"`
	DeviceID string `json:"deviceID,omitempty"`
	Name     string `json:"name,omitempty"`
}

// Virtualization verdicts.
const (
	VirtSupported                   = "supported"
	VirtDisabledInFirmware          = "disabled-in-firmware"
	VirtNotSupportedByCPU           = "not-supported-by-cpu"
	VirtVirtualMachineWithoutNested = "virtual-machine-without-nesting"
)

// Virtualization is whether the host can run virtual machines.
type Virtualization struct {
	Verdict          string `json:"verdict,omitempty"`
	Reason           string `json:"reason,omitempty"`
	CPUFlag          string `json:"cpuFlag,omitempty"`
	KVMDevicePresent bool   `json:"kvmDevicePresent,omitempty"`
	KVMUsable        bool   `json:"kvmUsable,omitempty"`
	KVMError         string `json:"kvmError,omitempty"`
	Nested           string `json:"nested,omitempty"`
	IOMMUGroups      int64  `json:"iommuGroups,omitempty"`
}
