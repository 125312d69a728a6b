// Package v1 declares the fields of hive's hive.openshift.io/v1
// ClusterDeployment that agentboot reads. cluster-api-provider-agent
// creates one per hosted cluster in its control-plane namespace; agentboot
// never writes it. Unknown fields are preserved, so the CRD generated from
// this package (deploy/components/hive-crds, for clusters without hive)
// stores everything hive's own schema allows.
//
// +kubebuilder:object:generate=true
// +groupName=hive.openshift.io
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of ClusterDeployment.
var GroupVersion = schema.GroupVersion{Group: "hive.openshift.io", Version: "v1"}

var (
	// SchemeBuilder registers the kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &ClusterDeployment{}, &ClusterDeploymentList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds the kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// ClusterInstallLocalReference names the object (an AgentClusterInstall)
// that installs the cluster, in the ClusterDeployment's namespace.
type ClusterInstallLocalReference struct {
	// Group of the install object's kind.
	Group string `json:"group"`
	// Version of the install object's kind.
	Version string `json:"version"`
	// Kind of the install object, such as AgentClusterInstall.
	Kind string `json:"kind"`
	// Name of the install object.
	Name string `json:"name"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// Name of the object.
	Name string `json:"name"`
}

// ClusterMetadata describes an installed cluster.
type ClusterMetadata struct {
	// ClusterID is the cluster's unique id.
	ClusterID string `json:"clusterID"`
	// InfraID is the cluster's infrastructure id.
	InfraID string `json:"infraID"`
	// AdminKubeconfigSecretRef names the Secret (key "kubeconfig") with the
	// cluster's admin kubeconfig.
	AdminKubeconfigSecretRef LocalObjectReference `json:"adminKubeconfigSecretRef"`
	// AdminPasswordSecretRef names the Secret with the admin password.
	// +optional
	AdminPasswordSecretRef *LocalObjectReference `json:"adminPasswordSecretRef,omitempty"`
}

// ClusterDeploymentSpec is the part of a ClusterDeployment's spec agentboot
// reads.
// +kubebuilder:pruning:PreserveUnknownFields
type ClusterDeploymentSpec struct {
	// ClusterName is the cluster's name.
	ClusterName string `json:"clusterName"`
	// BaseDomain is the cluster's base DNS domain.
	BaseDomain string `json:"baseDomain"`
	// Installed is true for a cluster that already runs (a hosted cluster
	// whose workers join it as day-2 hosts).
	// +optional
	Installed bool `json:"installed,omitempty"`
	// ClusterMetadata is set for installed clusters.
	// +optional
	ClusterMetadata *ClusterMetadata `json:"clusterMetadata,omitempty"`
	// ClusterInstallRef names the object that installs the cluster.
	// +optional
	ClusterInstallRef *ClusterInstallLocalReference `json:"clusterInstallRef,omitempty"`
}

// ClusterDeployment is hive's record of a cluster (read only for agentboot).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cd;cds
// +kubebuilder:printcolumn:name="ClusterName",type="string",JSONPath=".spec.clusterName"
// +kubebuilder:printcolumn:name="Installed",type="boolean",JSONPath=".spec.installed"
type ClusterDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec describes the cluster.
	Spec ClusterDeploymentSpec `json:"spec,omitempty"`
	// Status is hive's; agentboot does not read it.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +optional
	Status runtime.RawExtension `json:"status,omitempty"`
}

// ClusterDeploymentList is a list of ClusterDeployments.
//
// +kubebuilder:object:root=true
type ClusterDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterDeployment `json:"items"`
}
