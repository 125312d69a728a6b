package deploy

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// The kustomize base must be accepted by a real apiserver: schemas, RBAC
// (which the apiserver checks for escalation) and pod security.
func TestKustomizeBaseServerDryRun(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	ctx := context.Background()

	// A server-side dry run cannot create the namespace its objects live in.
	_, err := env.Kubectl(ctx, "", "create", "namespace", "agentboot-system", "--save-config")
	require.NoError(t, err)

	out, stderr, err := env.KubectlWithStderr(ctx, "", "apply", "--dry-run=server", "-k", testenv.RepoRoot()+"/deploy")
	require.NoError(t, err)
	require.NotContains(t, stderr, "Warning", "pod security or deprecation warnings")
	for _, want := range []string{
		"customresourcedefinition.apiextensions.k8s.io/infraenvs.agent-install.openshift.io",
		"customresourcedefinition.apiextensions.k8s.io/agents.agent-install.openshift.io",
		"customresourcedefinition.apiextensions.k8s.io/nmstateconfigs.agent-install.openshift.io",
		"customresourcedefinition.apiextensions.k8s.io/baremetalhosts.metal3.io",
		"serviceaccount/agentboot-manager",
		"deployment.apps/agentboot-manager",
		"serviceaccount/agentboot-image-service",
		"deployment.apps/agentboot-image-service",
		"service/agentboot-image-service",
	} {
		require.Contains(t, out, want)
	}
	require.Equal(t, strings.Count(out, "\n"), strings.Count(out, "(server dry run)"), out)
	// HyperShift's kinds are never ours to install.
	require.NotContains(t, out, "hypershift.openshift.io")
}

