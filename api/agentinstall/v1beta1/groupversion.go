// Package v1beta1 contains the agent-install.openshift.io/v1beta1 API:
// InfraEnv, Agent, NMStateConfig and AgentClassification, field-compatible with OpenShift's
// assisted-service so that existing manifests and kubectl habits keep working.
//
// +kubebuilder:object:generate=true
// +groupName=agent-install.openshift.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "agent-install.openshift.io", Version: "v1beta1"}

var (
	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&InfraEnv{}, &InfraEnvList{},
		&Agent{}, &AgentList{},
		&NMStateConfig{}, &NMStateConfigList{},
		&AgentClassification{}, &AgentClassificationList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
