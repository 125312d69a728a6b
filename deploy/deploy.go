// Package deploy holds agentboot's Kubernetes manifests: the kustomize base
// in this directory (`kubectl apply -k deploy/`) and the CRDs that
// `make generate` writes into crds/. The CRDs are embedded so that
// `agentboot dev` installs exactly what a real cluster gets.
package deploy

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

//go:embed crds/*.yaml components/hive-crds/*.yaml
var crdFiles embed.FS

// CRDs returns the CustomResourceDefinition manifests agentboot installs, one
// YAML document per element, in a stable order.
func CRDs() ([][]byte, error) { return files("crds/*.yaml") }

// HiveCRDs returns the optional hive-crds component's CRDs
// (ClusterDeployment, AgentClusterInstall), for clusters without hive.
func HiveCRDs() ([][]byte, error) { return files("components/hive-crds/*_*.yaml") }

func files(pattern string) ([][]byte, error) {
	names, err := fs.Glob(crdFiles, pattern)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		data, err := crdFiles.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path.Base(n), err)
		}
		out = append(out, data)
	}
	return out, nil
}
