// Package helmchart renders and lints agentboot's Helm chart
// (deploy/chart/agentboot) with Helm's own packages, as helm template and
// helm lint do, for the tests that install it.
package helmchart

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/agentboot/agentboot/test/testenv"
)

// Dir is the chart.
func Dir() string { return filepath.Join(testenv.RepoRoot(), "deploy", "chart", "agentboot") }

// Render is `helm template agentboot deploy/chart/agentboot --namespace
// namespace` with values over the chart's: the manifests, in template
// order, as one YAML stream.
func Render(namespace string, values map[string]any) (string, error) {
	ch, err := loader.Load(Dir())
	if err != nil {
		return "", err
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "agentboot", Namespace: namespace, IsInstall: true, Revision: 1}, nil)
	if err != nil {
		return "", err
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		if strings.HasSuffix(n, ".yaml") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if s := strings.TrimSpace(out[n]); s != "" {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, s)
		}
	}
	return b.String(), nil
}

// Lint is `helm lint --strict` with values: the messages of warning
// severity or worse.
func Lint(namespace string, values map[string]any) []string {
	l := lint.All(Dir(), values, namespace, false)
	var out []string
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			out = append(out, m.Error())
		}
	}
	return out
}
