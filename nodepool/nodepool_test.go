package nodepool_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coreos/ignition/v2/config/v3_2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vincent-petithory/dataurl"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hiveext "github.com/agentboot/agentboot/api/hiveext/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/binding"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/handover"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/nodepool/internal/worker"
	"github.com/agentboot/agentboot/test/capiagent"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// wait bounds every wait: generous, for a loaded two-core CI machine that
// runs several control planes at once.
const wait = 2 * time.Minute

// token is HyperShift's NodePool token (base64, as it puts it in the
// user-data's Authorization header).
const token = "bm9kZXBvb2wtdG9rZW4"

type env struct {
	*stack.Stack
	t        *testing.T
	agentsNS string // the InfraEnv's namespace, where the Agents live
	ie       *v1beta1.InfraEnv
	hosted   *hosted.Cluster
	cluster  *capiagent.Cluster
	// workerPasses are the worker controller's passes over bound Agents.
	workerPasses *testenv.Passes
}

// csrClockSkew is shorter than the default (10 s) so that a test can
// wait it out.
const csrClockSkew = 2 * time.Second

// start runs agentboot, a hosted cluster "vcluster2" whose Agents live in
// the InfraEnv's namespace, and HyperShift, Cluster API and (with
// provider) cluster-api-provider-agent around it.
func start(t *testing.T, provider bool) *env {
	// The manager runs with the RBAC deploy/ gives it.
	passes := testenv.NewPasses()
	e := startOn(t, stack.Start(t, stack.Options{NodePool: nodepool.Config{RetryAfter: time.Second, Poll: 300 * time.Millisecond, HandoverRefresh: 500 * time.Millisecond,
		CSRClockSkew: csrClockSkew, WorkerPasses: passes.Observe}, Identities: stack.Deployed}), provider)
	e.workerPasses = passes
	return e
}

// startOn is start on a running stack.
func startOn(t *testing.T, s *stack.Stack, provider bool) *env {
	e := &env{Stack: s, t: t, ie: s.CreateInfraEnv(t, "agents", "pool", nil), hosted: hosted.Start(t)}
	e.agentsNS = e.ie.Namespace
	_, _, ca, err := stack.Certificates(t.TempDir(), "ignition.vcluster2.example.com")
	require.NoError(t, err)
	e.cluster = capiagent.Start(t, s.Env, capiagent.Options{Namespace: s.Namespace(t, "clusters"), Name: "vcluster2", AgentNamespace: e.agentsNS,
		Hosted: e.hosted, IgnitionEndpoint: "ignition.vcluster2.example.com:443", IgnitionCA: ca, Token: token, Provider: provider})
	return e
}

// readyHost registers host i, approves and labels it, and waits until it
// is validated and connected.
func (e *env) readyHost(i int, labels map[string]string) *stack.Host {
	e.t.Helper()
	ctx := context.Background()
	h := e.Register(e.t, e.ie, i)
	require.Eventually(e.t, func() bool {
		var a v1beta1.Agent
		if e.Client.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a) != nil {
			return false
		}
		patch := client.MergeFrom(a.DeepCopy())
		a.Spec.Approved = true
		for k, v := range labels {
			a.Labels[k] = v
		}
		return e.Client.Patch(ctx, &a, patch) == nil
	}, wait, 100*time.Millisecond)
	e.waitAgent(h, "validated and connected", func(a *v1beta1.Agent) bool {
		return conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) && conditions.IsTrue(a.Status.Conditions, v1beta1.ConnectedCondition)
	})
	return h
}

func (e *env) agent(h *stack.Host) *v1beta1.Agent {
	var a v1beta1.Agent
	require.NoError(e.t, e.Client.Get(context.Background(), client.ObjectKey{Namespace: h.NS, Name: h.ID}, &a))
	return &a
}

// waitAgent waits until ok holds for the host's Agent.
func (e *env) waitAgent(h *stack.Host, what string, ok func(a *v1beta1.Agent) bool) *v1beta1.Agent {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		a := e.agent(h)
		if ok(a) {
			return a
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Agent %s: never %s; progress %+v, conditions %+v, state %q", h.ID, what, a.Status.Progress, a.Status.Conditions, a.Status.DebugInfo.State)
		}
	}
}

// heartbeat heartbeats once, no faster than the agent API lets one host
// (2 a second): pacing, as a real agent's poll is, not waiting for
// anything.
func (e *env) heartbeat(h *stack.Host) agentwire.Instructions {
	e.t.Helper()
	time.Sleep(500 * time.Millisecond)
	in, err := h.Heartbeat()
	require.NoError(e.t, err)
	return in
}

// installStep heartbeats until the host is given its install step.
func (e *env) installStep(h *stack.Host) agentwire.Step {
	e.t.Helper()
	var steps []agentwire.Step
	require.Eventually(e.t, func() bool {
		steps = e.heartbeat(h).Steps
		return len(steps) > 0
	}, wait, 100*time.Millisecond, "host %s never got its install step: %+v", h.ID, e.agent(h).Status)
	require.Len(e.t, steps, 1)
	return steps[0]
}

// bind scales a NodePool selecting pool "a" to one and waits until the
// provider bound h's Agent.
func (e *env) bind(h *stack.Host) (*capiagent.NodePool, *v1beta1.Agent) {
	e.t.Helper()
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(1)
	return np, e.waitAgent(h, "bound", func(a *v1beta1.Agent) bool { return a.Labels["agentMachineRef"] != "" })
}

func condition(a *v1beta1.Agent, t v1beta1.ConditionType) v1beta1.Condition {
	if c := conditions.Find(a.Status.Conditions, t); c != nil {
		return *c
	}
	return v1beta1.Condition{}
}

// stripped drops a condition's message and times.
func stripped(c v1beta1.Condition) v1beta1.Condition {
	return v1beta1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason}
}

// getAgents is `kubectl get agents`, logged.
func (e *env) getAgents(step string) string {
	out, err := e.Env.Kubectl(context.Background(), "", "-n", e.agentsNS, "get", "agents")
	require.NoError(e.t, err)
	e.t.Logf("kubectl get agents (%s):\n%s", step, out)
	return out
}

// install plays host h through its installation and its kubelet through
// joining the hosted cluster, until Done.
func (e *env) install(h *stack.Host, hostname string) {
	e.t.Helper()
	require.NoError(e.t, h.Progress("Starting installation", 0, "installing to /dev/vda"))
	require.NoError(e.t, h.Progress("Writing image to disk", 50, "100 of 200 MiB"))
	require.NoError(e.t, h.Progress("Rebooting", 100, ""))
	require.NoError(e.t, h.StepResult("install", agentwire.StepResult{Output: "installed to /dev/vda"}))
	kl := &hosted.Kubelet{T: e.t, C: e.hosted, Name: hostname}
	kl.CSR(hostname+"-client", hosted.ClientSigner, hosted.Bootstrapper, hostname, nil, nil, hosted.ClientUsages...)
	require.Eventually(e.t, func() bool { return kl.Approved(hostname + "-client") }, wait, 100*time.Millisecond)
	kl.Register()
	kl.Ready()
	e.waitAgent(h, "done", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == lifecycle.StateAddedToExistingCluster })
}

// Its stacks take turns on one control plane.
func TestMain(m *testing.M) { stack.Main(m) }

