// Package v1beta1 declares the few fields of HyperShift's
// hypershift.openshift.io/v1beta1 HostedCluster and NodePool that agentboot
// reads. HyperShift owns these kinds: agentboot never writes them, and
// deploy/ never installs their CRDs; the CRDs generated from this package
// live under test/crds for tests only. Unknown fields are preserved so that
// objects shaped exactly as HyperShift writes them can be stored in tests.
//
// +kubebuilder:object:generate=true
// +groupName=hypershift.openshift.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of HostedCluster and NodePool.
var GroupVersion = schema.GroupVersion{Group: "hypershift.openshift.io", Version: "v1beta1"}

var (
	// SchemeBuilder registers the kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &HostedCluster{}, &HostedClusterList{}, &NodePool{}, &NodePoolList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds the kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// NodePoolAnnotation on a user-data Secret names its NodePool as <ns>/<name>.
const NodePoolAnnotation = "hypershift.openshift.io/nodePool"

// PlatformType names an infrastructure platform.
type PlatformType string

// AgentPlatform is the platform of hosted clusters whose workers are Agents.
const AgentPlatform PlatformType = "Agent"

// AgentPlatformSpec is the Agent platform of a HostedCluster.
type AgentPlatformSpec struct {
	// AgentNamespace is where the cluster's Agents live.
	AgentNamespace string `json:"agentNamespace"`
}

// PlatformSpec is a HostedCluster's platform.
type PlatformSpec struct {
	// Type of the platform.
	Type PlatformType `json:"type"`
	// Agent is set for the Agent platform.
	// +optional
	Agent *AgentPlatformSpec `json:"agent,omitempty"`
}

// HostedClusterSpec is the part of a HostedCluster's spec agentboot reads.
// +kubebuilder:pruning:PreserveUnknownFields
type HostedClusterSpec struct {
	// Platform of the cluster.
	Platform PlatformSpec `json:"platform"`
}

// KubeconfigSecretRef names a Secret in the HostedCluster's namespace.
type KubeconfigSecretRef struct {
	// Name of the Secret; its key "kubeconfig" holds the admin kubeconfig.
	Name string `json:"name"`
}

// HostedClusterStatus is the part of a HostedCluster's status agentboot reads.
// +kubebuilder:pruning:PreserveUnknownFields
type HostedClusterStatus struct {
	// KubeConfig names the Secret with the hosted cluster's admin kubeconfig.
	// +optional
	KubeConfig *KubeconfigSecretRef `json:"kubeConfig,omitempty"`
	// IgnitionEndpoint is host[:port] of the cluster's Ignition server.
	// +optional
	IgnitionEndpoint string `json:"ignitionEndpoint,omitempty"`
}

// HostedCluster is HyperShift's hosted cluster (read only for agentboot).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hc;hcs
type HostedCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec of the cluster.
	Spec HostedClusterSpec `json:"spec,omitempty"`
	// Status of the cluster.
	Status HostedClusterStatus `json:"status,omitempty"`
}

// HostedClusterList is a list of HostedClusters.
//
// +kubebuilder:object:root=true
type HostedClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HostedCluster `json:"items"`
}

// AgentNodePoolPlatform is the Agent platform of a NodePool.
type AgentNodePoolPlatform struct {
	// AgentLabelSelector selects which Agents may become this pool's nodes.
	// +optional
	AgentLabelSelector *metav1.LabelSelector `json:"agentLabelSelector,omitempty"`
}

// NodePoolPlatform is a NodePool's platform.
type NodePoolPlatform struct {
	// Type of the platform.
	Type PlatformType `json:"type"`
	// Agent is set for the Agent platform.
	// +optional
	Agent *AgentNodePoolPlatform `json:"agent,omitempty"`
}

// Release names the OpenShift release of a NodePool.
type Release struct {
	// Image is the release image.
	Image string `json:"image"`
}

// NodePoolSpec is the part of a NodePool's spec agentboot reads.
// +kubebuilder:pruning:PreserveUnknownFields
type NodePoolSpec struct {
	// ClusterName is the HostedCluster (same namespace) this pool belongs to.
	ClusterName string `json:"clusterName"`
	// Replicas is the desired number of nodes.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Platform of the pool.
	Platform NodePoolPlatform `json:"platform"`
	// Release of the pool.
	// +optional
	Release Release `json:"release,omitempty"`
}

// NodePoolStatus is the part of a NodePool's status HyperShift reports.
// +kubebuilder:pruning:PreserveUnknownFields
type NodePoolStatus struct {
	// Replicas is the number of available nodes.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
}

// NodePool is HyperShift's group of worker nodes (read only for agentboot).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas
// +kubebuilder:resource:shortName=np;nps
type NodePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec of the pool.
	Spec NodePoolSpec `json:"spec,omitempty"`
	// Status of the pool.
	Status NodePoolStatus `json:"status,omitempty"`
}

// NodePoolList is a list of NodePools.
//
// +kubebuilder:object:root=true
type NodePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodePool `json:"items"`
}
