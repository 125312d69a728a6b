package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Every field must have a description, so that `kubectl explain` explains it.
func TestEveryFieldIsDescribed(t *testing.T) {
	docs, err := CRDs()
	require.NoError(t, err)
	require.Equal(t, 6, len(docs), "InfraEnv, Agent, NMStateConfig, AgentClassification, BootTrace, BareMetalHost")
	test, err := filepath.Glob("../test/crds/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, test)
	for _, f := range test {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		docs = append(docs, data)
	}
	for _, doc := range docs {
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.UnmarshalStrict(doc, &crd))
		for _, v := range crd.Spec.Versions {
			var missing []string
			walk(v.Schema.OpenAPIV3Schema, crd.Spec.Names.Kind, &missing)
			require.Empty(t, missing, "fields without a description in %s %s", crd.Name, v.Name)
		}
	}
}

func walk(s *apiextensionsv1.JSONSchemaProps, path string, missing *[]string) {
	for name, p := range s.Properties {
		p := p
		child := path + "." + name
		// metadata is described by Kubernetes itself.
		if p.Description == "" && !(name == "metadata" && strings.Count(child, ".") == 1) {
			*missing = append(*missing, child)
		}
		walk(&p, child, missing)
	}
	if s.Items != nil && s.Items.Schema != nil {
		walk(s.Items.Schema, path+"[]", missing)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		walk(s.AdditionalProperties.Schema, path+"{}", missing)
	}
}