// TestCAPIAgentInstallsAndReleases: HyperShift scales a NodePool 0→2;
// cluster-api-provider-agent binds two Agents (not the one its selector
// leaves out); agentboot installs them with the day-2 pointer Ignition
// built from the AgentClusterInstall and the token Secret, follows them
// into the hosted cluster (CSRs, nodeLabels) until Done; the AgentMachines
// turn Ready by the provider's rule and the Nodes get providerID
// agent://<agent>. Scale 2→1: the provider unbinds the Agent and holds its
// pre-terminate hook until agentboot has the host back in the free pool
// (its BareMetalHost reboots it into discovery: unbinding, then
// known-unbound); 1→0 without a BareMetalHost releases the hook at
// unbinding-pending-user-action.
func TestCAPIAgentInstallsAndReleases(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	phase := func(p string) float64 {
		n, _ := stack.Metric(t, "agentboot_agent_phase_seconds", map[string]string{"phase": p})
		return n
	}
	doneBefore, releasedBefore := phase(poolmetrics.PhaseBoundToDone), phase(poolmetrics.PhaseReleasedToReady)
	erasesBefore, eraseSumBefore := stack.Metric(t, "agentboot_disk_erase_seconds_per_gib", map[string]string{"method": "write-zeroes"})
	sanitizedBefore, _ := stack.Metric(t, "agentboot_sanitizations_total", map[string]string{"outcome": "done"})
	h1 := e.readyHost(1, map[string]string{"pool": "a"})
	h2 := e.readyHost(2, map[string]string{"pool": "a"})
	h3 := e.readyHost(3, map[string]string{"pool": "b"})
	// An admin's choices on an Agent, which the provider's Updates keep.
	a1 := e.agent(h1)
	patch := client.MergeFrom(a1.DeepCopy())
	a1.Spec.NodeLabels = map[string]string{"node-role.kubernetes.io/infra": ""}
	a1.Spec.IgnitionConfigOverrides = `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hello"}}]}}`
	require.NoError(t, e.Client.Patch(ctx, a1, patch))
	e.getAgents("free")

	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(2)
	for _, h := range []*stack.Host{h1, h2} {
		a := e.waitAgent(h, "bound by cluster-api-provider-agent", func(a *v1beta1.Agent) bool {
			return a.Labels["agentMachineRef"] != "" && a.Spec.ClusterDeploymentName != nil
		})
		require.Equal(t, e.cluster.CP, a.Annotations["agentMachineRefNamespace"])
		require.Equal(t, v1beta1.ClusterReference{Namespace: e.cluster.CP, Name: "vcluster2"}, *a.Spec.ClusterDeploymentName)
		require.Equal(t, "ignition", a.Spec.MachineConfigPool)
		require.Equal(t, &v1beta1.IgnitionEndpointTokenReference{Namespace: e.cluster.CP, Name: "agent-" + np.UserData}, a.Spec.IgnitionEndpointTokenReference)
	}
	require.Nil(t, e.agent(h3).Spec.ClusterDeploymentName, "the selector leaves host 3 out")
	require.Equal(t, map[string]string{"node-role.kubernetes.io/infra": ""}, e.agent(h1).Spec.NodeLabels, "nodeLabels survive the provider's Update")

	// The install step carries the day-2 pointer Ignition.
	step := e.installStep(h1)
	require.Equal(t, agentwire.StepInstall, step.Kind)
	require.Equal(t, "/dev/vda", step.Install.DiskPath)
	cfg, rpt, err := v3_2.Parse([]byte(step.Install.Ignition))
	require.NoError(t, err, rpt.String())
	require.Len(t, cfg.Ignition.Config.Merge, 1)
	src := cfg.Ignition.Config.Merge[0]
	require.Equal(t, "https://ignition.vcluster2.example.com:443/ignition", *src.Source)
	headers := map[string]string{}
	for _, h := range src.HTTPHeaders {
		headers[h.Name] = *h.Value
	}
	require.Equal(t, map[string]string{"Authorization": "Bearer " + token, "NodePool": e.cluster.HC.Namespace + "/vcluster2", "TargetConfigVersionHash": "4f2a9c1e"}, headers)
	require.Len(t, cfg.Ignition.Security.TLS.CertificateAuthorities, 1)
	require.Contains(t, *cfg.Ignition.Security.TLS.CertificateAuthorities[0].Source, "data:text/plain")
	files := map[string]string{}
	for _, f := range cfg.Storage.Files {
		files[f.Path] = *f.Contents.Source
	}
	hostname, err := dataurl.DecodeString(files["/etc/hostname"])
	require.NoError(t, err)
	require.Equal(t, "host-1\n", string(hostname.Data), "the Node is named like the Agent's hostname")
	require.Equal(t, "data:,hello", files["/etc/motd"], "spec.ignitionConfigOverrides merged")
	validate(t, step.Install.Ignition)

	a := e.waitAgent(h1, "installing", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == lifecycle.StateInstalling })
	require.Equal(t, v1beta1.Condition{Type: v1beta1.RequirementsMetCondition, Status: "True", Reason: v1beta1.AgentAlreadyInstallingReason},
		stripped(condition(a, v1beta1.RequirementsMetCondition)))
	require.Equal(t, v1beta1.AgentRoleWorker, a.Status.Role)
	e.installStep(h2)
	e.getAgents("installing")

	e.install(h1, "host-1")
	e.install(h2, "host-2")
	out := e.getAgents("joined")
	require.Regexp(t, h1.ID+`\s+vcluster2\s+true\s+worker\s+Done`, out)
	require.Equal(t, doneBefore+2, phase(poolmetrics.PhaseBoundToDone), "bound_to_done: each host once")
	for _, h := range []*stack.Host{h1, h2} {
		a := e.agent(h)
		require.Equal(t, "True", string(condition(a, v1beta1.InstalledCondition).Status))
		require.Equal(t, v1beta1.AgentInstallationStoppedReason, condition(a, v1beta1.RequirementsMetCondition).Reason)
		require.Equal(t, "True", string(condition(a, v1beta1.ValidatedCondition).Status), "validations stay frozen after the reboot")
	}
	// The AgentMachines are Ready by the provider's rule, and the Nodes
	// carry providerID agent://<agent>.
	require.Eventually(t, func() bool {
		for _, m := range np.Machines() {
			am := np.AgentMachine(m.GetName())
			if ready, _, _ := unstructured.NestedBool(am.Object, "status", "ready"); !ready {
				return false
			}
		}
		return true
	}, wait, 200*time.Millisecond, "AgentMachines never Ready")
	for h, name := range map[*stack.Host]string{h1: "host-1", h2: "host-2"} {
		require.Eventually(t, func() bool {
			n, err := e.hosted.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && n.Spec.ProviderID == "agent://"+h.ID
		}, wait, 200*time.Millisecond, "Node %s never got its providerID", name)
	}
	n1, err := e.hosted.Admin.CoreV1().Nodes().Get(ctx, "host-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.Contains(t, n1.Labels, "node-role.kubernetes.io/infra", "spec.nodeLabels applied")

	// 2 → 1: the newest Machine goes. Its host has a BareMetalHost, which
	// reboots it into discovery: the hook holds until it is back.
	machines := np.Machines()
	gone := np.AgentMachine(machines[1].GetName())
	goneAgent, _, _ := unstructured.NestedString(gone.Object, "status", "agentRef", "name")
	hGone, hStays, nGone := h2, h1, 2
	if goneAgent == h1.ID {
		hGone, hStays, nGone = h1, h2, 1
	}
	ag := e.agent(hGone)
	patch = client.MergeFrom(ag.DeepCopy())
	ag.Labels[v1beta1.BMHLabel] = fmt.Sprintf("bmh-%d", nGone)
	require.NoError(t, e.Client.Patch(ctx, ag, patch))
	np.Scale(1)
	e.waitAgent(hGone, "unbinding", func(a *v1beta1.Agent) bool {
		return a.Spec.ClusterDeploymentName == nil && a.Status.DebugInfo.State == lifecycle.StateUnbinding &&
			condition(a, v1beta1.BoundCondition).Reason == v1beta1.UnbindingReason
	})
	e.getAgents("scaled to 1, unbinding")
	e.cluster.AgentMachinePasses.Settle(t, client.ObjectKeyFromObject(gone)) // it would release too early now
	require.NotNil(t, np.AgentMachine(machines[1].GetName()), "the pre-terminate hook holds while the host reboots into discovery")
	hGone.Reregister(t, e.ie, nGone)
	// Back in discovery it owes a sanitization of its disks: not bindable
	// (disks-sanitized fails), but the provider's hook is released.
	require.Equal(t, []agentwire.Step{{ID: "sanitize", Kind: agentwire.StepSanitize, Sanitize: &agentwire.SanitizeStep{Level: "erase", Disks: []string{"/dev/vda"}}}},
		e.firstSteps(hGone), "the step, once the service's cache has the host's inventory of this boot")
	e.waitAgent(hGone, "quarantined", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == lifecycle.StateInsufficientUnbound && !lifecycle.Bindable(a) &&
			strings.Contains(condition(a, v1beta1.ValidatedCondition).Message, "The host's disks must be sanitized (level erase) before it can be bound again")
	})
	require.Eventually(t, func() bool { return np.AgentMachine(machines[1].GetName()) == nil }, wait, 200*time.Millisecond,
		"the hook is released while the host sanitizes its disks")
	require.NoError(t, hGone.StepResult("sanitize", agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{{Disk: "/dev/vda", Method: "write-zeroes",
		Bytes: 200_000_000_000, DurationSeconds: 31, Verification: "sampled-reads-zero", Checked: "256 sampled 64 KiB blocks read back as zeros (read with O_DIRECT)"}}}))
	e.waitAgent(hGone, "back in the free pool", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == lifecycle.StateKnownUnbound && a.Status.Progress.CurrentStage == "" && lifecycle.Bindable(a)
	})
	requireAgentEvent(t, e, hGone, "DisksSanitized", "level erase: /dev/vda write-zeroes, 200000000000 bytes in 31s, checked")
	sanitized, _ := stack.Metric(t, "agentboot_sanitizations_total", map[string]string{"outcome": "done"})
	require.Equal(t, sanitizedBefore+1, sanitized)
	erases, eraseSum := stack.Metric(t, "agentboot_disk_erase_seconds_per_gib", map[string]string{"method": "write-zeroes"})
	require.Equal(t, erasesBefore+1, erases)
	require.InDelta(t, 31/(200e9/(1<<30)), eraseSum-eraseSumBefore, 1e-9, "31 s for 200 GB")
	require.Eventually(t, func() bool { return phase(poolmetrics.PhaseReleasedToReady) == releasedBefore+1 }, wait, 100*time.Millisecond,
		"released_to_ready: the released host, once it is free again")
	require.Eventually(t, func() bool { return np.AgentMachine(machines[1].GetName()) == nil && len(np.Machines()) == 1 }, wait, 200*time.Millisecond,
		"the hook is released once the host is free")
	require.Eventually(t, func() bool {
		_, err := e.hosted.Admin.CoreV1().Nodes().Get(ctx, fmt.Sprintf("host-%d", nGone), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, wait, 200*time.Millisecond, "Cluster API deletes the Node")
	require.Equal(t, lifecycle.StateAddedToExistingCluster, e.agent(hStays).Status.DebugInfo.State)
	e.getAgents("scaled to 1")

	// 1 → 0 without a BareMetalHost: the hook is released at
	// unbinding-pending-user-action, which says what to do.
	np.Scale(0)
	a = e.waitAgent(hStays, "pending user action", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == lifecycle.StateUnbindingPendingUserAct
	})
	require.Contains(t, condition(a, v1beta1.BoundCondition).Message, "reboot the host into the discovery image")
	require.Eventually(t, func() bool { return len(np.Machines()) == 0 }, wait, 200*time.Millisecond)
	e.getAgents("scaled to 0")
}

