// Package nmstate decides which NMStateConfigs an InfraEnv's discovery image
// carries: the InfraEnv controller publishes from that choice and the image
// service serves it, so both ask here.
package nmstate

import (
	"context"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// Select lists the NMStateConfigs of the InfraEnv's namespace that its
// nmStateConfigLabelSelector picks. An empty selector picks none (as in
// assisted-service: static networking is asked for, never implied), and so
// does a selector the apiserver let through but that cannot be parsed.
func Select(ctx context.Context, r client.Reader, ie *v1beta1.InfraEnv) ([]v1beta1.NMStateConfig, error) {
	sel := ie.Spec.NMStateConfigLabelSelector
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return nil, nil
	}
	selector, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil {
		return nil, nil
	}
	var list v1beta1.NMStateConfigList
	if err := r.List(ctx, &list, client.InNamespace(ie.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Fingerprint names the selected configs' versions, in a stable order: it
// changes exactly when the content built from them may.
func Fingerprint(configs []v1beta1.NMStateConfig) string {
	fp := make([]string, 0, len(configs))
	for _, c := range configs {
		fp = append(fp, c.Name+"@"+c.ResourceVersion)
	}
	sort.Strings(fp)
	return strings.Join(fp, ",")
}
