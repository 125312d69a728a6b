// Package v1beta1 declares the fields of assisted-service's
// extensions.hive.openshift.io/v1beta1 AgentClusterInstall that agentboot
// reads. cluster-api-provider-agent creates one next to each hosted
// cluster's ClusterDeployment; its ignitionEndpoint is where installed
// workers fetch their configuration. agentboot never writes it. Unknown
// fields are preserved, so the CRD generated from this package
// (deploy/components/hive-crds) stores everything the upstream schema
// allows.
//
// +kubebuilder:object:generate=true
// +groupName=extensions.hive.openshift.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of AgentClusterInstall.
var GroupVersion = schema.GroupVersion{Group: "extensions.hive.openshift.io", Version: "v1beta1"}

var (
	// SchemeBuilder registers the kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &AgentClusterInstall{}, &AgentClusterInstallList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds the kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// CaCertificateReference names the Secret holding the CA that signs the
// Ignition endpoint's certificate.
type CaCertificateReference struct {
	// Namespace of the Secret.
	Namespace string `json:"namespace"`
	// Name of the Secret; its key tls.crt holds the PEM CA.
	Name string `json:"name"`
}

// IgnitionEndpoint is where a cluster serves its nodes' Ignition configs.
type IgnitionEndpoint struct {
	// URL of the endpoint, without the pool path.
	// +optional
	URL string `json:"url,omitempty"`
	// CaCertificateReference names the Secret with the endpoint's CA.
	// +optional
	CaCertificateReference *CaCertificateReference `json:"caCertificateReference,omitempty"`
}

// ClusterDeploymentReference names the ClusterDeployment an
// AgentClusterInstall belongs to.
type ClusterDeploymentReference struct {
	// Name of the ClusterDeployment, in the same namespace.
	Name string `json:"name"`
}

// AgentClusterInstallSpec is the part of an AgentClusterInstall's spec
// agentboot reads.
// +kubebuilder:pruning:PreserveUnknownFields
type AgentClusterInstallSpec struct {
	// ClusterDeploymentRef names the cluster's ClusterDeployment.
	ClusterDeploymentRef ClusterDeploymentReference `json:"clusterDeploymentRef"`
	// IgnitionEndpoint is where installed hosts fetch their configuration.
	// +optional
	IgnitionEndpoint *IgnitionEndpoint `json:"ignitionEndpoint,omitempty"`
}

// AgentClusterInstall says how a cluster is installed with Agents (read
// only for agentboot).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=aci
type AgentClusterInstall struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec says how the cluster is installed.
	Spec AgentClusterInstallSpec `json:"spec,omitempty"`
	// Status is assisted-service's; agentboot does not read it.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +optional
	Status runtime.RawExtension `json:"status,omitempty"`
}

// AgentClusterInstallList is a list of AgentClusterInstalls.
//
// +kubebuilder:object:root=true
type AgentClusterInstallList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AgentClusterInstall `json:"items"`
}