// firstSteps heartbeats as the agent does until it is given steps.
func (e *env) firstSteps(h *stack.Host) []agentwire.Step {
	e.t.Helper()
	var steps []agentwire.Step
	require.Eventually(e.t, func() bool {
		in, err := h.Heartbeat()
		require.NoError(e.t, err)
		steps = in.Steps
		return len(steps) > 0
	}, wait, 200*time.Millisecond, "the host was never given a step")
	return steps
}

// validate runs Ignition's own validator on a config.
func validate(t *testing.T, cfg string) {
	t.Helper()
	tool, err := testenv.Tool("ignition-validate")
	require.NoError(t, err)
	cmd := exec.Command(tool, "-")
	cmd.Stdin = strings.NewReader(cfg)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "ignition-validate: %s", out)
}

// requireEvent waits for an event on the NodePool whose note contains
// note.
func requireEvent(t *testing.T, e *env, np, note string) {
	t.Helper()
	requireEventOn(t, e, e.cluster.HC.Namespace, "NodePool", np, "", note)
}

// requireEventOn waits for an event on object kind ns/name with reason
// (any, if empty) whose note contains note.
func requireEventOn(t *testing.T, e *env, ns, kind, name, reason, note string) {
	t.Helper()
	var seen []string
	ok := assert.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, e.Client.List(context.Background(), &list, client.InNamespace(ns)))
		seen = seen[:0]
		for _, ev := range list.Items {
			if ev.Regarding.Kind == kind && ev.Regarding.Name == name {
				seen = append(seen, ev.Reason+": "+ev.Note)
				if (reason == "" || ev.Reason == reason) && strings.Contains(ev.Note, note) {
					return true
				}
			}
		}
		return false
	}, wait, 200*time.Millisecond)
	if !ok {
		t.Fatalf("no %s event on %s %s with %q; seen: %q", reason, kind, name, note, seen)
	}
}

// tenant is a user who may edit Agents (and their status) in namespace ns
// and nothing else, as a team sharing the management cluster would be.
func (e *env) tenant(ns, user string) client.Client {
	e.t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"agent-install.openshift.io"}, Resources: []string{"agents", "agents/status"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
	}}
	require.NoError(e.t, e.Client.Create(ctx, role))
	require.NoError(e.t, e.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: user}}}))
	cfg := rest.CopyConfig(e.Env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: e.Client.Scheme()})
	require.NoError(e.t, err)
	return c
}

// requireAgentEvent waits for an event on the host's Agent with reason
// whose note contains note.
func requireAgentEvent(t *testing.T, e *env, h *stack.Host, reason, note string) {
	t.Helper()
	requireEventOn(t, e, h.NS, "Agent", h.ID, reason, note)
}