// The RBAC in deploy/ is enough, and no more than needed: the manager, the
// agent API and the image service run as their ServiceAccounts, in three
// processes, publish and serve a discovery image and take a host's
// registration; the agent API reads no Secret at all.
func TestRBACIsSufficient(t *testing.T) {
	ctx := context.Background()
	var admin *testenv.Env
	var ids stack.Identities
	s := stack.Start(t, stack.Options{Identities: func(env *testenv.Env) (stack.Identities, error) {
		admin = env
		var err error
		ids, err = stack.Deployed(env)
		return ids, err
	}})
	canI := func(sa string, args ...string) string {
		t.Helper()
		out, _ := admin.Kubectl(ctx, "", append(append([]string{"auth", "can-i"}, args...), "--as=system:serviceaccount:agentboot-system:"+sa)...)
		return strings.TrimSpace(out)
	}
	ns := s.Namespace(t, "rbac")
	ie := stack.NewInfraEnv(ns, "env")
	require.NoError(t, s.Client.Create(ctx, ie))
	got := s.WaitImage(t, client.ObjectKeyFromObject(ie))
	for _, u := range []string{got.Status.ISODownloadURL, got.Status.BootArtifacts.IpxeScriptURL, got.Status.BootArtifacts.DiscoveryIgnitionURL} {
		// The image service process has its own catalog: until it has
		// the base image too it answers 503 with Retry-After, as a
		// replica that has just started would.
		status := 0
		require.Eventually(t, func() bool {
			resp, err := s.HTTP.Get(s.Local(u))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
			return status != http.StatusServiceUnavailable
		}, time.Minute, 200*time.Millisecond, u)
		require.Equal(t, http.StatusOK, status, u)
	}

	// A host registers, reports and heartbeats: Agents, their status, Leases
	// and events are within the agent API's rights, and the Agent
	// controller's within the manager's.
	h := s.Register(t, got, 1)
	_, err := h.Heartbeat()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		return s.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a) == nil && a.Status.DebugInfo.State == "known-unbound"
	}, 30*time.Second, 100*time.Millisecond)

	// Least privilege: none may list or watch Secrets; the manager reads
	// the ones it needs by name.
	for _, sa := range []string{"agentboot-manager", "agentboot-image-service", "agentboot-agent-api"} {
		for _, verb := range []string{"list", "watch"} {
			require.Equal(t, "no", canI(sa, verb, "secrets", "--all-namespaces"), "%s %s secrets", sa, verb)
		}
	}
	// The agent API, which parses what hosts send, reads no Secret at all:
	// not its keys (they are mounted), not the signing key, not a join
	// token (the manager hands installations over sealed).
	for _, args := range [][]string{{"get", "secrets", "--all-namespaces"}, {"get", "secrets", "-n", stack.Namespace},
		{"get", "secrets/" + signing.AgentAPISecretName, "-n", stack.Namespace}, {"get", "secrets/" + signing.SecretName, "-n", stack.Namespace}} {
		require.Equal(t, "no", canI("agentboot-agent-api", args...), "agent API: %v", args)
	}
	// In agentboot's namespace, where its configuration, leader Lease,
	// handovers and records live, the agent API writes only what it owns:
	// erase debts, disk-boot records and hosts' Leases (the admission
	// policy in deploy/; RBAC cannot say it).
	api, err := client.New(ids.AgentAPI, client.Options{Scheme: s.Client.Scheme()})
	require.NoError(t, err)
	var configs corev1.ConfigMapList
	require.NoError(t, s.Client.List(ctx, &configs, client.InNamespace(stack.Namespace)))
	for i := range configs.Items {
		cm := &configs.Items[i]
		if !strings.HasPrefix(cm.Name, "agentboot-config") {
			continue
		}
		patch := client.MergeFrom(cm.DeepCopy())
		cm.Data["OS_IMAGE_STREAM"] = "https://attacker.example/stream.json"
		require.ErrorContains(t, api.Patch(ctx, cm, patch), "the agent API writes only configmaps labelled", "agent API rewrote %s", cm.Name)
		require.ErrorContains(t, api.Delete(ctx, cm), "the agent API writes only configmaps labelled")
	}
	require.ErrorContains(t, api.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stack.Namespace, Name: "planted"}}),
		"the agent API writes only configmaps labelled")
	require.ErrorContains(t, api.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: stack.Namespace, Name: "agentboot-manager"}}),
		"the agent API writes only leases labelled")
	debt := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stack.Namespace, Name: "erase-debt-test", Labels: map[string]string{"agentboot.io/erase-debt": "true"}}}
	require.NoError(t, api.Create(ctx, debt))
	relabel := client.MergeFrom(debt.DeepCopy())
	delete(debt.Labels, "agentboot.io/erase-debt")
	require.ErrorContains(t, api.Patch(ctx, debt, relabel), "the agent API writes only configmaps labelled", "relabelled out of what it owns")
	require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(debt), debt))
	require.NoError(t, api.Delete(ctx, debt))

	// The Agent's registration record, which agentboot decides by, is in
	// its status: only agentboot may write that (docs/security.md).
	for sa, want := range map[string]string{"agentboot-manager": "yes", "agentboot-agent-api": "yes", "agentboot-image-service": "no"} {
		require.Equal(t, want, canI(sa, "patch", "agents.agent-install.openshift.io", "--subresource=status", "--all-namespaces"), "%s patch agents/status", sa)
	}
	// Nor Agents: which hosts boot from their disks it learns from the
	// manager's records, not from registration records.
	require.Equal(t, "no", canI("agentboot-image-service", "get", "agents.agent-install.openshift.io", "--all-namespaces"))
	out, _ := admin.Kubectl(ctx, "", "auth", "can-i", "get", "secrets", "-n", ns, "--as=system:serviceaccount:agentboot-system:agentboot-image-service")
	require.Equal(t, "no", strings.TrimSpace(out), "the image service never reads pull secrets")
	// The image service reads its own keys, never the master key: it
	// cannot mint agent tokens.
	for secret, want := range map[string]string{signing.ImageServiceSecretName: "yes", signing.SecretName: "no"} {
		out, _ := admin.Kubectl(ctx, "", "auth", "can-i", "get", "secrets/"+secret, "-n", stack.Namespace, "--as=system:serviceaccount:agentboot-system:agentboot-image-service")
		require.Equal(t, want, strings.TrimSpace(out), "image service get %s", secret)
	}
}

