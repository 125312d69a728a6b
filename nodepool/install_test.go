package nodepool_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	hypershift "github.com/agentboot/agentboot/api/hypershift/v1beta1"
	"github.com/agentboot/agentboot/internal/agentapi"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/discovery"
	"github.com/agentboot/agentboot/internal/testenv"
	"github.com/agentboot/agentboot/nodepool"
	"github.com/agentboot/agentboot/test/stack"
)

// hostedCluster is a second kube-apiserver playing the hosted cluster.
type hostedCluster struct {
	env   *testenv.Env
	admin kubernetes.Interface
}

// startHosted starts the hosted cluster's apiserver and, unless publish is
// false, publishes its kubeconfig as HyperShift does (status.kubeConfig).
func (e *env) startHosted(publish bool) *hostedCluster {
	env, err := testenv.Start(testenv.Options{NoCRDs: true})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = env.Stop() })
	h := &hostedCluster{env: env, admin: kubernetes.NewForConfigOrDie(env.Config)}
	// Kubelets (bootstrapping or not) may ask for certificates, as in a
	// real cluster.
	_, err = h.admin.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelets-request-certificates"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:authenticated"}},
	}, metav1.CreateOptions{})
	require.NoError(e.t, err)
	if publish {
		e.publishKubeconfig(h)
	}
	return h
}

func (e *env) publishKubeconfig(h *hostedCluster) {
	ctx := context.Background()
	kc, err := os.ReadFile(h.env.Kubeconfig)
	require.NoError(e.t, err)
	require.NoError(e.t, e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.hc.Namespace, Name: e.hc.Name + "-admin-kubeconfig"},
		Data: map[string][]byte{"kubeconfig": kc}}))
	patch := client.MergeFrom(e.hc.DeepCopy())
	e.hc.Status.KubeConfig = &hypershift.KubeconfigSecretRef{Name: e.hc.Name + "-admin-kubeconfig"}
	require.NoError(e.t, e.Client.Status().Patch(ctx, e.hc, patch))
}

// userData is HyperShift's user-data Secret for a NodePool, in the
// control-plane namespace.
func (e *env) userData(np string) string {
	ctx := context.Background()
	cp := e.hc.Namespace + "-" + e.hc.Name
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cp}}); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(e.t, err)
	}
	value := fmt.Sprintf(`{"ignition":{"version":"3.2.0","config":{"merge":[{"source":"https://ignition.example:443/ignition","httpHeaders":[{"name":"Authorization","value":"Bearer c2VjcmV0"},{"name":"NodePool","value":"%s/%s"}]}]}}}`, e.hc.Namespace, np)
	require.NoError(e.t, e.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: cp, Name: "user-data-" + np + "-4f2a9c1e",
			Annotations: map[string]string{nodepool.UserDataAnnotation: e.hc.Namespace + "/" + np}},
		Data: map[string][]byte{"value": []byte(value)}}))
	// A Secret of another NodePool is never picked.
	_ = e.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: cp, Name: "user-data-other-0000",
			Annotations: map[string]string{nodepool.UserDataAnnotation: e.hc.Namespace + "/other"}},
		Data: map[string][]byte{"value": []byte(`{"ignition":{"version":"3.2.0"}}`)}})
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

// kubelet plays a host's kubelet against the hosted cluster.
type kubelet struct {
	t    *testing.T
	h    *hostedCluster
	name string
}

// csr submits a CSR for CN system:node:<cn> as user, with the SANs.
func (k *kubelet) csr(name, signer, user, cn string, dns []string, ips []net.IP, usages ...certificatesv1.KeyUsage) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(k.t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + cn, Organization: []string{"system:nodes"}}, DNSNames: dns, IPAddresses: ips}, key)
	require.NoError(k.t, err)
	cfg := rest.CopyConfig(k.h.env.Config)
	groups := []string{"system:authenticated"}
	if strings.HasPrefix(user, "system:node:") {
		groups = append(groups, "system:nodes")
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c := kubernetes.NewForConfigOrDie(cfg)
	_, err = c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: signer, Usages: usages},
	}, metav1.CreateOptions{})
	require.NoError(k.t, err)
}

func (k *kubelet) approved(name string) bool {
	csr, err := k.h.admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(k.t, err)
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// register creates the Node, as kubelet does once it has its certificate.
func (k *kubelet) register() {
	_, err := k.h.admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.name}}, metav1.CreateOptions{})
	require.NoError(k.t, err)
}

func (k *kubelet) ready() {
	ctx := context.Background()
	n, err := k.h.admin.CoreV1().Nodes().Get(ctx, k.name, metav1.GetOptions{})
	require.NoError(k.t, err)
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	_, err = k.h.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	require.NoError(k.t, err)
}

const (
	clientSigner  = certificatesv1.KubeAPIServerClientKubeletSignerName
	servingSigner = certificatesv1.KubeletServingSignerName
	bootstrapper  = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper"
)

var (
	clientUsages  = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	servingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
)

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
	hosted := e.startHosted(true)
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
	kl := &kubelet{t: t, h: hosted, name: "host-1"}
	kl.csr("intruder", clientSigner, bootstrapper, "host-9", nil, nil, clientUsages...)
	kl.csr("wrong-user", clientSigner, "mallory", "host-1", nil, nil, clientUsages...)
	kl.csr("client", clientSigner, bootstrapper, "host-1", nil, nil, clientUsages...)
	require.Eventually(t, func() bool { return kl.approved("client") }, wait, 100*time.Millisecond)
	e.waitAgent(h, "configuring", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageConfiguring })
	kl.register()
	e.waitAgent(h, "joined", func(a *v1beta1.Agent) bool { return a.Status.Progress.CurrentStage == v1beta1.StageJoined })
	kl.csr("serving-bad-ip", servingSigner, "system:node:host-1", "host-1", []string{"host-1"}, []net.IP{net.ParseIP("198.18.0.99")}, servingUsages...)
	kl.csr("serving", servingSigner, "system:node:host-1", "host-1", []string{"host-1"}, []net.IP{net.ParseIP("198.18.0.10")}, servingUsages...)
	require.Eventually(t, func() bool { return kl.approved("serving") }, wait, 100*time.Millisecond)
	kl.ready()
	a = e.waitAgent(h, "done", func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "added-to-existing-cluster" && installed(v1beta1.InstallationCompletedReason)(a)
	})
	require.Equal(t, v1beta1.StageDone, a.Status.Progress.CurrentStage)
	require.EqualValues(t, 100, a.Status.Progress.InstallationPercentage)
	for _, name := range []string{"intruder", "wrong-user", "serving-bad-ip"} {
		require.False(t, kl.approved(name), "CSR %s must not be approved", name)
	}
	out, err := e.Env.Kubectl(ctx, "", "-n", e.agentsNS, "get", "agents")
	require.NoError(t, err)
	t.Logf("kubectl get agents (joined):\n%s", out)
	require.Regexp(t, h.ID+`\s+vcluster2\s+true\s+worker\s+Done`, out)

	// 1 → 0: a PodDisruptionBudget holds the drain until it goes.
	_, err = hosted.admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	_, err = hosted.admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "host-1", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Running and Ready, as its kubelet would say: only such pods are
	// protected by a PodDisruptionBudget.
	pod, err := hosted.admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
	require.NoError(t, err)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	_, err = hosted.admin.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = hosted.admin.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The status the disruption controller would compute: no disruption
	// allowed.
	pdb, err := hosted.admin.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "app", metav1.GetOptions{})
	require.NoError(t, err)
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	_, err = hosted.admin.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(ctx, pdb, metav1.UpdateOptions{})
	require.NoError(t, err)
	e.scale(np, 0)
	e.waitAgent(h, "drain held by the PodDisruptionBudget", func(a *v1beta1.Agent) bool {
		return strings.Contains(a.Status.Progress.ProgressInfo, "default/app: a PodDisruptionBudget does not allow its eviction now")
	})
	node, err := hosted.admin.CoreV1().Nodes().Get(ctx, "host-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, node.Spec.Unschedulable, "cordoned")
	require.NoError(t, hosted.admin.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, "app", metav1.DeleteOptions{}))
	a = e.waitAgent(h, "released, waiting for a reboot into discovery", func(a *v1beta1.Agent) bool {
		c := conditions.Find(a.Status.Conditions, v1beta1.BoundCondition)
		return a.Spec.ClusterDeploymentName == nil && c != nil && c.Reason == v1beta1.UnbindingPendingUserActionRsn &&
			a.Status.DebugInfo.State == "unbinding-pending-user-action"
	})
	require.Contains(t, conditions.Find(a.Status.Conditions, v1beta1.BoundCondition).Message, "reboot the host into the discovery image")
	require.False(t, discovery.BootsFromDisk(a), "a released host boots discovery")
	_, err = hosted.admin.CoreV1().Nodes().Get(ctx, "host-1", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the Node is deleted: %v", err)
	pod, err = hosted.admin.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{})
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

	// No user-data Secret yet: said, not guessed; no step.
	in, err := hosts[1].Heartbeat()
	require.NoError(t, err)
	require.Empty(t, in.Steps)
	e.waitAgent(hosts[1], "waiting for user-data", func(a *v1beta1.Agent) bool {
		c := conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition)
		return c != nil && c.Reason == v1beta1.InstallationNotStartedReason && strings.Contains(c.Message, "has no user-data Secret in namespace "+e.hc.Namespace+"-vcluster2")
	})
	e.userData("vcluster2")
	hosted := e.startHosted(false)
	(&kubelet{t: t, h: hosted, name: "host-4"}).register()
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
	e.publishKubeconfig(hosted)
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
