package nodepool_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentapi"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/stack"
)

// startHosted starts the hosted cluster's apiserver and, unless publish is
// false, publishes its kubeconfig as HyperShift does (status.kubeConfig).
func (e *env) startHosted(publish bool) *hosted.Cluster {
	h := hosted.Start(e.t)
	if publish {
		h.Publish(e.t, e.Client, e.hc)
	}
	return h
}

// userData is HyperShift's user-data Secret for a NodePool.
func (e *env) userData(np string) string {
	value := fmt.Sprintf(`{"ignition":{"version":"3.2.0","config":{"merge":[{"source":"https://ignition.example:443/ignition","httpHeaders":[{"name":"Authorization","value":"Bearer c2VjcmV0"},{"name":"NodePool","value":"%s/%s"}]}]}}}`, e.hc.Namespace, np)
	hosted.UserData(e.t, e.Client, e.hc, np, value)
	return value
}

// readyHost is readyAgent returning the simulated host.
func (e *env) readyHost(i int, labels map[string]string) *stack.Host {
	e.t.Helper()
	name := e.readyAgent(i, labels)
	h := e.Register(e.t, e.ie, i) // registering again is harmless and gives the host
	require.Equal(e.t, name, h.ID)
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
	for {
		a := e.agent(h)
		if ok(a) {
			return a
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Agent %s: never %s; progress %+v, conditions %+v, state %q", h.ID, what, a.Status.Progress, a.Status.Conditions, a.Status.DebugInfo.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// installStep heartbeats until the host is given its install step.
func (e *env) installStep(h *stack.Host) agentapi.Step {
	e.t.Helper()
	var steps []agentapi.Step
	require.Eventually(e.t, func() bool {
		in, err := h.Heartbeat()
		require.NoError(e.t, err)
		steps = in.Steps
		return len(steps) > 0
	}, wait, 200*time.Millisecond, "host %s never got its install step: %+v", h.ID, e.agent(h).Status)
	require.Len(e.t, steps, 1)
	return steps[0]
}

func installed(reason string) func(a *v1beta1.Agent) bool {
	return func(a *v1beta1.Agent) bool {
		c := conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition)
		return c != nil && c.Reason == reason
	}
}

// TestInstallJoinAndRelease: NodePool 0→1 binds a host, which gets its
// install step (disk, the catalog's disk image, the NodePool's user-data),
// reports its stages, reboots; its kubelet's CSRs are approved (only its
// own), its Node joins and becomes Ready: Done. Then 1→0 drains the Node
// (held by a PodDisruptionBudget until it goes), deletes it, unbinds the
// Agent, which waits for a reboot into discovery and, once the host
// registers again, is back in the free pool.
func TestInstallJoinAndRelease(t *testing.T) {
	e := start(t, 0)
	ctx := context.Background()
	hc := e.startHosted(true)
	h := e.readyHost(1, map[string]string{"pool": "a"})
	ignition := e.userData("vcluster2")
	np := e.nodePool("vcluster2", 0, map[string]string{"pool": "a"})
	e.scale(np, 1)
	e.waitBound(np, 1)

	step := e.installStep(h)
	require.Equal(t, agentapi.StepInstall, step.Kind)
	require.Equal(t, "/dev/vda", step.Install.DiskPath)
	require.Equal(t, ignition, step.Install.Ignition, "the NodePool's own user-data")
	k, err := e.Catalog.Resolve("x86_64", "")
	require.NoError(t, err)
	disk := e.Catalog.DiskStatus(k)
	require.Equal(t, discovery.DiskImageURL(e.Settings, k), step.Install.ImageURL)
	require.Equal(t, disk.Image.SHA256, step.Install.ImageSHA256)
	in, err := h.Heartbeat()
	require.NoError(t, err)
	require.Empty(t, in.Steps, "the installation is handed out once")
	a := e.waitAgent(h, "installing", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "installing" && installed(v1beta1.InstallationInProgressReason)(a)
	})
	require.Equal(t, "/dev/disk/by-id/virtio-disk0", a.Status.InstallationDiskID)
	require.Equal(t, v1beta1.AgentAlreadyInstallingReason, conditions.Find(a.Status.Conditions, v1beta1.RequirementsMetCondition).Reason)
	require.Len(t, a.Status.Progress.ProgressStages, 9)

	// The host reports; stages only go forward, and the later ones are not
	// the host's to report.
	require.NoError(t, h.Progress("Starting installation", 0, "installing to /dev/vda"))
	require.NoError(t, h.Progress("Writing image to disk", 50, "100 of 200 MiB"))
	require.ErrorContains(t, h.Progress("Installing", 5, ""), "cannot follow")
	require.ErrorContains(t, h.Progress("Done", 100, ""), "not one a host reports")
	e.waitAgent(h, "writing at 50%", func(a *v1beta1.Agent) bool {
		c := conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition)
		return a.Status.DebugInfo.State == "installing-in-progress" && c != nil && strings.Contains(c.Message, "Writing image to disk, 50%")
	})
	require.NoError(t, h.Progress("Rebooting", 100, ""))
	require.NoError(t, h.StepResult("install", agentapi.StepResult{Output: "installed to /dev/vda"}))
	a = e.waitAgent(h, "rebooting", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageRebooting })
	require.True(t, discovery.BootsFromDisk(a))

	// The installed host's kubelet bootstraps. Only its own CSRs, from the
	// right identities, with its own names and addresses, are approved.
	kl := &hosted.Kubelet{T: t, C: hc, Name: "host-1"}
	kl.CSR("intruder", hosted.ClientSigner, hosted.Bootstrapper, "host-9", nil, nil, hosted.ClientUsages...)
	kl.CSR("wrong-user", hosted.ClientSigner, "mallory", "host-1", nil, nil, hosted.ClientUsages...)
	kl.CSR("client", hosted.ClientSigner, hosted.Bootstrapper, "host-1", nil, nil, hosted.ClientUsages...)
	require.Eventually(t, func() bool { return kl.Approved("client") }, wait, 100*time.Millisecond)
	e.waitAgent(h, "configuring", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageConfiguring })
	kl.Register()
	e.waitAgent(h, "joined", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageJoined })
	kl.CSR("serving-bad-ip", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, []net.IP{net.ParseIP("198.18.0.99")}, hosted.ServingUsages...)
	kl.CSR("serving", hosted.ServingSigner, "system:node:host-1", "host-1", []string{"host-1"}, []net.IP{net.ParseIP("198.18.0.10")}, hosted.ServingUsages...)
	require.Eventually(t, func() bool { return kl.Approved("serving") }, wait, 100*time.Millisecond)
	kl.Ready()
	a = e.waitAgent(h, "done", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "added-to-existing-cluster" && installed(v1beta1.InstallationCompletedReason)(a)
	})
	require.Equal(t, v1beta1.StageDone, a.Status.Progress.CurrentStage)
	require.EqualValues(t, 100, a.Status.Progress.InstallationPercentage)
	for _, name := range []string{"intruder", "wrong-user", "serving-bad-ip"} {
		require.False(t, kl.Approved(name), "CSR %s must not be approved", name)
	}
	out, err := e.Env.Kubectl(ctx, "", "-n", e.agentsNS, "get", "agents")
	require.NoError(t, err)
	t.Logf("kubectl get agents (joined):\n%s", out)
	require.Regexp(t, h.ID+`\s+vcluster2\s+true\s+worker\s+Done`, out)

	// 1 → 0: a PodDisruptionBudget holds the drain until it goes.
	_, err = hc.Admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	_, err = hc.Admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "host-1", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Running and Ready, as its kubelet would say: only such pods are
	// protected by a PodDisruptionBudget.
	pod, err := hc.Admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
	require.NoError(t, err)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	_, err = hc.Admin.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = hc.Admin.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The status the disruption controller would compute: no disruption
	// allowed.
	pdb, err := hc.Admin.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "app", metav1.GetOptions{})
	require.NoError(t, err)
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	_, err = hc.Admin.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(ctx, pdb, metav1.UpdateOptions{})
	require.NoError(t, err)
	e.scale(np, 0)
	e.waitAgent(h, "drain held by the PodDisruptionBudget", func(a *v1beta1.Agent) bool {
		return strings.Contains(a.Status.Progress.ProgressInfo, "default/app: a PodDisruptionBudget does not allow its eviction now")
	})
	node, err := hc.Admin.CoreV1().Nodes().Get(ctx, "host-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, node.Spec.Unschedulable, "cordoned")
	require.NoError(t, hc.Admin.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, "app", metav1.DeleteOptions{}))
	a = e.waitAgent(h, "released, waiting for a reboot into discovery", func(a *v1beta1.Agent) bool {
		c := conditions.Find(a.Status.Conditions, v1beta1.BoundCondition)
		return a.Spec.ClusterDeploymentName == nil && c != nil && c.Reason == v1beta1.UnbindingPendingUserActionRsn &&
			a.Status.DebugInfo.State == "unbinding-pending-user-action"
	})
	require.Contains(t, conditions.Find(a.Status.Conditions, v1beta1.BoundCondition).Message, "reboot the host into the discovery image")
	require.False(t, discovery.BootsFromDisk(a), "a released host boots discovery")
	_, err = hc.Admin.CoreV1().Nodes().Get(ctx, "host-1", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the Node is deleted: %v", err)
	pod, err = hc.Admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err) || !pod.DeletionTimestamp.IsZero(), "the pod was evicted")
	out, err = e.Env.Kubectl(ctx, "", "-n", e.agentsNS, "get", "agents")
	require.NoError(t, err)
	t.Logf("kubectl get agents (released):\n%s", out)
	require.Regexp(t, h.ID+`\s+true\s+auto-assign\s+Done`, out)

	// The host boots discovery and registers again: back in the pool.
	h.Reregister(t, e.ie, 1)
	_, err = h.Heartbeat()
	require.NoError(t, err)
	e.waitAgent(h, "back in the free pool", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "known-unbound" && a.Status.Progress.CurrentStage == "" && installed(v1beta1.InstallationNotStartedReason)(a)
	})
	requireEvent(t, e, np.Name, "AgentReleased")
}

