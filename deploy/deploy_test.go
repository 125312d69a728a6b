package deploy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/testenv"
	"github.com/agentboot/agentboot/test/stack"
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

// The RBAC in deploy/ is enough, and no more than needed: the manager and
// the image service run as their ServiceAccounts, in two processes, and
// publish and serve a discovery image.
func TestRBACIsSufficient(t *testing.T) {
	ctx := context.Background()
	var admin *testenv.Env
	s := stack.Start(t, stack.Options{Identities: func(env *testenv.Env) (*rest.Config, *rest.Config, error) {
		admin = env
		return stack.Deployed(env)
	}})
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
	// and events are within the manager's rights.
	h := s.Register(t, got, 1)
	_, err := h.Heartbeat()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		return s.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a) == nil && a.Status.DebugInfo.State == "known-unbound"
	}, 30*time.Second, 100*time.Millisecond)

	// Least privilege: neither may list or watch Secrets; the manager reads
	// the ones it needs by name.
	checks := []struct{ verb, sa, want string }{
		{"list", "agentboot-image-service", "no"},
		{"list", "agentboot-manager", "no"},
		{"watch", "agentboot-manager", "no"},
		{"watch", "agentboot-image-service", "no"},
	}
	for _, c := range checks {
		out, _ := admin.Kubectl(ctx, "", "auth", "can-i", c.verb, "secrets", "--all-namespaces", "--as=system:serviceaccount:agentboot-system:"+c.sa)
		require.Equal(t, c.want, strings.TrimSpace(out), "%s %s", c.sa, c.verb)
	}
	out, _ := admin.Kubectl(ctx, "", "auth", "can-i", "get", "secrets", "-n", ns, "--as=system:serviceaccount:agentboot-system:agentboot-image-service")
	require.Equal(t, "no", strings.TrimSpace(out), "the image service never reads pull secrets")
}
