package deploy

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/agentboot/agentboot/test/helmchart"
	"github.com/agentboot/agentboot/test/testenv"
)

func objects(t *testing.T, stream string) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		var o map[string]any
		if err := dec.Decode(&o); err == io.EOF {
			return out
		} else {
			require.NoError(t, err)
		}
		if len(o) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: o}
		key := fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		require.NotContains(t, out, key, "twice")
		out[key] = u
	}
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// setImages sets every container's image.
func setImages(t *testing.T, o *unstructured.Unstructured, image string) {
	containers, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	if !found {
		return
	}
	for _, c := range containers {
		c.(map[string]any)["image"] = image
	}
	require.NoError(t, unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"))
}

// The chart installs what the kustomize base installs, object for object
// and field for field, but for what a chart does its own way: no
// Namespace (helm install --create-namespace), a ConfigMap named without
// a hash and a checksum annotation to roll the pods instead, CRDs kept on
// uninstall, and Helm's managed-by label. Its values.yaml's config is
// config.env's.
func TestHelmChartIsTheBase(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	kustomized, err := env.Kubectl(context.Background(), "", "kustomize", filepath.Join(testenv.RepoRoot(), "deploy"))
	require.NoError(t, err)
	base := objects(t, kustomized)
	chart, err := helmchart.Render("agentboot-system", nil)
	require.NoError(t, err)
	got := objects(t, chart)

	for k, o := range base {
		switch {
		case o.GetKind() == "Namespace":
			delete(base, k)
		case o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "agentboot-config-"):
			// Its data is config.env, which a user edits in place
			// (TestHelmValuesAreConfigEnv compares it with values.yaml).
			delete(base, k)
			o.SetName("agentboot-config")
			unstructured.RemoveNestedField(o.Object, "data")
			base["ConfigMap agentboot-system/agentboot-config"] = o
		case o.GetKind() == "Deployment":
			setImages(t, o, "IMAGE")
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				from, _, _ := unstructured.NestedSlice(c.(map[string]any), "envFrom")
				for _, f := range from {
					ref := f.(map[string]any)["configMapRef"].(map[string]any)
					if strings.HasPrefix(ref["name"].(string), "agentboot-config-") {
						ref["name"] = "agentboot-config"
					}
				}
				if from != nil {
					c.(map[string]any)["envFrom"] = from
				}
			}
			require.NoError(t, unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"))
		}
	}
	unstructured.RemoveNestedField(got["ConfigMap agentboot-system/agentboot-config"].Object, "data")
	for _, o := range got {
		labels := o.GetLabels()
		require.Equal(t, "Helm", labels["app.kubernetes.io/managed-by"], "%s %s", o.GetKind(), o.GetName())
		delete(labels, "app.kubernetes.io/managed-by")
		o.SetLabels(labels)
		a := o.GetAnnotations()
		if o.GetKind() == "CustomResourceDefinition" {
			require.Equal(t, "keep", a["helm.sh/resource-policy"], "a CRD deleted on uninstall deletes every object of its kind")
			delete(a, "helm.sh/resource-policy")
		}
		if len(a) == 0 {
			a = nil
		}
		o.SetAnnotations(a)
		if o.GetKind() == "Deployment" {
			setImages(t, o, "IMAGE")
			ann, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "annotations")
			if o.GetName() != "agentboot-agent-api" {
				require.Len(t, ann["checksum/config"], 64, "%s rolls when the config changes", o.GetName())
			}
			unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations")
		}
	}
	require.Equal(t, keys(base), keys(got))
	for k := range base {
		require.Equal(t, base[k].Object, got[k].Object, k)
	}
	require.Empty(t, helmchart.Lint("agentboot-system", nil), "helm lint")
}