// TestTenantCannotReachAnotherCluster: a team that may edit Agents (and
// their status) in its own namespace points its host at another team's
// hosted cluster, copying the labels, annotation and spec
// cluster-api-provider-agent writes. agentboot hands it no pointer
// Ignition, no token, and approves no CSR for it: the binding does not
// hold in the control-plane namespace, which only HyperShift and the
// provider write. The other team's own host installs as usual.
func TestTenantCannotReachAnotherCluster(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	victim := e.readyHost(1, map[string]string{"pool": "a"})
	_, bound := e.bind(victim)
	step := e.installStep(victim)
	require.Contains(t, step.Install.Ignition, "Bearer "+token)

	// Team B's own InfraEnv, host and rights.
	ieB := e.CreateInfraEnv(t, "team-b", "pool", nil)
	mallory := e.Register(t, ieB, 7)
	tenant := e.tenant(ieB.Namespace, "team-b")
	forge := func(change func(a *v1beta1.Agent)) {
		t.Helper()
		require.Eventually(t, func() bool {
			var a v1beta1.Agent
			require.NoError(t, tenant.Get(ctx, client.ObjectKey{Namespace: mallory.NS, Name: mallory.ID}, &a))
			if a.Annotations == nil {
				a.Annotations = map[string]string{}
			}
			change(&a)
			return tenant.Update(ctx, &a) == nil
		}, wait, 100*time.Millisecond)
	}
	forge(func(a *v1beta1.Agent) {
		a.Spec.Approved = true
		a.Labels["agentMachineRef"] = bound.Labels["agentMachineRef"]
		a.Annotations["agentMachineRefNamespace"] = e.cluster.CP
		a.Spec.ClusterDeploymentName = bound.Spec.ClusterDeploymentName
		a.Spec.MachineConfigPool = bound.Spec.MachineConfigPool
		a.Spec.IgnitionEndpointTokenReference = bound.Spec.IgnitionEndpointTokenReference
		a.Spec.IgnitionEndpointHTTPHeaders = bound.Spec.IgnitionEndpointHTTPHeaders
	})
	e.waitAgent(mallory, "refused", func(a *v1beta1.Agent) bool {
		in := e.heartbeat(mallory)
		require.Empty(t, in.Steps, "no step, no token for a forged binding")
		return strings.Contains(a.Status.Progress.ProgressInfo, "no AgentMachine in namespace "+e.cluster.CP+" references this Agent")
	})
	requireAgentEvent(t, e, mallory, "BindingRefused", "no AgentMachine in namespace "+e.cluster.CP)

	// The spec pointing one way and the annotation another is refused too.
	forge(func(a *v1beta1.Agent) { a.Annotations["agentMachineRefNamespace"] = ieB.Namespace })
	e.waitAgent(mallory, "refused: namespaces differ", func(a *v1beta1.Agent) bool {
		in := e.heartbeat(mallory)
		require.Empty(t, in.Steps)
		return strings.Contains(a.Status.Progress.ProgressInfo, `spec.clusterDeploymentName is in namespace "`+e.cluster.CP+`", but the Agent's AgentMachine is in "`+ieB.Namespace+`"`)
	})

	// With status rights the tenant claims its host rebooted into an
	// installed system; its kubelet asks the victim's cluster for a
	// certificate. Nothing is approved.
	forge(func(a *v1beta1.Agent) { a.Annotations["agentMachineRefNamespace"] = e.cluster.CP })
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		require.NoError(t, tenant.Get(ctx, client.ObjectKey{Namespace: mallory.NS, Name: mallory.ID}, &a))
		a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: v1beta1.StageRebooting, InstallationPercentage: 100,
			StageStartTime: &metav1.Time{Time: time.Now()}, StageUpdateTime: &metav1.Time{Time: time.Now()}}
		return tenant.Status().Update(ctx, &a) == nil
	}, wait, 100*time.Millisecond)
	kl := &hosted.Kubelet{T: t, C: e.hosted, Name: "host-7"}
	kl.CSR("mallory", hosted.ClientSigner, hosted.Bootstrapper, "host-7", nil, nil, hosted.ClientUsages...)
	requireAgentEvent(t, e, mallory, "BindingRefused", "no AgentMachine in namespace "+e.cluster.CP)
	e.workerPasses.Settle(t, client.ObjectKey{Namespace: mallory.NS, Name: mallory.ID})
	require.False(t, kl.Approved("mallory"), "a CSR for a host whose binding does not hold is never approved")

	// The victim's own host is untouched by all this.
	e.install(victim, "host-1")
}

