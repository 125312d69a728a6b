// Package monitoring tests deploy/components/monitoring, the alerts,
// ServiceMonitor and Grafana dashboard users import, with the real
// Prometheus and promtool (Debian's prometheus package, .ci/packages).
package monitoring_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

func TestMain(m *testing.M) { stack.Main(m) }

// component is deploy/components/monitoring's directory.
func component() string {
	return filepath.Join(testenv.RepoRoot(), "deploy", "components", "monitoring")
}

// tool finds a Prometheus program, saying where it comes from.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install Debian's prometheus package (.ci/packages; hack/prereqs.sh as root)", name)
	}
	return path
}

// rules writes the PrometheusRule's groups as a Prometheus rule file in
// dir, as the Prometheus operator hands them to Prometheus.
func rules(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(component(), "prometheusrule.yaml"))
	require.NoError(t, err)
	var rule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rule))
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	require.NoError(t, err)
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, out, 0o644))
	return path
}

// promtool checks the rules and runs their unit tests
// (testdata/alerts_test.yaml): each alert fires where it should and not
// where it should not.
func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	out, err := exec.Command(promtool, "check", "rules", rules(t, dir)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644))
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "SUCCESS")
}

// render runs kustomize on a directory of deploy/.
func render(t *testing.T, env *testenv.Env, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := env.Kubectl(context.Background(), "", "kustomize", filepath.Join(testenv.RepoRoot(), "deploy", dir))
	require.NoError(t, err, out)
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(out, "\n---\n") {
		u := &unstructured.Unstructured{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object))
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// The component is accepted by a real apiserver with the Prometheus
// operator's own CRDs; its ServiceMonitor scrapes exactly the base's
// metrics Services, each on the port the process serves metrics on; the
// dashboard ConfigMap carries the JSON file; and every metric the alerts
// and the dashboard read is one agentboot reports and documents.
func TestComponent(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	ctx := context.Background()
	// The Prometheus operator's own CRDs, as it installs them.
	out, err := env.Kubectl(ctx, "", "apply", "-f", filepath.Join(testenv.RepoRoot(), "test", "crds", "upstream", "prometheus-operator"))
	require.NoError(t, err, out)
	out, err = env.Kubectl(ctx, "", "wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
	require.NoError(t, err, out)
	_, err = env.Kubectl(ctx, "", "create", "namespace", "agentboot-system")
	require.NoError(t, err)
	out, stderr, err := env.KubectlWithStderr(ctx, "", "apply", "--dry-run=server", "-k", filepath.Join(testenv.RepoRoot(), "deploy", "monitoring"))
	require.NoError(t, err, stderr)
	require.NotContains(t, stderr, "Warning")
	for _, want := range []string{"servicemonitor.monitoring.coreos.com/agentboot", "prometheusrule.monitoring.coreos.com/agentboot", "configmap/agentboot-grafana-dashboard"} {
		require.Contains(t, out, want+" created (server dry run)")
	}

	mon := render(t, env, "monitoring")
	sm := find(mon, "ServiceMonitor", "agentboot")
	require.NotNil(t, sm)
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	port := endpoints[0].(map[string]any)["port"].(string)
	require.Equal(t, true, endpoints[0].(map[string]any)["honorLabels"], "the InfraEnv's namespace label must survive the operator's relabelling")

	base := render(t, env, "")
	var selected []string
	for _, svc := range base {
		if svc.GetKind() != "Service" || !matches(selector, svc.GetLabels()) {
			continue
		}
		selected = append(selected, svc.GetName())
		// The Service's port of that name reaches a container port the
		// process serves metrics on.
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		var target string
		for _, p := range ports {
			if p.(map[string]any)["name"] == port {
				target = fmt.Sprint(p.(map[string]any)["targetPort"])
			}
		}
		require.NotEmpty(t, target, "Service %s has no port %q", svc.GetName(), port)
		podSelector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		var served bool
		for _, d := range base {
			labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
			if d.GetKind() != "Deployment" || !matches(podSelector, labels) {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				c := c.(map[string]any)
				for _, p := range c["ports"].([]any) {
					p := p.(map[string]any)
					if p["name"] == target && slices.Contains(toStrings(c["args"]), fmt.Sprintf("--metrics-bind-address=:%v", p["containerPort"])) {
						served = true
					}
				}
			}
		}
		require.True(t, served, "Service %s's port %s reaches no container serving metrics", svc.GetName(), target)
	}
	slices.Sort(selected)
	require.Equal(t, []string{"agentboot-agent-api-metrics", "agentboot-image-service-metrics", "agentboot-manager-metrics"}, selected)

	cm := find(mon, "ConfigMap", "agentboot-grafana-dashboard")
	require.NotNil(t, cm)
	require.Equal(t, "1", cm.GetLabels()["grafana_dashboard"])
	dashboard, err := os.ReadFile(filepath.Join(component(), "grafana-dashboard.json"))
	require.NoError(t, err)
	data, _, _ := unstructured.NestedString(cm.Object, "data", "agentboot.json")
	require.Equal(t, string(dashboard), data)

	// Every metric read is reported (named in the Go sources) and
	// documented (named in docs/metrics.md).
	docs, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "metrics.md"))
	require.NoError(t, err)
	sources := goSources(t)
	var exprs []string
	exprs = append(exprs, ruleExprs(t)...)
	exprs = append(exprs, dashboardExprs(t)...)
	names := map[string]bool{}
	for _, e := range exprs {
		for _, m := range regexp.MustCompile(`agentboot_[a-z_]+`).FindAllString(e, -1) {
			names[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")] = true
		}
	}
	require.NotEmpty(t, names)
	for n := range names {
		require.True(t, strings.Contains(string(docs), "`"+n+"`"), "docs/metrics.md does not document %s", n)
		require.True(t, strings.Contains(sources, `"`+n+`"`), "no Go source reports %s", n)
	}
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func toStrings(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, s := range list {
		out = append(out, fmt.Sprint(s))
	}
	return out
}

// goSources is every non-test Go source of the repository, concatenated.
func goSources(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	root := testenv.RepoRoot()
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "test" || strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "dist") && path != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			b.Write(data)
		}
		return nil
	}))
	return b.String()
}

func ruleExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(component(), "prometheusrule.yaml"))
	require.NoError(t, err)
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rule))
	var out []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

// dashboardExprs are the dashboard's queries with Grafana's variables
// given values, as Grafana sends them.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(component(), "grafana-dashboard.json"))
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "5m", "$namespace", ".*")
	var out []string
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			out = append(out, vars.Replace(target.Expr))
		}
	}
	return out
}

// Prometheus scrapes a running agentboot as the ServiceMonitor tells the
// Prometheus operator to (HTTPS, its ServiceAccount's token, which the
// metrics endpoint checks with Kubernetes), evaluates the rules, and a
// host stuck bound for two hours fires AgentbootHostStuck; every
// dashboard query evaluates.
func TestPrometheusScrapesAgentboot(t *testing.T) {
	prometheus := tool(t, "prometheus")
	s := stack.Start(t, stack.Options{Metrics: true})
	ctx := context.Background()
	dir := t.TempDir()

	// Prometheus's ServiceAccount, bound to agentboot-metrics-reader as
	// docs/metrics.md says; another that is not.
	base := render(t, s.Env, "")
	reader := find(base, "ClusterRole", "agentboot-metrics-reader")
	require.NotNil(t, reader)
	reader.SetResourceVersion("")
	require.NoError(t, client.IgnoreAlreadyExists(s.Client.Create(ctx, reader)))
	require.NoError(t, client.IgnoreAlreadyExists(s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}})))
	cs, err := kubernetes.NewForConfig(s.Env.Config)
	require.NoError(t, err)
	token := func(sa string) string {
		require.NoError(t, client.IgnoreAlreadyExists(s.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "monitoring", Name: sa}})))
		tr, err := cs.CoreV1().ServiceAccounts("monitoring").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	_, err = s.Env.Kubectl(ctx, "", "create", "clusterrolebinding", "prometheus-agentboot-metrics", "--clusterrole=agentboot-metrics-reader", "--serviceaccount=monitoring:prometheus")
	require.NoError(t, err)
	promToken := token("prometheus")

	// The endpoint refuses who Kubernetes does not authorize.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: insecureTLS()}, Timeout: 10 * time.Second}
	scrape := func(bearer string) int {
		req, err := http.NewRequest(http.MethodGet, s.MetricsURL, nil)
		require.NoError(t, err)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := insecure.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return scrape(promToken) == http.StatusOK }, 30*time.Second, 200*time.Millisecond, "the metrics endpoint serves Prometheus")
	require.Equal(t, http.StatusUnauthorized, scrape(""))
	require.Equal(t, http.StatusForbidden, scrape(token("nobody")))

	// The scrape job, made from the ServiceMonitor's endpoint as the
	// operator makes it.
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(promToken), 0o600))
	u, err := url.Parse(s.MetricsURL)
	require.NoError(t, err)
	sm := find(render(t, s.Env, "monitoring"), "ServiceMonitor", "agentboot")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep := endpoints[0].(map[string]any)
	require.Equal(t, "https", ep["scheme"])
	require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", ep["bearerTokenFile"], "the pod's own token, which the test writes to a file")
	job := map[string]any{
		"job_name": "agentboot-manager-metrics", "scheme": ep["scheme"], "metrics_path": ep["path"], "honor_labels": ep["honorLabels"],
		"authorization":  map[string]any{"credentials_file": tokenFile},
		"tls_config":     map[string]any{"insecure_skip_verify": ep["tlsConfig"].(map[string]any)["insecureSkipVerify"]},
		"static_configs": []any{map[string]any{"targets": []string{u.Host}}},
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"rule_files":     []string{rules(t, dir)},
		"scrape_configs": []any{job},
	})
	require.NoError(t, err)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgFile, cfg, 0o644))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(prometheus, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=info")
	logs, err := os.Create(filepath.Join(dir, "prometheus.log"))
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("prometheus:\n%s", out)
		}
	})
	api := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(api + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 200*time.Millisecond, "Prometheus never ready")

	// A host bound to a cluster two hours ago that never started
	// installing. (The test plays the two hours: it sets the Bound
	// condition's transition time back, as it would read after them.)
	ie := s.CreateInfraEnv(t, "team", "pool", nil)
	h := s.Register(t, ie, 1)
	key := client.ObjectKey{Namespace: h.NS, Name: h.ID}
	var a v1beta1.Agent
	require.Eventually(t, func() bool {
		if s.Client.Get(ctx, key, &a) != nil {
			return false
		}
		p := client.MergeFrom(a.DeepCopy())
		a.Spec.Approved = true
		a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: "clusters-vcluster2", Name: "vcluster2"}
		return s.Client.Patch(ctx, &a, p) == nil
	}, time.Minute, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		require.NoError(t, s.Client.Get(ctx, key, &a))
		c := conditions.Find(a.Status.Conditions, v1beta1.BoundCondition)
		if c == nil || c.Status != corev1.ConditionTrue {
			return false
		}
		if time.Since(c.LastTransitionTime.Time) > time.Hour {
			return true
		}
		p := client.MergeFromWithOptions(a.DeepCopy(), client.MergeFromWithOptimisticLock{})
		for i := range a.Status.Conditions {
			if a.Status.Conditions[i].Type == v1beta1.BoundCondition {
				a.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-2 * time.Hour))
			}
		}
		_ = s.Client.Status().Patch(ctx, &a, p)
		return false
	}, time.Minute, 200*time.Millisecond, "the Agent bound two hours ago")

	var alerts []alert
	if !assert.Eventually(t, func() bool {
		alerts = firing(t, api)
		for _, a := range alerts {
			if a.Labels["alertname"] == "AgentbootHostStuck" && a.Labels["state"] == "bound" &&
				a.Labels["namespace"] == ie.Namespace && a.Labels["infraenv"] == ie.Name {
				return strings.HasPrefix(a.Annotations["summary"], "A host of InfraEnv "+ie.Namespace+"/"+ie.Name+" has been bound for 2h")
			}
		}
		return false
	}, time.Minute, 500*time.Millisecond, "AgentbootHostStuck never fired: %+v", &alerts) {
		t.Fatalf("up: %v; the pool: %v; the Agent: %s %+v", query(t, api, "up"),
			query(t, api, fmt.Sprintf(`agentboot_agents_longest_in_state_seconds{namespace=%q} > 0`, ie.Namespace)), a.Status.DebugInfo.State, a.Status.Conditions)
	}
	for _, a := range alerts {
		require.NotEqual(t, "AgentbootPoolNotReported", a.Labels["alertname"], "the manager reports the pool")
		require.NotEqual(t, "AgentbootTargetDown", a.Labels["alertname"])
	}

	// Every dashboard query evaluates; the pool's have data (a rate needs
	// two samples of a series: the boot path's is checked as it is).
	for _, e := range dashboardExprs(t) {
		result := query(t, api, e)
		if strings.Contains(e, "agentboot_agents{") {
			require.NotEmpty(t, result, "no data for %s", e)
		}
	}
	require.NotEmpty(t, query(t, api, `agentboot_boot_path_total{hop="registered"} > 0`), "the host's registration, on the boot path")
	require.Len(t, query(t, api, fmt.Sprintf(`agentboot_agents{namespace=%q, infraenv=%q, state="bound"} == 1`, ie.Namespace, ie.Name)), 1)
}

type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

// firing lists the alerts Prometheus has firing.
func firing(t *testing.T, api string) []alert {
	t.Helper()
	resp, err := http.Get(api + "/api/v1/alerts")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "success", body.Status)
	var out []alert
	for _, a := range body.Data.Alerts {
		if a.State == "firing" {
			out = append(out, a)
		}
	}
	return out
}

// query evaluates an instant query, failing on an error.
func query(t *testing.T, api, expr string) []any {
	t.Helper()
	resp, err := http.PostForm(api+"/api/v1/query", url.Values{"query": {expr}})
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []any `json:"result"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "success", body.Status, "%s: %s", expr, body.Error)
	return body.Data.Result
}

// insecureTLS is what the ServiceMonitor's tlsConfig says: the metrics
// certificate is the process's own, signed by no CA.
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }
