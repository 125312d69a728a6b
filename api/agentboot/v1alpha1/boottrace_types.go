package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MACLabel on a BootTrace is its MAC address with dashes for colons (a
// label value cannot hold colons): `kubectl get boottraces -A -l
// agentboot.io/mac=52-54-00-aa-00-01`.
const MACLabel = "agentboot.io/mac"

// ClaimLabel on a BootTrace says what claims its MAC: ClaimBareMetalHost
// (a BareMetalHost names it as its boot MAC), ClaimPXEDefault (only the
// namespace's agentboot.io/pxe-default InfraEnv: any MAC on the boot network
// is claimed so), or ClaimNone (nothing: the trace is in agentboot's
// namespace). Traces of the last two are limited in number.
const ClaimLabel = "agentboot.io/claim"

// ClaimLabel's values.
const (
	ClaimBareMetalHost = "baremetalhost"
	ClaimPXEDefault    = "pxe-default"
	ClaimNone          = "none"
)

// BootTrace is one network interface's way through agentboot's boot path
// before its host registers, as agentboot's services saw it: DHCP, the
// boot file over TFTP, the boot script, the kernel, initrd, root file
// system or ISO. Its name is mac-<the MAC with dashes>. It lives in the
// namespace of the InfraEnv the MAC boots into (the BareMetalHost's that
// names it as its boot MAC, or the PXE default InfraEnv's), and in
// agentboot's own namespace when nothing claims the MAC. The image service
// writes it; nothing agentboot decides reads it: it is what a host was
// seen to do, not evidence of who it is.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=btr
// +kubebuilder:printcolumn:name="MAC",type=string,JSONPath=`.status.macAddress`
// +kubebuilder:printcolumn:name="InfraEnv",type=string,JSONPath=`.status.infraEnv`
// +kubebuilder:printcolumn:name="Last hop",type=string,JSONPath=`.status.lastHop`
// +kubebuilder:printcolumn:name="Last seen",type=date,JSONPath=`.status.lastSeen`
type BootTrace struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status BootTraceStatus `json:"status,omitempty"`
}

// BootTraceStatus is what agentboot's services saw of the MAC.
type BootTraceStatus struct {
	// MACAddress is the interface's MAC, lower case with colons.
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`
	MACAddress string `json:"macAddress"`
	// InfraEnv is the InfraEnv the MAC boots into, when one claims it.
	// +optional
	InfraEnv string `json:"infraEnv,omitempty"`
	// Claim says what claims the MAC, or why nothing does, when it was
	// last seen.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Claim string `json:"claim,omitempty"`
	// Hops are the hops of the boot path the MAC reached, each as last
	// seen, in the boot path's order.
	// +optional
	// +listType=map
	// +listMapKey=hop
	// +kubebuilder:validation:MaxItems=16
	Hops []BootTraceHop `json:"hops,omitempty"`
	// LastHop is the furthest hop reached in the latest boot.
	// +optional
	LastHop string `json:"lastHop,omitempty"`
	// LastSeen is when any service last saw the MAC.
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`
}

// BootTraceHop is one hop of the boot path as a service saw it.
type BootTraceHop struct {
	// Hop is the hop: dhcp, boot_file, boot_script, kernel, initrd,
	// rootfs or iso.
	// +kubebuilder:validation:Enum=dhcp;boot_file;boot_script;kernel;initrd;rootfs;iso
	Hop string `json:"hop"`
	// Source is the service that saw it: pxe or image-service.
	// +kubebuilder:validation:Enum=pxe;image-service
	Source string `json:"source"`
	// OK is whether the hop was served: false when the service refused
	// or dropped the request, or the transfer did not finish.
	OK bool `json:"ok"`
	// Outcome says what the service did, and why when it did not serve.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Outcome string `json:"outcome,omitempty"`
	// Detail is what was asked: the client architecture, the file, the
	// address.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Detail string `json:"detail,omitempty"`
	// First is when the hop was first seen.
	First metav1.Time `json:"first"`
	// Last is when the hop was last seen.
	Last metav1.Time `json:"last"`
	// Count is how many times it was seen.
	Count int64 `json:"count"`
}

// BootTraceList is a list of BootTraces.
//
// +kubebuilder:object:root=true
type BootTraceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BootTrace `json:"items"`
}