// TestCAPIAgentFaults: what the binding is built from breaks while
// cluster-api-provider-agent is down; each problem is named on the Agent
// and nothing is handed out until it is fixed. A token rotated before the
// step is handed out is the one the host gets; the provider restarting
// mid-install changes nothing.
func TestCAPIAgentFaults(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	h := e.readyHost(1, map[string]string{"pool": "a"})
	np, a := e.bind(h)
	// The provider records the binding on the AgentMachine after labelling
	// the Agent; stopped before that, it would leave the Agent waiting for
	// its AgentMachine instead of blocked by what follows.
	require.Eventually(t, func() bool {
		am := np.AgentMachine(a.Labels["agentMachineRef"])
		if am == nil {
			return false
		}
		name, _, _ := unstructured.NestedString(am.Object, "status", "agentRef", "name")
		return name == a.Name
	}, time.Minute, 100*time.Millisecond, "the provider never recorded the binding on AgentMachine %s", a.Labels["agentMachineRef"])
	e.cluster.StopProvider() // it would repair some of what follows

	blocked := func(what string) {
		t.Helper()
		// The binding is checked when the step is handed out; the token
		// and CA Secrets when the manager prepares the handover (every
		// HandoverRefresh): once it has, nothing is handed out.
		handoverKey := client.ObjectKey{Namespace: stack.Namespace, Name: handover.Name(a)}
		require.Eventually(t, func() bool {
			var cm corev1.ConfigMap
			return e.Client.Get(ctx, handoverKey, &cm) == nil && strings.Contains(cm.Data["waiting"], what)
		}, wait, 50*time.Millisecond, "the manager never saw: %s", what)
		e.waitAgent(h, "blocked: "+what, func(a *v1beta1.Agent) bool {
			require.Empty(t, e.heartbeat(h).Steps, "nothing is handed out while %s", what)
			c := condition(a, v1beta1.InstalledCondition)
			return strings.Contains(a.Status.Progress.ProgressInfo, what) && c.Reason == v1beta1.InstallationNotStartedReason && strings.Contains(c.Message, what)
		})
	}
	// Merge patches: agentboot's Go type of the AgentClusterInstall has
	// only the fields it reads.
	aci := &hiveext.AgentClusterInstall{}
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: e.cluster.CP, Name: "vcluster2"}, aci))
	endpoint, err := json.Marshal(map[string]any{"spec": map[string]any{"ignitionEndpoint": aci.Spec.IgnitionEndpoint}})
	require.NoError(t, err)
	require.NoError(t, e.Client.Patch(ctx, aci, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionEndpoint":null}}`))))
	blocked("AgentClusterInstall " + e.cluster.CP + "/vcluster2 has no spec.ignitionEndpoint.url")
	requireAgentEvent(t, e, h, "BindingRefused", "has no spec.ignitionEndpoint.url")
	// Plain http would carry the join token in the clear; a CA from
	// another namespace could vouch for another server.
	require.NoError(t, e.Client.Patch(ctx, aci, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionEndpoint":{"url":"http://ignition.vcluster2.example.com/ignition"}}}`))))
	blocked(`spec.ignitionEndpoint.url "http://ignition.vcluster2.example.com/ignition" is not an https URL`)
	require.NoError(t, e.Client.Patch(ctx, aci, client.RawPatch(types.MergePatchType, endpoint)))
	require.NoError(t, e.Client.Patch(ctx, aci, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionEndpoint":{"caCertificateReference":{"namespace":"`+e.agentsNS+`","name":"ignition-server-ca-cert"}}}}`))))
	blocked(`the ignition endpoint's CA Secret is in namespace "` + e.agentsNS + `"; it must be in the control-plane namespace "` + e.cluster.CP + `"`)
	require.NoError(t, e.Client.Patch(ctx, aci, client.RawPatch(types.MergePatchType, endpoint)))

	// A HostedControlPlane that is not a HostedCluster's (made by whoever
	// may create one in some namespace) binds nothing.
	hcp := &unstructured.Unstructured{}
	hcp.SetGroupVersionKind(capiagent.HostedControlPlaneGVK)
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: e.cluster.CP, Name: "vcluster2"}, hcp))
	owner := hcp.GetAnnotations()[binding.HostedClusterAnnotation]
	annotate := func(v string) {
		t.Helper()
		require.NoError(t, e.Client.Patch(ctx, hcp, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+binding.HostedClusterAnnotation+`":`+v+`}}}`))))
	}
	annotate(`null`)
	blocked("HostedControlPlane " + e.cluster.CP + "/vcluster2 names no HostedCluster")
	annotate(`"` + e.agentsNS + `/vcluster2"`)
	blocked("whose control plane namespace is " + e.agentsNS + "-vcluster2, not " + e.cluster.CP)
	annotate(`"` + owner + `"`)
	hc := e.cluster.HC.DeepCopy()
	require.NoError(t, e.Client.Patch(ctx, hc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"platform":{"agent":{"agentNamespace":"elsewhere"}}}}`))))
	blocked("HostedCluster " + owner + ` does not take its Agents from namespace "` + e.agentsNS + `"`)
	require.NoError(t, e.Client.Patch(ctx, hc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"platform":{"agent":{"agentNamespace":"`+e.agentsNS+`"}}}}`))))

	// Whoever may edit the Agent may not point the host's fetch of its
	// cluster's config (and join token) through a proxy or CA of theirs.
	for _, key := range []string{"proxy", "security", "config"} {
		override := `{"ignition":{"version":"3.2.0","` + key + `":{}}}`
		require.NoError(t, e.Client.Patch(ctx, e.agent(h), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionConfigOverrides":`+strconv.Quote(override)+`}}`))))
		blocked("spec.ignitionConfigOverrides sets ignition." + key)
	}
	require.NoError(t, e.Client.Patch(ctx, e.agent(h), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionConfigOverrides":null}}`))))
	// Nor make agentboot read a token Secret of another namespace.
	ref := *e.agent(h).Spec.IgnitionEndpointTokenReference
	require.NoError(t, e.Client.Patch(ctx, e.agent(h), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionEndpointTokenReference":{"namespace":"`+e.agentsNS+`"}}}`))))
	blocked(`spec.ignitionEndpointTokenReference names namespace "` + e.agentsNS + `"`)
	require.NoError(t, e.Client.Patch(ctx, e.agent(h), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ignitionEndpointTokenReference":{"namespace":"`+ref.Namespace+`"}}}`))))

	tokenKey := client.ObjectKey{Namespace: a.Spec.IgnitionEndpointTokenReference.Namespace, Name: a.Spec.IgnitionEndpointTokenReference.Name}
	var tokenSecret corev1.Secret
	require.NoError(t, e.Client.Get(ctx, tokenKey, &tokenSecret))
	tokenSecret.Data = map[string][]byte{"wrong-key": []byte("x")}
	require.NoError(t, e.Client.Update(ctx, &tokenSecret))
	blocked(`token Secret ` + tokenKey.String() + ` has no usable key "ignition-token"`)
	require.NoError(t, e.Client.Delete(ctx, &tokenSecret))
	blocked(`token Secret ` + tokenKey.String() + ` does not exist`)

	var caSecret corev1.Secret
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: e.cluster.CP, Name: "ignition-server-ca-cert"}, &caSecret))
	good := caSecret.Data["tls.crt"]
	caSecret.Data["tls.crt"] = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
	require.NoError(t, e.Client.Update(ctx, &caSecret))
	// HyperShift rotated the NodePool's token meanwhile: the token Secret
	// the provider writes comes back with the new one.
	rotated := "cm90YXRlZC10b2tlbg"
	require.NoError(t, e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tokenKey.Namespace, Name: tokenKey.Name},
		Data: map[string][]byte{"ignition-token": []byte(rotated)}}))
	blocked(`key "tls.crt" is not a PEM certificate bundle`)
	caSecret.Data["tls.crt"] = good
	require.NoError(t, e.Client.Update(ctx, &caSecret))

	step := e.installStep(h)
	require.Contains(t, step.Install.Ignition, `"Bearer `+rotated+`"`, "the token as it is when the step is handed out")
	require.NotContains(t, step.Install.Ignition, token)

	// The provider comes back mid-install, goes away and comes back again:
	// the binding stays, the installation goes on to Done.
	e.cluster.StartProvider()
	e.waitAgent(h, "installing", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == lifecycle.StateInstalling })
	e.cluster.StopProvider()
	e.cluster.StartProvider()
	before := len(e.cluster.AgentUpdates())
	e.install(h, "host-1")
	a = e.agent(h)
	require.NotNil(t, a.Spec.ClusterDeploymentName)
	require.Equal(t, before, len(e.cluster.AgentUpdates()), "a restarted provider rewrites nothing on a bound Agent")
	require.Eventually(t, func() bool {
		am := np.AgentMachine(np.Machines()[0].GetName())
		ready, _, _ := unstructured.NestedBool(am.Object, "status", "ready")
		return ready
	}, wait, 200*time.Millisecond)
}

// The agent API reads no Secret: the manager hands each bound host's
// installation over, sealed, in agentboot's namespace, and makes it again
// when what it was made of changes — a join token HyperShift rotated in
// place reaches the host without anything else happening. What is handed
// over is no secret to whoever reads ConfigMaps there, and is withdrawn
// once the host started installing. (That it opens for that Agent only:
// internal/handover.)
func TestInstallationHandedOverSealed(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	h := e.readyHost(1, map[string]string{"pool": "a"})
	_, a := e.bind(h)
	key := client.ObjectKey{Namespace: stack.Namespace, Name: handover.Name(a)}
	sealed := func(what string, ok func(cm *corev1.ConfigMap) bool) *corev1.ConfigMap {
		t.Helper()
		var cm corev1.ConfigMap
		require.Eventually(t, func() bool {
			return e.Client.Get(ctx, key, &cm) == nil && cm.Data["sealed"] != "" && ok(&cm)
		}, wait, 100*time.Millisecond, "the handover %s is never %s: %v; Agent %s: bound to %v, labels %v, progress %+v", key.Name, what, cm.Data, handover.Name(e.agent(h)),
			e.agent(h).Spec.ClusterDeploymentName, e.agent(h).Labels, e.agent(h).Status.Progress)
		return &cm
	}
	first := sealed("sealed", func(*corev1.ConfigMap) bool { return true })
	for k, v := range first.Data {
		require.NotContains(t, v, token, "handover key %s shows the join token", k)
		if raw, err := base64.StdEncoding.DecodeString(v); err == nil {
			require.NotContains(t, string(raw), token, "handover key %s holds the join token, base64-encoded", k)
		}
	}

	// HyperShift rotates the token; the provider's Secret keeps its name.
	tokenKey := client.ObjectKey{Namespace: a.Spec.IgnitionEndpointTokenReference.Namespace, Name: a.Spec.IgnitionEndpointTokenReference.Name}
	var tokenSecret corev1.Secret
	require.NoError(t, e.Client.Get(ctx, tokenKey, &tokenSecret))
	rotated := "cm90YXRlZC1pbi1wbGFjZQ"
	tokenSecret.Data["ignition-token"] = []byte(rotated)
	require.NoError(t, e.Client.Update(ctx, &tokenSecret))
	sealed("made again", func(cm *corev1.ConfigMap) bool { return cm.Data["digest"] != first.Data["digest"] })

	step := e.installStep(h)
	require.Contains(t, step.Install.Ignition, `"Bearer `+rotated+`"`)
	require.NotContains(t, step.Install.Ignition, token)
	require.Eventually(t, func() bool { return apierrors.IsNotFound(e.Client.Get(ctx, key, &corev1.ConfigMap{})) },
		wait, 100*time.Millisecond, "the handover stays after the host started installing")
}

