package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Interface maps a logical interface name in the nmstate config to the MAC
// address of the NIC that should get it.
type Interface struct {
	// Name is the interface name used in config.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	Name string `json:"name"`
	// MacAddress of the NIC, six colon-separated hex pairs.
	// +kubebuilder:validation:Pattern=`^([0-9A-Fa-f]{2}[:]){5}([0-9A-Fa-f]{2})$`
	MacAddress string `json:"macAddress"`
}

// NMStateConfigSpec is static network configuration for the hosts whose NICs
// it names.
type NMStateConfigSpec struct {
	// Interfaces maps the interface names used in config to MAC addresses; a
	// host applies this config when it has all of these MACs.
	// +kubebuilder:validation:MinItems=1
	Interfaces []*Interface `json:"interfaces,omitempty"`
	// NetConfig is an nmstate network state (YAML in the manifest).
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	// +optional
	NetConfig runtime.RawExtension `json:"config,omitempty"`
}

// NMStateConfig is static network configuration that an InfraEnv selects
// (spec.nmStateConfigLabelSelector) and bakes into its discovery image.
//
// +kubebuilder:object:root=true
type NMStateConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the network configuration.
	Spec NMStateConfigSpec `json:"spec,omitempty"`
}

// NMStateConfigList is a list of NMStateConfigs.
//
// +kubebuilder:object:root=true
type NMStateConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NMStateConfig `json:"items"`
}
