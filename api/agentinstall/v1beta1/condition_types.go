package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionType names one aspect of an object's state.
type ConditionType string

// Condition is the condition shape used by agent-install.openshift.io kinds
// (the OpenShift custom-resource-status shape, not metav1.Condition): it keeps
// a heartbeat time next to the transition time.
type Condition struct {
	// Type of the condition, such as ImageCreated or Validated.
	Type ConditionType `json:"type"`
	// Status of the condition: True, False or Unknown.
	Status corev1.ConditionStatus `json:"status"`
	// Reason is a one-word CamelCase cause of the last transition.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is a human-readable explanation of the current status.
	// +optional
	Message string `json:"message,omitempty"`
	// LastHeartbeatTime is when the condition was last written.
	// +optional
	// +nullable
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime"`
	// LastTransitionTime is when the status last changed.
	// +optional
	// +nullable
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// ClusterReference names a cluster (for an Agent, the hosted cluster it is
// bound to).
type ClusterReference struct {
	// Name of the cluster.
	// +optional
	Name string `json:"name,omitempty"`
	// Namespace of the cluster.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}