func ptrTo[T any](v T) *T { return &v }

// TestInstallFaults: every wait ends in a visible, specific state.
func TestInstallFaults(t *testing.T) {
	s := stack.Start(t, stack.Options{NodePool: nodepool.Config{RetryAfter: time.Second, Poll: 300 * time.Millisecond,
		Timeouts: nodepool.Timeouts{Install: 10 * time.Second, Join: 10 * time.Second, Ready: 4 * time.Second, Drain: 4 * time.Second}}})
	e := startOn(t, s, 0)
	hosts := map[int]*stack.Host{}
	for i := 1; i <= 4; i++ {
		hosts[i] = e.readyHost(i, map[string]string{"pool": "a"})
	}
	np := e.nodePool("vcluster2", 4, map[string]string{"pool": "a"})
	e.waitBound(np, 4)

	// No user-data Secret yet: said, not guessed; no step. (Heartbeats go
	// on: the cheaper checks, such as the disk image being downloaded,
	// are reported first.)
	e.waitAgent(hosts[1], "waiting for user-data", func(a *v1beta1.Agent) bool {
		in, err := hosts[1].Heartbeat()
		require.NoError(t, err)
		require.Empty(t, in.Steps)
		c := conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition)
		return c != nil && c.Reason == v1beta1.InstallationNotStartedReason && strings.Contains(c.Message, "has no user-data Secret in namespace "+e.hc.Namespace+"-vcluster2")
	})
	e.userData("vcluster2")
	hc := e.startHosted(false)
	(&hosted.Kubelet{T: t, C: hc, Name: "host-4"}).Register()
	for _, h := range hosts {
		e.installStep(h)
	}
	// 2: the disk write fails on the host.
	require.NoError(t, hosts[2].Progress("Failed", 0, "write the image to /dev/vda: input/output error"))
	require.NoError(t, hosts[2].StepResult("install", agentapi.StepResult{ExitCode: 1, Error: "write the image to /dev/vda: input/output error"}))
	// 3 and 4 reboot into their disks.
	require.NoError(t, hosts[3].Progress("Rebooting", 100, ""))
	require.NoError(t, hosts[4].Progress("Rebooting", 100, ""))
	// 1: the host writes, then falls silent.
	require.NoError(t, hosts[1].Progress("Writing image to disk", 30, ""))

	a := e.waitAgent(hosts[2], "failed: disk write", installed(v1beta1.InstallationFailedReason))
	require.Contains(t, conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition).Message, "input/output error")
	require.ErrorContains(t, hosts[2].Progress("Rebooting", 100, ""), "already ended")
	// The hosted cluster has no kubeconfig yet: said so.
	e.waitAgent(hosts[3], "waiting for the kubeconfig", func(a *v1beta1.Agent) bool {
		return strings.Contains(a.Status.Progress.ProgressInfo, "has not published status.kubeConfig yet")
	})
	hc.Publish(t, e.Client, e.hc)
	e.waitAgent(hosts[1], "failed: stopped reporting", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "error" && installed(v1beta1.InstallationFailedReason)(a) &&
			strings.Contains(a.Status.Progress.ProgressInfo, `stopped reporting during "Writing image to disk"`)
	})
	// 3: no Node ever comes.
	e.waitAgent(hosts[3], "failed: never joined", func(a *v1beta1.Agent) bool {
		return installed(v1beta1.InstallationFailedReason)(a) && strings.Contains(a.Status.Progress.ProgressInfo, "no Node named host-3 appeared within 10s")
	})
	// 4: joins, never Ready.
	e.waitAgent(hosts[4], "failed: never Ready", func(a *v1beta1.Agent) bool {
		return installed(v1beta1.InstallationFailedReason)(a) && strings.Contains(a.Status.Progress.ProgressInfo, "Node host-4 did not become Ready within 4s")
	})

	// A host that registers again mid-installation lost it.
	h5 := e.readyHost(5, map[string]string{"pool": "a"})
	e.scale(np, 5)
	e.installStep(h5)
	h5.Reregister(t, e.ie, 5)
	e.waitAgent(h5, "failed: restarted", func(a *v1beta1.Agent) bool {
		return installed(v1beta1.InstallationFailedReason)(a) && strings.Contains(a.Status.Progress.ProgressInfo, "restarted into the discovery image during the installation")
	})

	// Released after failing before its disk was written: the host still
	// runs discovery, so it is free at once.
	e.scale(np, 0)
	e.waitAgent(hosts[2], "free again", func(a *v1beta1.Agent) bool {
		return a.Spec.ClusterDeploymentName == nil && a.Status.DebugInfo.State == "known-unbound"
	})
	// Released after joining a cluster it cannot reach any more (its Node
	// is gone): unbound, waiting for a reboot into discovery.
	e.waitAgent(hosts[4], "released", func(a *v1beta1.Agent) bool {
		return a.Spec.ClusterDeploymentName == nil && a.Status.DebugInfo.State == "unbinding-pending-user-action"
	})
}
