// Package scheme builds the runtime.Scheme that knows every kind agentboot
// reads or writes: Kubernetes' built-in kinds and agentboot's API groups.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	agentbootv1alpha1 "github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	agentinstallv1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hivev1 "github.com/agentboot/agentboot/api/hive/v1"
	hiveextv1beta1 "github.com/agentboot/agentboot/api/hiveext/v1beta1"
	hypershiftv1beta1 "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	metal3v1alpha1 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
)

// New returns a scheme with the built-in kinds, agent-install.openshift.io,
// metal3.io and (read-only) hypershift.openshift.io, hive.openshift.io and
// extensions.hive.openshift.io.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		agentinstallv1beta1.AddToScheme,
		agentbootv1alpha1.AddToScheme,
		metal3v1alpha1.AddToScheme,
		hypershiftv1beta1.AddToScheme,
		hivev1.AddToScheme,
		hiveextv1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}
