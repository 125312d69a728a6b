package deploy

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/testenv"
)

// The kustomize base must be accepted by a real apiserver: schemas, RBAC
// (which the apiserver checks for escalation) and pod security.
func TestKustomizeBaseServerDryRun(t *testing.T) {
	env, err := testenv.Start(testenv.Options{NoCRDs: true})
	require.NoError(t, err)
	defer env.Stop()
	ctx := context.Background()

	// A server-side dry run cannot create the namespace its objects live in.
	_, err = env.Kubectl(ctx, "", "create", "namespace", "agentboot-system", "--save-config")
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
	} {
		require.Contains(t, out, want)
	}
	require.Equal(t, strings.Count(out, "\n"), strings.Count(out, "(server dry run)"), out)
	// HyperShift's kinds are never ours to install.
	require.NotContains(t, out, "hypershift.openshift.io")
}