// A manager that installs nothing (--nodepools=false) withdraws what an
// earlier run handed over, with only its deployed rights: the agent API
// then installs nothing from it.
func TestNodePoolsOffWithdrawsHandovers(t *testing.T) {
	left := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stack.Namespace, Name: "install-left-over", Labels: map[string]string{handover.Label: "true"}},
		Data: map[string]string{"agent": "agents/00000000-0000-4000-8000-000000000001", "sealed": "AAAA"}}
	var admin client.Client
	stack.Start(t, stack.Options{NodePool: nodepool.Config{Off: true}, Identities: func(env *testenv.Env) (stack.Identities, error) {
		ids, err := stack.Deployed(env)
		if err == nil {
			admin = env.Client
			err = env.Client.Create(context.Background(), left)
		}
		return ids, err
	}})
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(admin.Get(context.Background(), client.ObjectKeyFromObject(left), &corev1.ConfigMap{}))
	}, wait, 100*time.Millisecond, "a handover of an earlier run stays under --nodepools=false")
}

// TestShortfallExplained: machines waiting for Agents are explained on
// the NodePool, with how the Agents its selector matches stand.
func TestShortfallExplained(t *testing.T) {
	e := start(t, true)
	e.readyHost(1, map[string]string{"pool": "a"})
	unapproved := e.Register(t, e.ie, 2)
	var a v1beta1.Agent
	require.NoError(t, e.Client.Get(context.Background(), client.ObjectKey{Namespace: unapproved.NS, Name: unapproved.ID}, &a))
	patch := client.MergeFrom(a.DeepCopy())
	a.Labels["pool"] = "a"
	require.NoError(t, e.Client.Patch(context.Background(), &a, patch))
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(3)
	requireEvent(t, e, np.NP.Name, `2 more Agent(s) wanted: 2 Agent(s) in namespace `+e.agentsNS+` match the selector "pool=a", 1 already bound, 1 not approved`)
}

// TestReleasedWhileInstalling: Cluster API deletes a Machine whose host is
// still writing its disk in discovery. The provider unbinds the Agent; the
// host's reports are refused from then on, and its step result is
// answered Released: the installation is void (the agent wipes what it
// wrote and does not reboot into it), the Agent is free again, and the
// provider's hook lets the Machine go.
func TestReleasedWhileInstalling(t *testing.T) {
	e := start(t, true)
	h := e.readyHost(1, map[string]string{"pool": "a"})
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(1)
	e.installStep(h)
	require.NoError(t, h.Progress("Writing image to disk", 40, ""))
	np.Scale(0)
	e.waitAgent(h, "released while writing", func(a *v1beta1.Agent) bool {
		return a.Spec.ClusterDeploymentName == nil && a.Status.DebugInfo.State == lifecycle.StateUnbindingPendingUserAct
	})
	require.ErrorContains(t, h.Progress("Rebooting", 100, ""), "released from its cluster")
	err := h.StepResult("install", agentwire.StepResult{Output: "installed to /dev/vda"})
	require.ErrorContains(t, err, "409")
	require.ErrorContains(t, err, agentwire.CodeReleased)
	// What it wrote before it was told (the pointer config with the
	// tenant's token) makes it owe a sanitization before it is free.
	e.waitAgent(h, "back in discovery, owing a sanitization", func(a *v1beta1.Agent) bool {
		return a.Status.Progress.CurrentStage == "" && a.Status.InstallationDiskID == "" && lifecycle.SanitizationOwed(a) && !lifecycle.Bindable(a)
	})
	require.Eventually(t, func() bool { return len(np.Machines()) == 0 }, wait, 200*time.Millisecond, "the hook is released")
	requireAgentEvent(t, e, h, "BackInDiscovery", "released from its cluster while it installed")
	steps := e.firstSteps(h) // in the same boot: it is still in discovery
	require.Len(t, steps, 1)
	require.Equal(t, agentwire.StepSanitize, steps[0].Kind)
	require.NoError(t, h.StepResult("sanitize", agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{{Disk: "/dev/vda", Method: "overwrite",
		Bytes: 200_000_000_000, DurationSeconds: 900, Verification: "sampled-reads-zero", Checked: "read back as zeros"}}}))
	e.waitAgent(h, "free again", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == lifecycle.StateKnownUnbound && lifecycle.Bindable(a)
	})
	// A second report, or one for a step never given, is refused for good
	// (400: the agent does not send it again), not "try again" (503).
	err = h.StepResult("sanitize", agentwire.StepResult{})
	require.ErrorContains(t, err, ": 400 ")
	require.ErrorContains(t, err, "no sanitize step is running for this host")
	err = h.StepResult("format-everything", agentwire.StepResult{})
	require.ErrorContains(t, err, ": 400 ")
	require.ErrorContains(t, err, `no step \"format-everything\" was given to this host`)
}

// TestManagerHandoverMidInstall: the agentboot manager that handed out a
// host's installation goes away and a new one takes over while the host
// writes its disk and cluster-api-provider-agent keeps reconciling. The
// new one knows only what the apiserver holds: it hands out no second
// installation, takes the host's reports, follows it into the hosted
// cluster and to Done, and the AgentMachine turns Ready.
func TestManagerHandoverMidInstall(t *testing.T) {
	e := start(t, true)
	h := e.readyHost(1, map[string]string{"pool": "a"})
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(1)
	e.installStep(h)
	require.NoError(t, h.Progress("Starting installation", 0, "installing to /dev/vda"))
	require.NoError(t, h.Progress("Writing image to disk", 30, ""))
	e.ReplaceManager(t)
	require.Eventually(t, func() bool {
		in, err := h.Heartbeat()
		if err != nil {
			return false // the new agent API is not listening yet
		}
		require.Empty(t, in.Steps, "the installation is handed out once, whoever answers")
		return true
	}, wait, 500*time.Millisecond)
	require.NoError(t, h.Progress("Writing image to disk", 60, ""))
	require.NoError(t, h.Progress("Rebooting", 100, ""))
	require.NoError(t, h.StepResult("install", agentwire.StepResult{Output: "installed to /dev/vda"}))
	kl := &hosted.Kubelet{T: t, C: e.hosted, Name: "host-1"}
	kl.CSR("client", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	require.Eventually(t, func() bool { return kl.Approved("client") }, wait, 100*time.Millisecond)
	kl.Register()
	kl.Ready()
	e.waitAgent(h, "done", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == lifecycle.StateAddedToExistingCluster })
	require.Eventually(t, func() bool {
		ready, _, _ := unstructured.NestedBool(np.AgentMachine(np.Machines()[0].GetName()).Object, "status", "ready")
		return ready
	}, wait, 200*time.Millisecond)
}

// TestKubeletCSRsStrict: only the client CSR the node bootstrapper makes
// for this installation is approved, once; a CSR planted before the
// machine existed, one from a bootstrap token, and a second client CSR are
// left pending with an event saying why; when undecided CSRs flood the
// hosted cluster nothing more is approved there.
func TestKubeletCSRsStrict(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	h := e.readyHost(1, map[string]string{"pool": "a"})
	kl := &hosted.Kubelet{T: t, C: e.hosted, Name: "host-1"}
	kl.CSR("planted", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	// The hosted cluster's clock and the management cluster's may differ:
	// a CSR may predate its machine by csrClockSkew. This one is older
	// (timestamps have whole seconds).
	time.Sleep(csrClockSkew + time.Second)
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(1)
	e.installStep(h)
	require.NoError(t, h.Progress("Rebooting", 100, ""))
	requireAgentEvent(t, e, h, "CSRNotApproved", "CSR planted names this host but is not approved: it was created at")
	kl.CSR("token", hosted.ClientSigner, "system:bootstrap:abcdef", "host-1", nil, nil, hosted.ClientUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", `CSR token names this host but is not approved: requested by "system:bootstrap:abcdef"`)
	// Two CSRs that would each pass: which one is the kubelet's cannot be
	// told, so neither is approved until a person clears the other. The
	// ones refused for their own reasons (planted, token) block nothing.
	kl.CSR("client", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	kl.CSR("client-twin", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", "CSR client names this host but is not approved: 2 pending client CSRs name Node host-1 (client, client-twin)")
	require.False(t, kl.Approved("client"))
	require.False(t, kl.Approved("client-twin"))
	require.Equal(t, v1beta1.StageRebooting, e.agent(h).Status.Progress.CurrentStage, "a refused CSR does not move the host on")
	require.NoError(t, e.hosted.Admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, "client-twin", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return kl.Approved("client") }, wait, 100*time.Millisecond)
	kl.CSR("client-again", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", "client CSR client was already approved for this Node")
	for _, name := range []string{"planted", "token", "client-again"} {
		require.False(t, kl.Approved(name), "CSR %s", name)
	}

	// A flood of undecided CSRs (other hosts' names) stops approval there.
	other := &hosted.Kubelet{T: t, C: e.hosted}
	for i := range worker.MaxPendingCSRs + 1 {
		other.CSR(fmt.Sprintf("flood-%d", i), hosted.ClientSigner, hosted.Bootstrapper, fmt.Sprintf("other-%d", i), nil, nil, hosted.ClientUsages...)
	}
	kl.Register()
	kl.CSR("serving", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, nil, hosted.ServingUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", "undecided CSRs, more than 100")
	require.False(t, kl.Approved("serving"))
	require.NoError(t, e.hosted.Admin.CertificatesV1().CertificateSigningRequests().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	kl.CSR("serving-2", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, nil, hosted.ServingUsages...)
	require.Eventually(t, func() bool { return kl.Approved("serving-2") }, wait, 100*time.Millisecond, "approved again once the flood is cleared")
	// An address the host reported (198.18.0.10) but was never seen
	// connecting from (it talks to the agent API from 127.0.0.1) could be
	// anyone's, a VIP's: not approved.
	kl.CSR("serving-vip", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, []net.IP{net.ParseIP("198.18.0.10")}, hosted.ServingUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", "IP address 198.18.0.10 is one the host reported but was never seen using (it connected from 127.0.0.1)")
	require.False(t, kl.Approved("serving-vip"))

	// Renaming the bound Agent (spec.hostname, which whoever edits Agents
	// may write) does not change the Node it joins as: the worker still
	// looks at host-1's CSRs, and a CSR of the new name is not its. Both
	// pending CSRs are looked at in one pass, so the second is decided by
	// the time the first is approved.
	a := e.agent(h)
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.Hostname = "host-x"
	require.NoError(t, e.Client.Patch(ctx, a, patch))
	require.Equal(t, "host-1", lifecycle.Registration(e.agent(h)).NodeName)
	renamed := &hosted.Kubelet{T: t, C: e.hosted, Name: "host-x"}
	renamed.CSR("renamed", hosted.ServingSigner, "system:node:host-x", "host-x", []string{"host-x"}, nil, hosted.ServingUsages...)
	kl.CSR("serving-3", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, nil, hosted.ServingUsages...)
	require.Eventually(t, func() bool { return kl.Approved("serving-3") }, wait, 100*time.Millisecond, "host-1's CSRs are still this host's")
	require.False(t, renamed.Approved("renamed"), "a CSR of the name an editor gave the bound Agent")
}

// TestKubeletCSRApprovalOff: --approve-kubelet-csrs=false leaves the
// kubelet's CSRs to a person, and says so.
func TestKubeletCSRApprovalOff(t *testing.T) {
	s := stack.Start(t, stack.Options{NodePool: nodepool.Config{RetryAfter: time.Second, Poll: 300 * time.Millisecond, HandoverRefresh: 500 * time.Millisecond, NoCSRApproval: true}})
	e := startOn(t, s, true)
	h := e.readyHost(1, map[string]string{"pool": "a"})
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "a"})
	np.Scale(1)
	e.installStep(h)
	require.NoError(t, h.Progress("Rebooting", 100, ""))
	kl := &hosted.Kubelet{T: t, C: e.hosted, Name: "host-1"}
	kl.CSR("client", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	requireAgentEvent(t, e, h, "CSRNotApproved", "automatic approval is off")
	e.waitAgent(h, "configuring", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageConfiguring })
	require.False(t, kl.Approved("client"))
}

// TestEraseDebtFollowsTheHardware: a host installed into a cluster owes an
// erase by its hardware, not by its Agent. Released, it comes back as
// hosts do — one NIC more (its identity no longer matches, so a new Agent
// under its derived ID), through another namespace's InfraEnv, with every
// NIC replaced but its disk — and each time the Agent it comes back as owes
// the erase before it is bindable, with the reason shown. The erase done,
// the debt is settled: the same machine is free at its next registration,
// and an unrelated host never owed anything.
func TestEraseDebtFollowsTheHardware(t *testing.T) {
	e := start(t, true)
	ctx := context.Background()
	h := e.readyHost(1, map[string]string{"pool": "debt"})
	inv := stack.FakeInventory("host-1", stack.MAC(1))
	inv.SystemVendor.SerialNumber = "SN-DEBT-1"
	inv.Disks[0].Serial = "DISK-DEBT-1"
	require.NoError(t, h.PutInventory(inv))
	np := e.cluster.NodePool("vcluster2", map[string]string{"pool": "debt"})
	np.Scale(1)
	e.installStep(h)
	e.install(h, "host-1")
	np.Scale(0)
	e.waitAgent(h, "released", func(a *v1beta1.Agent) bool { return a.Spec.ClusterDeploymentName == nil })

	ieOther := e.CreateInfraEnv(t, "elsewhere", "pool", nil)
	var byMAC *stack.Host
	owesByHardware := func(t *testing.T, back *stack.Host, matched string) {
		t.Helper()
		a := e.waitAgent(back, "owing the erase by its hardware", func(a *v1beta1.Agent) bool { return lifecycle.SanitizationOwed(a) })
		require.False(t, lifecycle.Bindable(a))
		require.Contains(t, a.Status.DiskSanitization.Reason, "this machine (matched by "+matched+") was installed into a cluster as Agent "+h.NS+"/"+h.ID)
		requireEventOn(t, e, back.NS, "Agent", back.ID, "SanitizationOwedByHardware", "matched by "+matched)
		steps := e.firstSteps(back)
		require.Len(t, steps, 1)
		require.Equal(t, agentwire.StepSanitize, steps[0].Kind, "the erase comes first")
	}
	t.Run("one NIC more: a new Agent under its derived ID", func(t *testing.T) {
		// Only the MACs say who it is here: no serial, a disk without one.
		nics := *inv
		nics.SystemVendor.SerialNumber = ""
		nics.Disks = []agentwire.Disk{inv.Disks[0]}
		nics.Disks[0].Serial = ""
		nics.Interfaces = append(append([]agentwire.Interface(nil), inv.Interfaces...), agentwire.Interface{Name: "eth1", MacAddress: stack.MAC(101), IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{"up"}, Mtu: 1500})
		back, err := e.TryRegisterAs(t, e.ie, "8d0c6a51-7e4f-8b3a-9c2d-000000000101",
			agentwire.HostIdentity{MACAddresses: []string{stack.MAC(1), stack.MAC(101)}}, &nics)
		require.NoError(t, err)
		require.NotEqual(t, h.ID, back.ID)
		owesByHardware(t, back, "a MAC address")
		byMAC = back
	})
	t.Run("through another namespace's InfraEnv", func(t *testing.T) {
		back, err := e.TryRegisterAs(t, ieOther, stack.HostID(1), agentwire.HostIdentity{MACAddresses: []string{stack.MAC(1)}}, inv)
		require.NoError(t, err)
		require.Equal(t, ieOther.Namespace, back.NS)
		require.NotEqual(t, h.NS, back.NS)
		owesByHardware(t, back, "its SMBIOS UUID")
	})
	newNICs := *inv
	newNICs.Interfaces = []agentwire.Interface{{Name: "eth0", MacAddress: stack.MAC(102), IPV4Addresses: []string{"198.18.0.11/24"}, IPV6Addresses: []string{}, Flags: []string{"up"}, HasCarrier: true, Mtu: 1500}}
	newNICs.SystemVendor.SerialNumber = "SN-NEW-BOARD"
	var clean *stack.Host
	t.Run("every NIC and the board replaced, the disk kept", func(t *testing.T) {
		back, err := e.TryRegisterAs(t, ieOther, "8d0c6a51-7e4f-8b3a-9c2d-000000000102", agentwire.HostIdentity{MACAddresses: []string{stack.MAC(102)}}, &newNICs)
		require.NoError(t, err)
		owesByHardware(t, back, "a disk's serial number or WWN")
		clean = back
	})

	erased := agentwire.StepResult{Sanitization: []agentwire.DiskSanitization{{Disk: "/dev/vda", Method: "overwrite",
		Bytes: 200_000_000_000, DurationSeconds: 900, Verification: "sampled-reads-zero", Checked: "read back as zeros"}}}
	debts := func() int {
		var list corev1.ConfigMapList
		require.NoError(t, e.Client.List(ctx, &list, client.InNamespace(stack.Namespace), client.HasLabels{"agentboot.io/erase-debt"}))
		return len(list.Items)
	}
	// A host that matched by a MAC (which anyone on the boot network can
	// claim) and erased a disk of its own pays its quarantine, not the
	// machine's debt: the debt names the machine's disk.
	require.NotNil(t, byMAC)
	require.NoError(t, byMAC.StepResult("sanitize", erased))
	e.waitAgent(byMAC, "free", func(a *v1beta1.Agent) bool { return !lifecycle.SanitizationOwed(a) })
	require.Equal(t, 1, debts(), "a disk that is not the machine's settles nothing")
	// Nor is that host quarantined again at every inventory: once per
	// Agent (a host whose old disks were replaced would erase forever).
	report := *inv
	report.SystemVendor.SerialNumber = ""
	report.Disks = []agentwire.Disk{inv.Disks[0]}
	report.Disks[0].Serial = ""
	report.Memory.UsableBytes -= 1 << 20 // a new report
	report.Interfaces = append(append([]agentwire.Interface(nil), inv.Interfaces...), agentwire.Interface{Name: "eth1", MacAddress: stack.MAC(101), IPV4Addresses: []string{}, IPV6Addresses: []string{}, Flags: []string{"up"}, Mtu: 1500})
	require.NoError(t, byMAC.PutInventory(&report))
	a := e.waitAgent(byMAC, "inventoried again", func(a *v1beta1.Agent) bool { return a.Status.Inventory.Memory.UsableBytes == report.Memory.UsableBytes })
	require.False(t, lifecycle.SanitizationOwed(a), "%+v", a.Status.DiskSanitization)

	// The machine's own disk erased, it owes nothing any more, under any
	// Agent.
	require.NotNil(t, clean)
	require.NoError(t, clean.StepResult("sanitize", erased))
	require.Eventually(t, func() bool { return debts() == 0 }, wait, 200*time.Millisecond, "the debt is settled")
	again, err := e.TryRegisterAs(t, ieOther, "8d0c6a51-7e4f-8b3a-9c2d-000000000103", agentwire.HostIdentity{MACAddresses: []string{stack.MAC(1), stack.MAC(103)}}, inv)
	require.NoError(t, err)
	// An unrelated host, registered now, owes nothing either.
	stranger, err := e.TryRegisterAs(t, ieOther, stack.HostID(104), agentwire.HostIdentity{MACAddresses: []string{stack.MAC(104)}}, stack.FakeInventory("host-104", stack.MAC(104)))
	require.NoError(t, err)
	for _, free := range []*stack.Host{again, stranger} {
		a := e.waitAgent(free, "inventoried", func(a *v1beta1.Agent) bool { return a.Status.Inventory.ReportTime != nil })
		require.False(t, lifecycle.SanitizationOwed(a), "%s owes nothing: %+v", free.ID, a.Status.DiskSanitization)
	}
}

// A heartbeat the agent lets the service hold is answered as soon as its
// host is bound and the installation handed over, not at its next poll;
// held for nothing, it tells the host to come back after the rest of the
// poll interval, so that holding costs no more requests than polling.
func TestHeldHeartbeatAnsweredWhenBound(t *testing.T) {
	e := start(t, true)
	h := e.readyHost(1, map[string]string{"pool": "a"})
	t0 := time.Now()
	in, err := h.HeartbeatWait(2)
	require.NoError(t, err)
	require.Empty(t, in.Steps)
	require.GreaterOrEqual(t, time.Since(t0), 2*time.Second, "held for its wait")
	require.InDelta(t, int(agentwire.DefaultPollInterval/time.Second)-2, in.PollSeconds, 1, "the rest of the poll interval")

	got := make(chan agentwire.Instructions, 1)
	go func() {
		in, err := h.HeartbeatWait(agentwire.MaxWaitSeconds)
		assert.NoError(t, err)
		got <- in
	}()
	// Bound only once the heartbeat is held (the agent API's gauge says
	// so): answered by a wake, not by a first look that finds it bound.
	require.Eventually(t, func() bool {
		held, _ := stack.Metric(t, "agentboot_agent_api_held_heartbeats", nil)
		return held == 1
	}, wait, 10*time.Millisecond, "the heartbeat is held")
	e.bind(h)
	in = <-got
	require.Len(t, in.Steps, 1, "the held heartbeat is answered with the install step (held to its end, it would be empty)")
	require.Equal(t, agentwire.StepInstall, in.Steps[0].Kind)
	require.Equal(t, int(agentwire.DefaultPollInterval/time.Second), in.PollSeconds)

	// A host waiting for a person's approval is not worth a held request.
	waiting := e.Register(t, e.ie, 2)
	t0 = time.Now()
	in, err = waiting.HeartbeatWait(agentwire.MaxWaitSeconds)
	require.NoError(t, err)
	require.Less(t, time.Since(t0), time.Duration(agentwire.MaxWaitSeconds)*time.Second/2, "an unapproved host's heartbeat is answered at once")
	require.Equal(t, int(agentwire.DefaultPollInterval/time.Second), in.PollSeconds)
}
