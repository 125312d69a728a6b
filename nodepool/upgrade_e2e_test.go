//go:build e2e

package nodepool_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/release"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// TestUpgradeMidInstallation: the previous release (test/release/previous,
// built from its commit) runs as deployed, from its own deploy/ (CRDs and
// RBAC) and binaries: it publishes an InfraEnv's ISO, two hosts register
// and are approved, a NodePool binds them, they are given their
// installations and start writing their disks. Then this release replaces
// it, as a rollout of the new image does after `kubectl apply -k deploy/`:
// the hosts go on reporting to the new processes, which hand out no second
// installation, follow them into the hosted cluster and to Done; no host
// registers again (same Agents, same sessions), no Agent is added, and the
// ISO URL the previous release published still downloads.
func TestUpgradeMidInstallation(t *testing.T) {
	prev, err := release.Previous()
	require.NoError(t, err)
	current := filepath.Join(testenv.RepoRoot(), "bin", "agentboot")
	_, err = os.Stat(current)
	require.NoError(t, err, "make build (make e2e does it first)")
	version := func(bin string) string {
		out, err := exec.Command(bin, "version").Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))
	}
	require.Equal(t, prev.Version, version(prev.Agentboot))
	t.Logf("upgrading from %s (commit %.12s) to %s. %s", prev.Version, prev.Commit, version(current), prev.Note)

	s := stack.Start(t, stack.Options{Binary: prev.Agentboot, Identities: stack.DeployedFrom(prev.Deploy)})
	e := startOn(t, s, true)
	ctx := context.Background()
	iso := e.ie.Status.ISODownloadURL
	require.NotEmpty(t, iso, "the previous release published the ISO")
	hosts := []*stack.Host{e.readyHost(1, map[string]string{"pool": "a"}), e.readyHost(2, map[string]string{"pool": "a"})}
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(2)
	for _, h := range hosts {
		e.installStep(h)
		require.NoError(t, h.Progress("Starting installation", 0, "installing to /dev/vda"))
		require.NoError(t, h.Progress("Writing image to disk", 30, ""))
	}
	before := map[string]*v1beta1.Agent{}
	for _, h := range hosts {
		before[h.ID] = e.agent(h)
	}

	s.Upgrade(t, current, filepath.Join(testenv.RepoRoot(), "deploy"))

	for _, h := range hosts {
		var in agentwire.Instructions
		require.Eventually(t, func() bool {
			var err error
			in, err = h.Heartbeat()
			return err == nil // else the new agent API is not listening yet
		}, wait, 500*time.Millisecond)
		require.Empty(t, in.Steps, "the installation is handed out once, whichever release answers")
		require.NoError(t, h.Progress("Writing image to disk", 60, ""))
		require.NoError(t, h.Progress("Rebooting", 100, ""))
		require.NoError(t, h.StepResult("install", agentwire.StepResult{Output: "installed to /dev/vda"}))
	}
	for i, h := range hosts {
		name := "host-" + string(rune('1'+i))
		kl := &hosted.Kubelet{T: t, C: e.hosted, Name: name}
		kl.CSR(name+"-client", hosted.ClientSigner, hosted.Bootstrapper, name, nil, nil, hosted.ClientUsages...)
		require.Eventually(t, func() bool { return kl.Approved(name + "-client") }, wait, 100*time.Millisecond)
		kl.Register()
		kl.Ready()
		e.waitAgent(h, "done", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == lifecycle.StateAddedToExistingCluster })
	}
	require.Eventually(t, func() bool {
		machines := np.Machines()
		if len(machines) != 2 {
			return false
		}
		for _, m := range machines {
			ready, _, _ := unstructured.NestedBool(np.AgentMachine(m.GetName()).Object, "status", "ready")
			if !ready {
				return false
			}
		}
		return true
	}, wait, 200*time.Millisecond, "both AgentMachines Ready")

	// Nothing lost: the same Agents, in the sessions they registered in
	// under the previous release.
	var agents v1beta1.AgentList
	require.NoError(t, e.Client.List(ctx, &agents, client.InNamespace(e.agentsNS)))
	require.Len(t, agents.Items, 2, "no Agent added")
	for _, h := range hosts {
		a, b := e.agent(h), before[h.ID]
		require.Equal(t, b.UID, a.UID, "the same Agent")
		require.NotNil(t, a.Status.Registration)
		require.Equal(t, b.Status.Registration.Session, a.Status.Registration.Session, "no host registered again")
		require.Equal(t, b.Status.Registration.SessionStarted, a.Status.Registration.SessionStarted)
		require.Equal(t, b.Status.Inventory, a.Status.Inventory, "the inventory kept")
	}
	// The ISO the previous release published is still served.
	require.FileExists(t, s.Download(t, iso))
}
