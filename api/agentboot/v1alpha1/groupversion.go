// Package v1alpha1 contains the agentboot.io/v1alpha1 API: agentboot's own
// kinds, which no upstream project defines. BootTrace is the first.
//
// +kubebuilder:object:generate=true
// +groupName=agentboot.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "agentboot.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &BootTrace{}, &BootTraceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