// What a Helm user sets lands where it should, in the namespace they
// install into, and a real apiserver accepts it all (schemas, RBAC, pod
// security) with the hive CRDs too.
func TestHelmChartValues(t *testing.T) {
	values := map[string]any{
		"image":        map[string]any{"repository": "registry.example:5000/team/agentboot", "digest": "sha256:" + strings.Repeat("ab", 32)},
		"config":       map[string]any{"AGENT_API_URL": "https://203.0.113.7:7443", "OS_IMAGE_STREAM": "https://mirror.example/stream.json"},
		"manager":      map[string]any{"replicas": 3},
		"imageService": map[string]any{"service": map[string]any{"type": "NodePort"}},
		"hiveCRDs":     true,
	}
	require.Empty(t, helmchart.Lint("infra", values), "helm lint")
	chart, err := helmchart.Render("infra", values)
	require.NoError(t, err)
	got := objects(t, chart)

	m := got["Deployment infra/agentboot-manager"]
	require.NotNil(t, m, "%v", keys(got))
	replicas, _, _ := unstructured.NestedFieldNoCopy(m.Object, "spec", "replicas")
	require.EqualValues(t, 3, replicas)
	containers, _, _ := unstructured.NestedSlice(m.Object, "spec", "template", "spec", "containers")
	require.Equal(t, "registry.example:5000/team/agentboot@sha256:"+strings.Repeat("ab", 32), containers[0].(map[string]any)["image"])
	svcType, _, _ := unstructured.NestedString(got["Service infra/agentboot-image-service"].Object, "spec", "type")
	require.Equal(t, "NodePort", svcType)
	cm := got["ConfigMap infra/agentboot-config"]
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	require.Equal(t, "https://203.0.113.7:7443", data["AGENT_API_URL"])
	require.Equal(t, "https://mirror.example/stream.json", data["OS_IMAGE_STREAM"])
	require.Equal(t, "http://agentboot.example.com:8080", data["IMAGE_SERVICE_HTTP_URL"], "the defaults of the keys not set")
	for _, k := range []string{"ClusterRoleBinding /agentboot-manager", "ClusterRoleBinding /agentboot-agent-api"} {
		require.Contains(t, chart, "namespace: infra")
		subjects, _, _ := unstructured.NestedSlice(got[k].Object, "subjects")
		require.Equal(t, "infra", subjects[0].(map[string]any)["namespace"], k)
	}
	require.NotContains(t, chart, "agentboot-system", "the release's namespace everywhere")
	require.Contains(t, got, "CustomResourceDefinition /clusterdeployments.hive.openshift.io")

	// Without a digest, the chart's appVersion is the tag.
	chart, err = helmchart.Render("infra", map[string]any{"image": map[string]any{"repository": "registry.example/agentboot"}})
	require.NoError(t, err)
	require.Contains(t, chart, `image: "registry.example/agentboot:v0.1.0"`)

	// Behind an ingress: no externalTrafficPolicy, which a ClusterIP
	// Service may not have.
	chart, err = helmchart.Render("infra", map[string]any{"agentAPI": map[string]any{"service": map[string]any{"type": "ClusterIP"}}})
	require.NoError(t, err)
	api := objects(t, chart)["Service infra/agentboot-agent-api"]
	_, found, _ := unstructured.NestedString(api.Object, "spec", "externalTrafficPolicy")
	require.False(t, found)
	policy, _, _ := unstructured.NestedString(objects(t, chart)["Service infra/agentboot-image-service"].Object, "spec", "externalTrafficPolicy")
	require.Equal(t, "Local", policy, "the other Service keeps it")

	// Values of the wrong form are refused before anything is rendered,
	// with the value named: none can write YAML of its own.
	for _, bad := range []map[string]any{
		{"image": map[string]any{"repository": "agentboot\nkind: Secret"}},
		{"image": map[string]any{"digest": "latest"}},
		{"config": map[string]any{"BAD\nKEY": "x"}},
		{"imageService": map[string]any{"service": map[string]any{"type": "ExternalName"}}},
		{"manager": map[string]any{"replicas": "2\nevil: true"}},
		{"typo": true},
	} {
		_, err := helmchart.Render("infra", bad)
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), "schema", "%v", bad)
	}
	require.NotContains(t, chart, "clusterdeployments.hive.openshift.io", "hive's CRDs only when asked for")

	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	ctx := context.Background()
	_, err = env.Kubectl(ctx, "", "create", "namespace", "infra")
	require.NoError(t, err)
	_, err = env.Kubectl(ctx, "", "label", "namespace", "infra", "pod-security.kubernetes.io/enforce=restricted")
	require.NoError(t, err)
	chart, err = helmchart.Render("infra", values)
	require.NoError(t, err)
	out, stderr, err := env.KubectlWithStderr(ctx, chart, "apply", "--dry-run=server", "-f", "-")
	require.NoError(t, err, stderr)
	require.NotContains(t, stderr, "Warning", "pod security or deprecation warnings")
	require.Equal(t, strings.Count(out, "\n"), strings.Count(out, "(server dry run)"), out)
}

// values.yaml's config has config.env's keys and defaults, so that the two
// install paths start from the same settings. A config.env edited in place
// as the README says (uncommitted) is compared by its keys only.
func TestHelmValuesAreConfigEnv(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "deploy", "config.env")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	edited := exec.Command("git", "-C", testenv.RepoRoot(), "diff", "--quiet", "HEAD", "--", "deploy/config.env").Run() != nil
	want := map[string]any{}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		want[k] = v
	}
	chart, err := helmchart.Render("x", nil)
	require.NoError(t, err)
	data, _, _ := unstructured.NestedMap(objects(t, chart)["ConfigMap x/agentboot-config"].Object, "data")
	if edited {
		t.Logf("%s is edited in this tree: its keys are compared, not its values", path)
		require.ElementsMatch(t, keysOf(want), keysOf(data))
		return
	}
	require.Equal(t, want, data)
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// monitoring.enabled installs the monitoring component's objects, as
// kustomize renders deploy/monitoring, the alerts' and the dashboard's own
// {{ }} templates untouched; without it, none.
func TestHelmChartMonitoring(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	kustomized, err := env.Kubectl(context.Background(), "", "kustomize", filepath.Join(testenv.RepoRoot(), "deploy", "monitoring"))
	require.NoError(t, err)
	want := objects(t, kustomized)
	require.Len(t, want, 3)
	off, err := helmchart.Render("agentboot-system", nil)
	require.NoError(t, err)
	on, err := helmchart.Render("agentboot-system", map[string]any{"monitoring": map[string]any{"enabled": true}})
	require.NoError(t, err)
	without, with := objects(t, off), objects(t, on)
	for k, o := range want {
		require.NotContains(t, without, k)
		got := with[k]
		require.NotNil(t, got, k)
		labels := got.GetLabels()
		require.Equal(t, "Helm", labels["app.kubernetes.io/managed-by"])
		delete(labels, "app.kubernetes.io/managed-by")
		got.SetLabels(labels)
		require.Equal(t, o.Object, got.Object, k)
	}
	require.Len(t, with, len(without)+len(want))
	require.Contains(t, on, "{{ $labels.namespace }}", "Prometheus's templates reach it unchanged")
	require.Empty(t, helmchart.Lint("agentboot-system", map[string]any{"monitoring": map[string]any{"enabled": true}}), "helm lint")
}