// The hive-crds component stores what cluster-api-provider-agent writes,
// unchanged, under the same names as hive's and assisted-service's own
// CRDs, so that a cluster can move from one to the other.
func TestHiveCRDsComponent(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	ctx := context.Background()
	out, err := env.Kubectl(ctx, "", "apply", "-k", testenv.RepoRoot()+"/deploy/hive-crds")
	require.NoError(t, err, out)
	require.Contains(t, out, "customresourcedefinition.apiextensions.k8s.io/clusterdeployments.hive.openshift.io")
	require.Contains(t, out, "customresourcedefinition.apiextensions.k8s.io/agentclusterinstalls.extensions.hive.openshift.io")

	ours, err := HiveCRDs()
	require.NoError(t, err)
	require.Len(t, ours, 2)
	for _, doc := range ours {
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.Unmarshal(doc, &crd))
		upstream, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "test", "crds", "upstream", crd.Spec.Group+"_"+crd.Spec.Names.Plural+".yaml"))
		require.NoError(t, err)
		var up apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.Unmarshal(upstream, &up))
		require.Equal(t, up.Name, crd.Name)
		require.Equal(t, up.Spec.Names.Kind, crd.Spec.Names.Kind)
		require.Equal(t, up.Spec.Scope, crd.Spec.Scope)
		var served []string
		for _, v := range up.Spec.Versions {
			if v.Storage {
				served = append(served, v.Name)
			}
		}
		require.Equal(t, served, []string{crd.Spec.Versions[0].Name}, "the storage version")
	}

	// Objects as the provider writes them (test/capiagent).
	for _, manifest := range []string{`
apiVersion: hive.openshift.io/v1
kind: ClusterDeployment
metadata: {name: vcluster2, namespace: default, labels: {agentClusterRef: vcluster2}}
spec:
  installed: true
  clusterName: vcluster2
  baseDomain: example.com
  platform: {agentBareMetal: {agentSelector: {}}}
  clusterInstallRef: {group: extensions.hive.openshift.io, version: v1beta1, kind: AgentClusterInstall, name: vcluster2}
  pullSecretRef: {name: pull-secret}
  clusterMetadata: {clusterID: 0b6e, infraID: 0b6e, adminKubeconfigSecretRef: {name: admin-kubeconfig}, adminPasswordSecretRef: {name: kubeadmin-password}}
`, `
apiVersion: extensions.hive.openshift.io/v1beta1
kind: AgentClusterInstall
metadata: {name: vcluster2, namespace: default}
spec:
  clusterDeploymentRef: {name: vcluster2}
  provisionRequirements: {controlPlaneAgents: 3}
  networking: {userManagedNetworking: true}
  ignitionEndpoint: {url: "https://ignition.example.com", caCertificateReference: {namespace: default, name: ignition-server-ca-cert}}
`} {
		_, err := env.Kubectl(ctx, manifest, "create", "-f", "-")
		require.NoError(t, err)
		var want map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(manifest), &want))
		got, err := env.Kubectl(ctx, "", "get", want["kind"].(string), "-n", "default", "vcluster2", "-o", "json")
		require.NoError(t, err)
		var stored map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(got), &stored))
		require.Equal(t, want["spec"], stored["spec"], "stored as written")
	}
}

// docs/trace.md's overlay, as written there, gives the image service the
// boot observations token: the flag names a file in the Secret's volume,
// and a real apiserver accepts it all.
func TestBootObservationsOverlay(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "trace.md"))
	require.NoError(t, err)
	section := strings.SplitN(strings.SplitN(string(doc), "## Deploying it", 2)[1], "## Limits", 2)[0]
	block := strings.SplitN(strings.SplitN(section, "```yaml\n", 2)[1], "```", 2)[0]
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(testenv.RepoRoot(), "deploy"))
	require.NoError(t, err)
	overlay := "resources:\n  - " + base + "\nsecretGenerator:\n  - name: agentboot-boot-observations\n    namespace: agentboot-system\n" +
		"    options: {disableNameSuffixHash: true}\n    literals: [token=observations-token-0123456789]\n" + block
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644))

	env := testenv.StartT(t, testenv.Options{NoCRDs: true})
	ctx := context.Background()
	out, err := env.Kubectl(ctx, "", "kustomize", dir)
	require.NoError(t, err, out)
	var found bool
	for _, d := range strings.Split(out, "\n---\n") {
		if !strings.Contains(d, "name: agentboot-image-service\n") || !strings.Contains(d, "kind: Deployment") {
			continue
		}
		found = true
		require.Contains(t, d, "--boot-observations-token-file=/etc/agentboot/observations/token")
		require.Contains(t, d, "mountPath: /etc/agentboot/observations")
		require.Contains(t, d, "secretName: agentboot-boot-observations")
	}
	require.True(t, found, "the image service's Deployment")
	_, err = env.Kubectl(ctx, "", "create", "namespace", "agentboot-system")
	require.NoError(t, err)
	out, stderr, err := env.KubectlWithStderr(ctx, "", "apply", "--dry-run=server", "-k", dir)
	require.NoError(t, err, stderr)
	require.Contains(t, out, "deployment.apps/agentboot-image-service created (server dry run)")
	require.Contains(t, out, "secret/agentboot-boot-observations created (server dry run)")
}
