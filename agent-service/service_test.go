package agentservice_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentservice "github.com/agentboot/agentboot/agent-service"
	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	agentclient "github.com/agentboot/agentboot/agent/client"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

var s *stack.Stack

// passes are the Agent controller's.
var passes = testenv.NewPasses()

func TestMain(m *testing.M) {
	stack.MainWith(m, stack.Options{
		AgentPollInterval:       time.Second,
		AgentLeaseRenewInterval: time.Second,
		AgentDisconnectAfter:    4 * time.Second,
		AgentControllerPasses:   passes.Observe,
	}, &s)
}

type host struct {
	token string
	cfg   agentwire.Config
	c     *agentclient.Client
	ns    string
	id    string
}

func infraEnv(t *testing.T, change func(*v1beta1.InfraEnv)) *v1beta1.InfraEnv {
	t.Helper()
	ie := stack.NewInfraEnv(s.Namespace(t, "agents"), "hardware-inventory")
	ie.Spec.AgentLabels = map[string]string{"rack": "r1"}
	if change != nil {
		change(ie)
	}
	require.NoError(t, s.Client.Create(context.Background(), ie))
	return s.WaitImage(t, client.ObjectKeyFromObject(ie))
}

func register(t *testing.T, ie *v1beta1.InfraEnv, n int) *host {
	t.Helper()
	cfg := s.AgentConfig(t, ie)
	c, err := agentclient.New(cfg)
	require.NoError(t, err)
	resp, err := c.Register(context.Background(), cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{
		InfraEnvUID: cfg.InfraEnv.UID, HostID: stack.HostID(n),
		Identity:     agentwire.HostIdentity{MACAddresses: []string{stack.MAC(n)}},
		AgentVersion: "v0.1.0-3-gabc1234",
	})
	require.NoError(t, err)
	require.Equal(t, stack.HostID(n), resp.HostID)
	c.SetToken(resp.AgentToken)
	return &host{cfg: cfg, c: c, ns: resp.Namespace, id: resp.HostID, token: resp.AgentToken}
}

// reregister registers host n again after its earlier boot fell silent, as
// a rebooted host does (the service holds it off until it sees the
// silence).
func reregister(t *testing.T, ie *v1beta1.InfraEnv, n int) *host {
	t.Helper()
	s.Silence(t, ie.Namespace, stack.HostID(n))
	cfg := s.AgentConfig(t, ie)
	c, err := agentclient.New(cfg)
	require.NoError(t, err)
	var resp agentwire.RegisterResponse
	require.Eventually(t, func() bool {
		resp, err = c.Register(context.Background(), cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{
			InfraEnvUID: cfg.InfraEnv.UID, HostID: stack.HostID(n),
			Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(n)}},
		})
		return !agentclient.IsCode(err, agentwire.CodeHostActive)
	}, 30*time.Second, 100*time.Millisecond)
	require.NoError(t, err)
	c.SetToken(resp.AgentToken)
	return &host{cfg: cfg, c: c, ns: resp.Namespace, id: resp.HostID, token: resp.AgentToken}
}

func (h *host) agent(t *testing.T) *v1beta1.Agent {
	t.Helper()
	var a v1beta1.Agent
	require.NoError(t, s.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: h.id}, &a))
	return &a
}

func (h *host) beat(t *testing.T) {
	t.Helper()
	_, err := h.c.Instructions(context.Background(), h.ns, h.id, agentwire.InstructionsRequest{Time: time.Now()})
	require.NoError(t, err)
}

// waitAgent waits until the Agent satisfies cond, returning it.
func (h *host) waitAgent(t *testing.T, what string, cond func(*v1beta1.Agent) bool) *v1beta1.Agent {
	t.Helper()
	var a v1beta1.Agent
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-tick.C {
		if s.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: h.id}, &a) == nil && cond(&a) {
			return &a
		}
	}
	t.Fatalf("Agent %s never %s; status: %+v", h.id, what, a.Status)
	return nil
}

func validation(a *v1beta1.Agent, id string) v1beta1.ValidationResult { return stack.Validation(a, id) }

func condition(a *v1beta1.Agent, t v1beta1.ConditionType) v1beta1.Condition {
	if c := conditions.Find(a.Status.Conditions, t); c != nil {
		return *c
	}
	return v1beta1.Condition{}
}

func TestRegisterReportApprove(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	h := register(t, ie, 1)
	a := h.agent(t)
	require.Equal(t, "hardware-inventory", a.Labels[v1beta1.InfraEnvNameLabel])
	require.Equal(t, "r1", a.Labels["rack"], "agentLabels are copied")
	require.False(t, a.Spec.Approved)
	require.Equal(t, v1beta1.AgentRoleAutoAssign, a.Spec.Role)
	require.Equal(t, ie.UID, a.OwnerReferences[0].UID)
	require.Equal(t, "v0.1.0-3-gabc1234", lifecycle.Registration(a).AgentVersion, "the agent's version, as it reported it")

	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("worker-1", stack.MAC(1))))
	h.beat(t)
	a = h.waitAgent(t, "became known-unbound", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "known-unbound" })
	require.Equal(t, int64(4), a.Status.Inventory.CPU.Count)
	require.Equal(t, "worker-1", a.Status.Inventory.Hostname)
	require.Equal(t, v1beta1.AgentRoleAutoAssign, a.Status.Role)
	require.Equal(t, v1beta1.ValidationsPassingReason, condition(a, v1beta1.ValidatedCondition).Reason)
	require.Equal(t, v1beta1.AgentConnectedReason, condition(a, v1beta1.ConnectedCondition).Reason)
	require.Equal(t, v1beta1.AgentIsNotApprovedReason, condition(a, v1beta1.RequirementsMetCondition).Reason)
	require.Equal(t, v1beta1.InstallationNotStartedReason, condition(a, v1beta1.InstalledCondition).Reason)
	require.Equal(t, v1beta1.UnboundReason, condition(a, v1beta1.BoundCondition).Reason)
	for _, want := range []struct{ k, v string }{
		{"inventory.agent-install.openshift.io/cpu-architecture", "x86_64"},
		{"inventory.agent-install.openshift.io/cpu-virtenabled", "true"},
		{"inventory.agent-install.openshift.io/host-manufacturer", "QEMU"},
		{"inventory.agent-install.openshift.io/host-productname", "Standard-PC-Q35-ICH9-2009"},
		{"inventory.agent-install.openshift.io/host-isvirtual", "true"},
		{"inventory.agent-install.openshift.io/storage-hasnonrotationaldisk", "true"},
	} {
		require.Equal(t, want.v, a.Labels[want.k], want.k)
	}

	_, err := s.Env.Kubectl(ctx, "", "-n", h.ns, "patch", "agent", h.id, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err)
	a = h.waitAgent(t, "became ready", func(a *v1beta1.Agent) bool {
		return condition(a, v1beta1.RequirementsMetCondition).Reason == v1beta1.AgentReadyReason
	})
	require.Equal(t, corev1.ConditionTrue, condition(a, v1beta1.RequirementsMetCondition).Status)
	out, err := s.Env.Kubectl(ctx, "", "-n", h.ns, "get", "agents")
	require.NoError(t, err)
	require.Equal(t, []string{h.id, "true", "auto-assign"}, strings.Fields(strings.Split(out, "\n")[1]))
	waitEvent(t, h.ns, h.id, "Registered")
	waitEvent(t, h.ns, h.id, "Approved")

	// Rebooting and registering again finds the same Agent.
	again := reregister(t, ie, 1)
	require.Equal(t, h.id, again.id)
	require.Equal(t, a.UID, again.agent(t).UID)
}

func waitEvent(t *testing.T, ns, name, reason string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var evs corev1.EventList
		if s.Client.List(context.Background(), &evs, client.InNamespace(ns)) != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason {
				return true
			}
		}
		return false
	}, 10*time.Second, 100*time.Millisecond, "event %s for %s", reason, name)
}

func TestAutoApproval(t *testing.T) {
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) { ie.Spec.AgentApproval = &v1beta1.AgentApproval{AutoApprove: true} })
	h := register(t, ie, 2)
	require.True(t, h.agent(t).Spec.Approved)
}

func TestValidationsFollowTheHardware(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, func(ie *v1beta1.InfraEnv) {
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{CPUVirtualization: true, MinMemoryMiB: 4096}
	})
	cases := map[string]struct {
		change func(*agentwire.Inventory)
		id     string
		status string
		msg    string
	}{
		"one core":         {func(i *agentwire.Inventory) { i.CPU.Count = 1 }, "has-min-cpu-cores", "failure", "has 1 CPU cores; the minimum is 2"},
		"InfraEnv minimum": {func(i *agentwire.Inventory) { i.Memory.PhysicalBytes = 3 << 30 }, "has-min-memory", "failure", "3.0 GiB of memory; the minimum is 4.0 GiB"},
		"small disk":       {func(i *agentwire.Inventory) { i.Disks[0].SizeBytes = 20e9 }, "has-min-valid-disks", "failure", "vda: 20.0 GB, the minimum is 100 GB"},
		"ineligible disk": {func(i *agentwire.Inventory) {
			i.Disks[0].InstallationEligibility = agentwire.InstallationEligibility{NotEligibleReasons: []string{"Disk is removable"}}
		}, "has-min-valid-disks", "failure", "vda: Disk is removable"},
		"localhost":          {func(i *agentwire.Inventory) { i.Hostname = "localhost" }, "hostname-valid", "failure", "not allowed"},
		"bad hostname":       {func(i *agentwire.Inventory) { i.Hostname = "Bad_Name" }, "hostname-valid", "failure", "not a valid DNS name"},
		"no virtualization":  {func(i *agentwire.Inventory) { i.Virtualization.Verdict = agentwire.VirtNotSupportedByCPU }, "cnv-requirements-satisfied", "failure", "CPU does not have virtualization support"},
		"VM without nesting": {func(i *agentwire.Inventory) { i.Virtualization.Verdict = agentwire.VirtVirtualMachineWithoutNested }, "cpu-virtualization", "failure", "virtual-machine-without-nesting"},
	}
	n := 100
	for name, tc := range cases {
		n++
		t.Run(name, func(t *testing.T) {
			h := register(t, ie, n)
			inv := stack.FakeInventory(fmt.Sprintf("host-%d", n), stack.MAC(n))
			tc.change(inv)
			require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, inv))
			h.beat(t)
			a := h.waitAgent(t, "failed "+tc.id, func(a *v1beta1.Agent) bool { return validation(a, tc.id).Status == tc.status })
			require.Contains(t, validation(a, tc.id).Message, tc.msg)
			require.Equal(t, "insufficient-unbound", a.Status.DebugInfo.State)
			require.Equal(t, v1beta1.ValidationsFailingReason, condition(a, v1beta1.ValidatedCondition).Reason)
			require.Contains(t, a.Status.DebugInfo.StateInfo, tc.id)
		})
	}

	t.Run("duplicate hostnames", func(t *testing.T) {
		// The first host goes silent before the second appears: nothing of
		// its own wakes its controller, so only its neighbour's hostname
		// changes can keep its validation true.
		a, b := register(t, ie, 201), register(t, ie, 202)
		require.NoError(t, a.c.PutInventory(ctx, a.ns, a.id, stack.FakeInventory("twin", stack.MAC(201))))
		a.waitAgent(t, "went silent, unique", func(x *v1beta1.Agent) bool {
			return x.Status.DebugInfo.State == "disconnected-unbound" && validation(x, "hostname-unique").Status == "success"
		})
		require.NoError(t, b.c.PutInventory(ctx, b.ns, b.id, stack.FakeInventory("twin", stack.MAC(202))))
		got := a.waitAgent(t, "saw the duplicate", func(x *v1beta1.Agent) bool { return validation(x, "hostname-unique").Status == "failure" })
		require.Contains(t, validation(got, "hostname-unique").Message, b.id)
		// A requested hostname resolves it.
		_, err := s.Env.Kubectl(ctx, "", "-n", b.ns, "patch", "agent", b.id, "--type", "merge", "--patch", `{"spec":{"hostname":"twin-b"}}`)
		require.NoError(t, err)
		a.waitAgent(t, "became unique", func(x *v1beta1.Agent) bool { return validation(x, "hostname-unique").Status == "success" })
		// So does a twin that leaves.
		require.NoError(t, b.c.PutInventory(ctx, b.ns, b.id, stack.FakeInventory("twin", stack.MAC(202))))
		_, err = s.Env.Kubectl(ctx, "", "-n", b.ns, "patch", "agent", b.id, "--type", "merge", "--patch", `{"spec":{"hostname":null}}`)
		require.NoError(t, err)
		a.waitAgent(t, "saw the duplicate again", func(x *v1beta1.Agent) bool { return validation(x, "hostname-unique").Status == "failure" })
		_, err = s.Env.Kubectl(ctx, "", "-n", b.ns, "delete", "agent", b.id, "--wait=false")
		require.NoError(t, err)
		a.waitAgent(t, "unique once the twin left", func(x *v1beta1.Agent) bool { return validation(x, "hostname-unique").Status == "success" })
	})

	t.Run("clock far off", func(t *testing.T) {
		h := register(t, ie, 203)
		require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("clocky", stack.MAC(203))))
		_, err := h.c.Instructions(ctx, h.ns, h.id, agentwire.InstructionsRequest{Time: time.Now().Add(10 * time.Minute)})
		require.NoError(t, err)
		a := h.waitAgent(t, "saw the clock", func(x *v1beta1.Agent) bool { return validation(x, "ntp-synced").Status == "failure" })
		require.Contains(t, validation(a, "ntp-synced").Message, "10m0s away")
	})

	t.Run("virtualization not required", func(t *testing.T) {
		ie2 := infraEnv(t, nil)
		h := register(t, ie2, 204)
		inv := stack.FakeInventory("novirt", stack.MAC(204))
		inv.Virtualization.Verdict = agentwire.VirtVirtualMachineWithoutNested
		require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, inv))
		h.beat(t)
		a := h.waitAgent(t, "became known", func(x *v1beta1.Agent) bool { return x.Status.DebugInfo.State == "known-unbound" })
		require.Equal(t, "disabled", validation(a, "cpu-virtualization").Status)
		require.Equal(t, "success", validation(a, "cnv-requirements-satisfied").Status)
		require.Equal(t, "false", a.Labels["inventory.agent-install.openshift.io/cpu-virtenabled"])
		require.Equal(t, "disabled", validation(a, "secure-boot-enabled").Status, "not required")
		require.Equal(t, "Secure Boot is not available (the host booted with bios); the InfraEnv does not require it", validation(a, "secure-boot-enabled").Message)
	})

	t.Run("secure boot required", func(t *testing.T) {
		ie3 := infraEnv(t, func(ie *v1beta1.InfraEnv) {
			ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 1024, MinDiskSizeGB: 10, SecureBoot: true}
		})
		off := register(t, ie3, 205)
		inv := stack.FakeInventory("sb-off", stack.MAC(205))
		inv.Boot = agentwire.Boot{CurrentBootMode: "uefi", SecureBootState: "Disabled"}
		require.NoError(t, off.c.PutInventory(ctx, off.ns, off.id, inv))
		off.beat(t)
		a := off.waitAgent(t, "failed Secure Boot", func(x *v1beta1.Agent) bool { return validation(x, "secure-boot-enabled").Status == "failure" })
		require.Contains(t, validation(a, "secure-boot-enabled").Message, "Secure Boot is Disabled; the InfraEnv requires hosts that boot with Secure Boot enabled")
		require.NotEqual(t, "known-unbound", a.Status.DebugInfo.State, "not ready")

		on := register(t, ie3, 206)
		inv = stack.FakeInventory("sb-on", stack.MAC(206))
		inv.Boot = agentwire.Boot{CurrentBootMode: "uefi", SecureBootState: "Enabled"}
		require.NoError(t, on.c.PutInventory(ctx, on.ns, on.id, inv))
		on.beat(t)
		a = on.waitAgent(t, "became known", func(x *v1beta1.Agent) bool { return x.Status.DebugInfo.State == "known-unbound" })
		require.Equal(t, "success", validation(a, "secure-boot-enabled").Status)
	})
}

func TestDisconnectedAfterSilence(t *testing.T) {
	ctx := context.Background()
	h := register(t, infraEnv(t, nil), 3)
	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("quiet", stack.MAC(3))))
	h.beat(t)
	h.waitAgent(t, "was connected", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "known-unbound" })
	a := h.waitAgent(t, "went disconnected", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "disconnected-unbound" })
	require.Equal(t, v1beta1.AgentDisconnectedReason, condition(a, v1beta1.ConnectedCondition).Reason)
	require.Equal(t, "failure", validation(a, "connected").Status)
	h.beat(t)
	h.waitAgent(t, "came back", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "known-unbound" })
}

// Heartbeats renew a Lease at most every LeaseRenewInterval (1s here) and
// never rewrite the Agent.
func TestHeartbeatsWriteRarely(t *testing.T) {
	ctx := context.Background()
	h := register(t, infraEnv(t, nil), 4)
	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("busy", stack.MAC(4))))
	h.beat(t)
	h.waitAgent(t, "settled", func(a *v1beta1.Agent) bool { return a.Status.DebugInfo.State == "known-unbound" })

	var l coordinationv1.Lease
	leaseKey := client.ObjectKey{Namespace: stack.Namespace, Name: "agent." + h.ns + "." + h.id}
	// The inventory was just written: the same again only from the fifth
	// beat on, a second later, as a host resending it now and then would.
	beats := 1
	versions := map[string]bool{}
	beat := func(tick *time.Ticker) {
		<-tick.C
		if beats%5 == 0 {
			// The same inventory again: no write either.
			require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("busy", stack.MAC(4))))
		}
		_, err := h.c.Instructions(ctx, h.ns, h.id, agentwire.InstructionsRequest{Time: time.Now()})
		require.NoError(t, err)
		beats++
		if s.Client.Get(ctx, leaseKey, &l) == nil {
			versions[l.ResourceVersion] = true
		}
	}
	// Heartbeating, until the Agent controller made two passes (the Lease
	// renewals bring them): whatever it had to write after registration
	// is in.
	// At the pace the agent API allows a host for good (2 a second).
	slow := time.NewTicker(500 * time.Millisecond)
	defer slow.Stop()
	settled := passes.Mark(client.ObjectKey{Namespace: h.ns, Name: h.id})
	for deadline := time.Now().Add(time.Minute); passes.Since(settled) < 2; {
		require.True(t, time.Now().Before(deadline), "the Agent controller made %d passes in a minute of heartbeats", passes.Since(settled))
		beat(slow)
	}
	before := h.agent(t)
	require.NoError(t, s.Client.Get(ctx, leaseKey, &l))
	versions = map[string]bool{l.ResourceVersion: true}
	first := beats
	// Then five a second, for three seconds (within the host's burst).
	fast := time.NewTicker(200 * time.Millisecond)
	defer fast.Stop()
	for start := time.Now(); time.Since(start) < 3*time.Second; {
		beat(fast)
	}
	require.GreaterOrEqual(t, beats-first, 12)
	require.LessOrEqual(t, len(versions), 5, "about one Lease write per second over 3s of 5 heartbeats a second")
	after := h.agent(t)
	before.ManagedFields, after.ManagedFields = nil, nil
	require.Equal(t, before.ResourceVersion, after.ResourceVersion, "the Agent is not rewritten by heartbeats: %s", cmp.Diff(before, after))
}

func TestBadRequests(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	h := register(t, ie, 5)
	other := register(t, ie, 6)

	raw := func(method, path, token string, body []byte) (int, agentwire.Error) {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM([]byte(h.cfg.CABundle))
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, _ := http.NewRequest(method, "https://"+s.AgentAPIAddr+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var e agentwire.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	regPath := "/api/v1/infraenvs/" + ie.Namespace + "/" + ie.Name + "/hosts"
	goodReg, _ := json.Marshal(agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: stack.HostID(7), Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(7)}}})
	invPath := func(id string) string { return "/api/v1/namespaces/" + h.ns + "/agents/" + id + "/inventory" }
	big := bytes.Repeat([]byte("x"), agentwire.MaxInventoryBytes+10)
	goodInv, _ := json.Marshal(stack.FakeInventory("x", stack.MAC(5)))
	badMAC := stack.FakeInventory("x", stack.MAC(5))
	badMAC.Interfaces[0].MacAddress = "not-a-mac"
	badMACInv, _ := json.Marshal(badMAC)
	tokenOf := func(hh *host) string { return hh.token }
	hTok := tokenOf(h)
	otherSession := "0123456789abcdef0123456789abcdef" + hTok[strings.LastIndexByte(hTok, '.'):]

	cases := map[string]struct {
		method, path, token string
		body                []byte
		code                int
		errCode             string
	}{
		"registration without token":    {"POST", regPath, "", goodReg, 401, "Unauthorized"},
		"registration with wrong token": {"POST", regPath, hTok, goodReg, 401, "Unauthorized"},
		"unknown InfraEnv":              {"POST", "/api/v1/infraenvs/" + ie.Namespace + "/nope/hosts", "x", goodReg, 401, "Unauthorized"},
		"unknown InfraEnv, good token":  {"POST", "/api/v1/infraenvs/" + ie.Namespace + "/nope/hosts", h.cfg.RegistrationToken, goodReg, 410, agentwire.CodeInfraEnvGone},
		"another session's token":       {"POST", "/api/v1/namespaces/" + h.ns + "/agents/" + h.id + "/instructions", otherSession, []byte(`{}`), 401, "Unauthorized"},
		"malformed registration":        {"POST", regPath, h.cfg.RegistrationToken, []byte(`{"hostID":`), 400, "BadRequest"},
		"unknown registration field":    {"POST", regPath, h.cfg.RegistrationToken, []byte(`{"hostID":"x","evil":1}`), 400, "BadRequest"},
		"agent version not a version":   {"POST", regPath, h.cfg.RegistrationToken, mustJSON(agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: stack.HostID(98), AgentVersion: "v1 <script>", Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(98)}}}), 400, "BadRequest"},
		"host ID not a UUID":            {"POST", regPath, h.cfg.RegistrationToken, []byte(`{"infraEnvUID":"` + string(ie.UID) + `","hostID":"../etc","identity":{"macAddresses":[]}}`), 400, "BadRequest"},
		"ID of another host":            {"POST", regPath, h.cfg.RegistrationToken, mustJSON(agentwire.RegisterRequest{InfraEnvUID: string(ie.UID), HostID: h.id, Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(99)}}}), 409, agentwire.CodeHostIDConflict},
		"inventory with no token":       {"PUT", invPath(h.id), "", goodInv, 401, "Unauthorized"},
		"another host's token":          {"PUT", invPath(other.id), hTok, goodInv, 401, "Unauthorized"},
		"oversized inventory":           {"PUT", invPath(h.id), hTok, big, 400, "BadInventory"},
		"malformed inventory":           {"PUT", invPath(h.id), hTok, []byte(`{"cpu":{"count":"many"}}`), 400, "BadInventory"},
		"inventory with a bad MAC":      {"PUT", invPath(h.id), hTok, badMACInv, 400, "BadInventory"},
		"another Agent's token":         {"PUT", invPath(stack.HostID(999)), hTok, goodInv, 401, "Unauthorized"},
		"unknown path":                  {"GET", "/api/v0/whatever", "", nil, 404, "NotFound"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, e := raw(tc.method, tc.path, tc.token, tc.body)
			require.Equal(t, tc.code, code, e.Message)
			require.Equal(t, tc.errCode, e.Code)
			require.NotContains(t, e.Message, hTok, "tokens never come back")
		})
	}

	t.Run("rate limit", func(t *testing.T) {
		limited := false
		for i := 0; i < 60 && !limited; i++ {
			_, err := h.c.Instructions(ctx, h.ns, h.id, agentwire.InstructionsRequest{Time: time.Now()})
			limited = agentclient.IsStatus(err, http.StatusTooManyRequests)
		}
		require.True(t, limited, "a host hammering the API is slowed down")
	})

	t.Run("deleted InfraEnv is gone", func(t *testing.T) {
		ie2 := infraEnv(t, nil)
		h2 := register(t, ie2, 8)
		require.NoError(t, s.Client.Delete(ctx, ie2))
		require.Eventually(t, func() bool {
			_, err := h2.c.Instructions(ctx, h2.ns, h2.id, agentwire.InstructionsRequest{Time: time.Now()})
			return agentclient.IsCode(err, agentwire.CodeInfraEnvGone) || agentclient.IsStatus(err, http.StatusNotFound)
		}, 10*time.Second, 100*time.Millisecond)
		_, err := h2.c.Register(ctx, h2.cfg.InfraEnv, h2.cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: h2.cfg.InfraEnv.UID, HostID: stack.HostID(9), Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(9)}}})
		require.True(t, agentclient.IsStatus(err, http.StatusGone), "%v", err)
		require.True(t, agentclient.IsCode(err, agentwire.CodeInfraEnvGone))
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Hosts holding an InfraEnv's discovery token create at most its cap of
// Agents: past it a new host is refused with 403 AgentCapReached and an
// event on the InfraEnv; hosts that have an Agent register again as usual,
// and room made by deleting an Agent is taken again. Unapproved Agents
// have a lower cap of their own (UnapprovedCapReached), which approving
// one makes room under.
func TestAgentCapPerInfraEnv(t *testing.T) {
	capped := stack.Start(t, stack.Options{MaxAgentsPerInfraEnv: 2, MaxUnapprovedPerInfraEnv: 1})
	ctx := context.Background()
	ie := capped.CreateInfraEnv(t, "cap", "pool", func(ie *v1beta1.InfraEnv) {
		ie.Spec.AgentApproval = &v1beta1.AgentApproval{AutoApprove: true} // only the cap of all Agents applies
	})
	h1 := capped.Register(t, ie, 1)
	capped.Register(t, ie, 2)
	var list v1beta1.AgentList
	require.Eventually(t, func() bool {
		require.NoError(t, capped.Client.List(ctx, &list, client.InNamespace(ie.Namespace)))
		return len(list.Items) == 2
	}, time.Minute, 100*time.Millisecond)
	var err error
	require.Eventually(t, func() bool { // the cache counts both first
		_, err = capped.TryRegister(t, ie, 3)
		return err != nil
	}, time.Minute, 200*time.Millisecond)
	require.ErrorContains(t, err, "403")
	require.ErrorContains(t, err, agentwire.CodeAgentCap)
	require.ErrorContains(t, err, "has 2 Agents, its cap of 2")
	h1.Reregister(t, ie, 1)
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		require.NoError(t, capped.Client.List(ctx, &evs, client.InNamespace(ie.Namespace)))
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "InfraEnv" && ev.Reason == "AgentCapReached" {
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "an AgentCapReached event on the InfraEnv")
	require.NoError(t, capped.Client.Delete(ctx, &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: stack.HostID(2)}}))
	require.Eventually(t, func() bool {
		_, err = capped.TryRegister(t, ie, 3)
		return err == nil
	}, time.Minute, 200*time.Millisecond, "room made is taken again: %v", err)

	manual := capped.CreateInfraEnv(t, "cap-manual", "pool", nil)
	capped.Register(t, manual, 11)
	require.Eventually(t, func() bool { // the cache counts the first
		_, err = capped.TryRegister(t, manual, 12)
		return err != nil
	}, time.Minute, 200*time.Millisecond)
	require.ErrorContains(t, err, "403")
	require.ErrorContains(t, err, agentwire.CodeUnapprovedCap)
	require.ErrorContains(t, err, "has 1 unapproved Agents, its cap of 1")
	first := &v1beta1.Agent{}
	require.NoError(t, capped.Client.Get(ctx, client.ObjectKey{Namespace: manual.Namespace, Name: stack.HostID(11)}, first))
	patch := client.MergeFrom(first.DeepCopy())
	first.Spec.Approved = true
	require.NoError(t, capped.Client.Patch(ctx, first, patch))
	require.Eventually(t, func() bool {
		_, err = capped.TryRegister(t, manual, 12)
		return err == nil
	}, time.Minute, 200*time.Millisecond, "approving one makes room: %v", err)

	// A host registering again through another InfraEnv of its namespace
	// joins it, caps and all: Agents cannot be moved out of one to make
	// room in it.
	full := stack.NewInfraEnv(manual.Namespace, "full")
	full.Spec.AgentApproval = &v1beta1.AgentApproval{AutoApprove: true}
	require.NoError(t, capped.Client.Create(ctx, full))
	full = capped.WaitImage(t, client.ObjectKeyFromObject(full))
	capped.Register(t, full, 21)
	capped.Register(t, full, 22)
	require.Eventually(t, func() bool {
		var in v1beta1.AgentList
		require.NoError(t, capped.Client.List(ctx, &in, client.InNamespace(full.Namespace)))
		n := 0
		for i := range in.Items {
			if lifecycle.Registration(&in.Items[i]).InfraEnvUID == string(full.UID) {
				n++
			}
		}
		return n == 2
	}, time.Minute, 100*time.Millisecond, "both recorded")
	capped.Silence(t, manual.Namespace, stack.HostID(12))
	require.Eventually(t, func() bool {
		_, err = capped.TryRegister(t, full, 12)
		return err != nil && !strings.Contains(err.Error(), agentwire.CodeHostActive)
	}, time.Minute, 200*time.Millisecond, "the move is refused: %v", err)
	require.ErrorContains(t, err, agentwire.CodeAgentCap)
}

// TestWriteBudget: what the agent API writes for one InfraEnv's hosts is
// bounded in bytes per second (a minute's worth at once): a host filling
// it with large inventories is answered 429 WriteBudget with Retry-After,
// and a host of another InfraEnv still has its inventory stored.
func TestWriteBudget(t *testing.T) {
	const perInfraEnv = 16 << 10 // 1 MiB at once, the least burst
	b := stack.Start(t, stack.Options{WriteBudgetPerInfraEnv: perInfraEnv})
	hungry := b.CreateInfraEnv(t, "hungry", "pool", nil)
	other := b.CreateInfraEnv(t, "other", "pool", nil)
	// Three hosts, so that each stays within its own 30 writes' burst
	// while together they write more than the InfraEnv's MiB (each
	// inventory, about 20 KiB stored, is charged about 80: the Agent
	// controller's write after it, and etcd's overhead).
	hosts := []*stack.Host{b.Register(t, hungry, 1), b.Register(t, hungry, 2), b.Register(t, hungry, 3)}
	var err error
	stored := 0
	for i := range 85 {
		inv := stack.LargeServerInventory(time.Now().UTC().Truncate(time.Second))
		inv.Hostname = fmt.Sprintf("hungry-%d", i)
		if err = hosts[i%3].PutInventory(inv); err != nil {
			break
		}
		stored++
	}
	require.ErrorContains(t, err, "429")
	require.ErrorContains(t, err, "WriteBudget")
	require.Greater(t, stored, 5, "a minute's worth went through first")
	o := b.Register(t, other, 4)
	require.NoError(t, o.PutInventory(stack.LargeServerInventory(time.Now().UTC().Truncate(time.Second))), "another InfraEnv's budget is its own")
}

// The identity rule: a second host claiming a registered host's identity
// never gets its token or, once it is bound, its installation; what it
// tried is visible on the Agent.
func TestHostIdentity(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	cfg := s.AgentConfig(t, ie)
	id := stack.HostID(21)
	victim := agentwire.HostIdentity{SystemUUID: id, SerialNumber: "SN-VICTIM-21", MACAddresses: []string{stack.MAC(21), stack.MAC(22)}}
	reg := func(ident agentwire.HostIdentity) (*host, error) {
		c, err := agentclient.New(cfg)
		require.NoError(t, err)
		resp, err := c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: id, Identity: ident})
		if err != nil {
			return nil, err
		}
		c.SetToken(resp.AgentToken)
		return &host{cfg: cfg, c: c, ns: resp.Namespace, id: resp.HostID, token: resp.AgentToken}, nil
	}
	// regAfterSilence registers once the service has seen the Agent's
	// host fall silent.
	regAfterSilence := func(ident agentwire.HostIdentity) (*host, error) {
		s.Silence(t, ie.Namespace, id)
		var h *host
		var err error
		require.Eventually(t, func() bool {
			h, err = reg(ident)
			return !agentclient.IsCode(err, agentwire.CodeHostActive)
		}, 30*time.Second, 100*time.Millisecond)
		return h, err
	}
	real, err := reg(victim)
	require.NoError(t, err)
	realSession := real.token[:strings.LastIndexByte(real.token, '.')]

	// The Agent records the session's ID, never its secret.
	// The Agent records the session's ID, never its secret.
	started := lifecycle.Registration(real.agent(t)).SessionStarted
	recorded := lifecycle.Registration(real.agent(t)).Session
	require.NotEmpty(t, recorded)
	require.NotContains(t, recorded, realSession)

	// No registration continues a live session, not even one showing its
	// secret: a session's token is handed out once. (That an Agent editor
	// cannot choose the session is TestEditorGainsNothing's.)
	c, err := agentclient.New(cfg)
	require.NoError(t, err)
	for _, session := range []string{realSession, strings.Repeat("0", 32), recorded} {
		_, err = c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: id, Identity: victim, Session: session})
		require.True(t, agentclient.IsCode(err, agentwire.CodeHostActive), "%q continues nothing: %v", session, err)
	}
	waitEvent(t, ie.Namespace, id, "SessionRefused")
	require.Equal(t, started, lifecycle.Registration(real.agent(t)).SessionStarted)
	real.beat(t)
	a0 := real.agent(t)
	p0 := client.MergeFrom(a0.DeepCopy())
	a0.Status.Registration.Contested = "" // that attempt is not what this test disputes
	require.NoError(t, s.Client.Status().Patch(ctx, a0, p0))

	// What a PXE request gives away (the UUID, one MAC) is not the host.
	_, err = reg(agentwire.HostIdentity{SystemUUID: id, MACAddresses: []string{stack.MAC(21)}})
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostIDConflict), "%v", err)
	_, err = reg(agentwire.HostIdentity{SystemUUID: id, SerialNumber: "SN-VICTIM-21", MACAddresses: []string{stack.MAC(21)}})
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostIDConflict), "a partial match: %v", err)

	// The whole identity while the host is alive: held off, with no token;
	// the real host heard from afterwards makes the Agent disputed.
	stop := make(chan struct{})
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for {
			_, _ = real.c.Instructions(ctx, real.ns, real.id, agentwire.InstructionsRequest{Time: time.Now()})
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	_, err = reg(victim)
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostActive), "%v", err)
	a := real.waitAgent(t, "was disputed", func(a *v1beta1.Agent) bool {
		return validation(a, "identity-undisputed").Status == v1beta1.ValidationFailure
	})
	close(stop)
	<-beating
	require.Contains(t, validation(a, "identity-undisputed").Message, "two hosts claim to be "+id)
	require.Contains(t, lifecycle.Registration(a).Disputed, "two hosts claim")
	waitEvent(t, ie.Namespace, id, "IdentityConflict")
	real.beat(t) // its session goes on

	// The administrator settles it (agents/status: no tenant can); once
	// the host is silent (it rebooted), a new session begins and the
	// earlier token stops working.
	patch := client.MergeFrom(a.DeepCopy())
	a.Status.Registration.Disputed = ""
	require.NoError(t, s.Client.Status().Patch(ctx, a, patch))
	again, err := regAfterSilence(victim)
	require.NoError(t, err)
	require.NotEqual(t, real.token, again.token)
	_, err = real.c.Instructions(ctx, real.ns, real.id, agentwire.InstructionsRequest{Time: time.Now()})
	require.ErrorContains(t, err, "401")
	again.beat(t)
	again.waitAgent(t, "was undisputed again", func(a *v1beta1.Agent) bool {
		return validation(a, "identity-undisputed").Status == v1beta1.ValidationSuccess
	})

	// Bound to a cluster, the Agent never begins a new session: the
	// registration gets nothing and the Agent's events say so.
	a = again.agent(t)
	patch = client.MergeFrom(a.DeepCopy())
	a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: ie.Namespace, Name: "some-cluster"}
	require.NoError(t, s.Client.Patch(ctx, a, patch))
	_, err = regAfterSilence(victim)
	require.True(t, agentclient.IsCode(err, agentwire.CodeIdentityInDoubt), "%v", err)
	waitEvent(t, ie.Namespace, id, "IdentityInDoubt")
	again.beat(t) // the bound session still works
	require.Equal(t, lifecycle.Registration(again.agent(t)).Session, lifecycle.Registration(a).Session)

	// Not even when its own BareMetalHost's BMC booted it: a boot proof
	// says which BMC booted the host, not that it is the host that was
	// bound.
	bmh, proof := bootedBMH(t, ie.Namespace, "vm21", stack.MAC(21))
	a = again.agent(t)
	patch = client.MergeFrom(a.DeepCopy())
	a.Labels[v1beta1.BMHLabel] = bmh.Name
	require.NoError(t, s.Client.Patch(ctx, a, patch))
	c, err = agentclient.New(cfg)
	require.NoError(t, err)
	s.Silence(t, ie.Namespace, id)
	require.Eventually(t, func() bool {
		_, err = c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: id, Identity: victim,
			BootProof: &agentwire.BootProof{BareMetalHost: bmh.Name, Proof: proof(time.Hour)}})
		return !agentclient.IsCode(err, agentwire.CodeHostActive)
	}, 30*time.Second, 100*time.Millisecond)
	require.True(t, agentclient.IsCode(err, agentwire.CodeIdentityInDoubt), "%v", err)
	again.beat(t)
}

// bootedBMH creates a detached BareMetalHost ns/name and records a boot of
// it as its BMC controller does; proof makes that boot's proof, valid for
// the given time from now.
func bootedBMH(t *testing.T, ns, name, mac string) (*metal3.BareMetalHost, func(time.Duration) string) {
	t.Helper()
	ctx := context.Background()
	nonce := signing.NewBootNonce()
	bmh := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Annotations: map[string]string{"baremetalhost.metal3.io/detached": "", signing.BootNonceAnnotation: nonce}},
		Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: metal3.BMCDetails{Address: "ipmi://198.18.0.9", CredentialsName: "none"}}}
	require.NoError(t, s.Client.Create(ctx, bmh))
	key, err := signing.Ensure(ctx, s.Client, nil, stack.Namespace)
	require.NoError(t, err)
	return bmh, func(valid time.Duration) string {
		return key.BootProof(ns, name, string(bmh.UID), nonce, time.Now().Add(valid))
	}
}

// TestBootProofHoldsForOneBoot: a registration's boot proof counts (the
// Agent records the BareMetalHost that booted it) only for the boot its
// BMC controller recorded last, and only until it expires; a proof read
// later from the BareMetalHost's status, or of an earlier boot, is
// nothing. A proof never outweighs a live session.
func TestBootProofHoldsForOneBoot(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	cfg := s.AgentConfig(t, ie)
	bmh, proof := bootedBMH(t, ie.Namespace, "booted", stack.MAC(81))
	reg := func(n int, p string) (*host, error) {
		c, err := agentclient.New(cfg)
		require.NoError(t, err)
		resp, err := c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: stack.HostID(n),
			Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(n)}}, BootProof: &agentwire.BootProof{BareMetalHost: bmh.Name, Proof: p}})
		if err != nil {
			return nil, err
		}
		c.SetToken(resp.AgentToken)
		return &host{cfg: cfg, c: c, ns: resp.Namespace, id: resp.HostID, token: resp.AgentToken}, nil
	}
	current, expired := proof(time.Hour), proof(-time.Second)
	h, err := reg(81, current)
	require.NoError(t, err)
	require.Equal(t, string(bmh.UID), lifecycle.Registration(h.agent(t)).BootedBy, "the proof of the boot its BMC sent")
	h.beat(t)

	x, err := reg(82, expired)
	require.NoError(t, err)
	require.Empty(t, lifecycle.Registration(x.agent(t)).BootedBy, "an expired proof")

	// The controller boots the host again: the earlier boot's proof is
	// nothing from then on.
	patch := client.MergeFrom(bmh.DeepCopy())
	bmh.Annotations[signing.BootNonceAnnotation] = signing.NewBootNonce()
	require.NoError(t, s.Client.Patch(ctx, bmh, patch))
	n := 83 // the agent API sees the new boot through its cache: a new host each try
	require.Eventually(t, func() bool {
		n++
		y, err := reg(n, current)
		require.NoError(t, err)
		return lifecycle.Registration(y.agent(t)).BootedBy == ""
	}, 10*time.Second, 200*time.Millisecond, "a proof of an earlier boot")

	// A live session is not taken over with a proof, however good.
	c, err := agentclient.New(cfg)
	require.NoError(t, err)
	_, err = c.Register(ctx, cfg.InfraEnv, cfg.RegistrationToken, agentwire.RegisterRequest{InfraEnvUID: cfg.InfraEnv.UID, HostID: stack.HostID(81),
		Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(81)}}, BootProof: &agentwire.BootProof{BareMetalHost: bmh.Name, Proof: current}})
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostActive), "%v", err)
	h.beat(t)
}

// as is a client acting as user, who has only rules in namespace ns (RBAC
// and impersonation, against the real apiserver).
func as(t *testing.T, ns, user string, rules ...rbacv1.PolicyRule) client.Client {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}))
	require.NoError(t, s.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: user}}}))
	cfg := rest.CopyConfig(s.Env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: s.Client.Scheme()})
	require.NoError(t, err)
	return c
}

// TestReaderCannotTakeAHost: an identity that may only get, list and watch
// Agents and InfraEnvs (a view role, a monitoring or backup tool) reads
// everything a host's Agent and its InfraEnv show, the discovery Ignition
// the InfraEnv's status links to included, and still gets no agent token
// and no step of a live host; the Agent's events say a registration was
// refused. The host carries on.
func TestReaderCannotTakeAHost(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	victim := register(t, ie, 71)
	victim.beat(t)

	reader := as(t, ie.Namespace, "agent-reader",
		rbacv1.PolicyRule{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"agents", "infraenvs"}, Verbs: []string{"get", "list", "watch"}})

	// What the reader sees.
	var agents v1beta1.AgentList
	require.Eventually(t, func() bool { return reader.List(ctx, &agents, client.InNamespace(ie.Namespace)) == nil }, 10*time.Second, 100*time.Millisecond, "RBAC applies")
	require.Len(t, agents.Items, 1)
	seen := agents.Items[0]
	var seenIE v1beta1.InfraEnv
	require.NoError(t, reader.Get(ctx, client.ObjectKeyFromObject(ie), &seenIE))
	stolen := s.AgentConfig(t, &seenIE) // the registration token, from the discovery Ignition
	err := reader.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: signing.SecretName}, &corev1.Secret{})
	require.True(t, apierrors.IsForbidden(err), "the reader reads no Secret: %v", err)
	ident := agentwire.HostIdentity{MACAddresses: lifecycle.Registration(&seen).MACAddresses}
	recorded := lifecycle.Registration(&seen).Session
	require.NotEmpty(t, recorded)

	// No token: registering with the whole identity and the session the
	// Agent records is held off like any registration of a live host.
	c, err := agentclient.New(stolen)
	require.NoError(t, err)
	_, err = c.Register(ctx, stolen.InfraEnv, stolen.RegistrationToken, agentwire.RegisterRequest{
		InfraEnvUID: stolen.InfraEnv.UID, HostID: seen.Name, Identity: ident, Session: recorded})
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostActive), "%v", err)
	waitEvent(t, ie.Namespace, seen.Name, "SessionRefused")

	// No step: a token made of what the Agent records is refused before
	// anything is read.
	for _, token := range []string{recorded, recorded + "." + strings.Repeat("A", 43), victim.token[strings.LastIndexByte(victim.token, '.')+1:]} {
		c.SetToken(token)
		_, err = c.Instructions(ctx, seen.Namespace, seen.Name, agentwire.InstructionsRequest{Time: time.Now()})
		require.ErrorContains(t, err, "401", "token %q", token)
	}

	// The host's own session goes on, with its own token.
	victim.beat(t)
	require.Equal(t, recorded, lifecycle.Registration(victim.agent(t)).Session)
}

// TestEditorGainsNothing: an identity that may edit Agents (get, list,
// watch, update, patch; not agents/status, which tenants are never granted)
// changes none of what agentboot decides by. It cannot write the Agent's
// registration record; rewriting the annotations that held it before,
// relabelling the Agent to another InfraEnv and pointing its owner there
// leave the host's session, its record and the InfraEnv it is served
// through as they were; a registration naming a session the editor chose
// gets nothing, and neither does a token made from it.
func TestEditorGainsNothing(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	other := stack.NewInfraEnv(ie.Namespace, "hardware-inventory")
	other.Name = "elsewhere"
	require.NoError(t, s.Client.Create(ctx, other))
	victim := register(t, ie, 72)
	victim.beat(t)
	before := lifecycle.Registration(victim.agent(t))

	editor := as(t, ie.Namespace, "agent-editor",
		rbacv1.PolicyRule{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"agents"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"infraenvs"}, Verbs: []string{"get", "list", "watch"}})

	var a v1beta1.Agent
	require.Eventually(t, func() bool { return editor.Get(ctx, client.ObjectKeyFromObject(victim.agent(t)), &a) == nil }, 10*time.Second, 100*time.Millisecond, "RBAC applies")
	require.NoError(t, editor.Get(ctx, client.ObjectKey{Namespace: other.Namespace, Name: other.Name}, other))

	// The record is out of reach.
	chosen := strings.Repeat("c", 32)
	patch := client.MergeFrom(a.DeepCopy())
	a.Status.Registration.Session = hosts.SessionID(chosen)
	a.Status.Registration.SourceAddresses = []string{"192.0.2.66"}
	a.Status.Registration.InfraEnv, a.Status.Registration.InfraEnvUID = other.Name, string(other.UID)
	err := editor.Status().Patch(ctx, &a, patch)
	require.True(t, apierrors.IsForbidden(err), "an Agent editor writes no status: %v", err)

	// What the editor can write is not what agentboot decides by.
	require.NoError(t, editor.Get(ctx, client.ObjectKeyFromObject(&a), &a))
	patch = client.MergeFrom(a.DeepCopy())
	a.Annotations = map[string]string{
		"agentboot.io/session": hosts.SessionID(chosen), "agentboot.io/session-started": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		"agentboot.io/identity": "chosen", "agentboot.io/booted-by": "some-uid", "agentboot.io/source-addresses": "192.0.2.66",
	}
	a.Labels[v1beta1.InfraEnvNameLabel] = other.Name
	a.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1beta1.GroupVersion.String(), Kind: "InfraEnv", Name: other.Name, UID: other.UID}}
	require.NoError(t, editor.Patch(ctx, &a, patch))
	victim.waitAgent(t, "the edit in the cache", func(a *v1beta1.Agent) bool { return a.Labels[v1beta1.InfraEnvNameLabel] == other.Name })

	victim.beat(t) // served as before, through its own InfraEnv
	stolen := s.AgentConfig(t, ie)
	c, err := agentclient.New(stolen)
	require.NoError(t, err)
	_, err = c.Register(ctx, stolen.InfraEnv, stolen.RegistrationToken, agentwire.RegisterRequest{
		InfraEnvUID: stolen.InfraEnv.UID, HostID: a.Name, Identity: agentwire.HostIdentity{MACAddresses: before.MACAddresses}, Session: chosen})
	require.True(t, agentclient.IsCode(err, agentwire.CodeHostActive), "%v", err)
	c.SetToken(chosen + "." + strings.Repeat("A", 43))
	_, err = c.Instructions(ctx, a.Namespace, a.Name, agentwire.InstructionsRequest{Time: time.Now()})
	require.ErrorContains(t, err, "401")

	after := lifecycle.Registration(victim.agent(t))
	after.Contested = "" // the refused registration above is recorded, as it should be
	require.Equal(t, before, after)
	victim.beat(t)
}

// Rotating an InfraEnv's registration token: new discovery content and
// URLs, the old token registers nothing, registered hosts carry on.
func TestRegistrationTokenRotation(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	oldCfg := s.AgentConfig(t, ie)
	h := register(t, ie, 31)
	patch := client.MergeFrom(ie.DeepCopy())
	ie.Annotations = map[string]string{signing.RotateAnnotation: "2026-11-25"}
	require.NoError(t, s.Client.Patch(ctx, ie, patch))
	rotated := s.WaitCondition(t, client.ObjectKeyFromObject(ie), corev1.ConditionTrue, func(got *v1beta1.InfraEnv) bool {
		return got.Status.ISODownloadURL != ie.Status.ISODownloadURL
	})
	newCfg := s.AgentConfig(t, rotated)
	require.NotEqual(t, oldCfg.RegistrationToken, newCfg.RegistrationToken)

	c, err := agentclient.New(oldCfg)
	require.NoError(t, err)
	req := agentwire.RegisterRequest{InfraEnvUID: oldCfg.InfraEnv.UID, HostID: stack.HostID(32), Identity: agentwire.HostIdentity{MACAddresses: []string{stack.MAC(32)}}}
	_, err = c.Register(ctx, oldCfg.InfraEnv, oldCfg.RegistrationToken, req)
	require.ErrorContains(t, err, "401", "a token of before the rotation")
	_, err = c.Register(ctx, newCfg.InfraEnv, newCfg.RegistrationToken, req)
	require.NoError(t, err)
	h.beat(t) // registered before: unaffected
}

// Once bound, a host cannot rename itself: its name is what it joins its
// cluster as and what its kubelet certificates are approved for.
func TestBoundHostKeepsItsName(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	h := register(t, ie, 41)
	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, stack.FakeInventory("worker-41", stack.MAC(41))))
	h.waitAgent(t, "reported its name", func(a *v1beta1.Agent) bool { return a.Status.Inventory.Hostname == "worker-41" })
	a := h.agent(t)
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Namespace: ie.Namespace, Name: "some-cluster"}
	require.NoError(t, s.Client.Patch(ctx, a, patch))
	// The Agent controller saw the binding, so the agent API's cache has it.
	h.waitAgent(t, "bound", func(a *v1beta1.Agent) bool {
		return condition(a, v1beta1.BoundCondition).Status == corev1.ConditionTrue
	})
	inv := stack.FakeInventory("another-node", stack.MAC(41))
	inv.Memory.PhysicalBytes++ // something else changed too, and is stored
	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, inv))
	got := h.waitAgent(t, "stored the new inventory", func(a *v1beta1.Agent) bool {
		return a.Status.Inventory.Memory.PhysicalBytes == inv.Memory.PhysicalBytes
	})
	require.Equal(t, "worker-41", got.Status.Inventory.Hostname)
	// The address it connects from is recorded: serving certificates are
	// approved only for addresses a host was seen using.
	require.Equal(t, []string{"127.0.0.1"}, lifecycle.Registration(got).SourceAddresses)
}

// Anyone with a discovery token can upload inventories: what is stored per
// Agent is bounded, and a host changing its inventory on every request
// gets its writes limited (30, then one every 5 s), not the apiserver
// filled.
func TestInventoryStorageIsBounded(t *testing.T) {
	ctx := context.Background()
	ie := infraEnv(t, nil)
	h := register(t, ie, 51)
	large := stack.LargeServerInventory(time.Now().UTC().Truncate(time.Second))
	require.NoError(t, h.c.PutInventory(ctx, h.ns, h.id, large), "a large 2-socket server's inventory is stored")
	huge := stack.LargeServerInventory(time.Now().UTC().Truncate(time.Second))
	for i := range 300 {
		d := huge.Disks[0]
		d.ID = fmt.Sprintf("%s-%d", d.ID, i)
		huge.Disks = append(huge.Disks, d)
	}
	err := h.c.PutInventory(ctx, h.ns, h.id, huge)
	require.ErrorContains(t, err, "400")
	require.ErrorContains(t, err, "more than the 65536 kept per Agent")

	// Every upload a change: after the burst, 429s and no writes.
	var limited error
	stored := 0
	for i := range 40 {
		inv := stack.FakeInventory("h51", stack.MAC(51))
		inv.Memory.PhysicalBytes += int64(i + 1)
		time.Sleep(550 * time.Millisecond) // under the request rate: only writes are limited
		if err := h.c.PutInventory(ctx, h.ns, h.id, inv); err != nil {
			limited = err
			break
		}
		stored++
	}
	require.Error(t, limited, "40 changed inventories in 22 s were all written")
	require.ErrorContains(t, limited, "429")
	require.GreaterOrEqual(t, stored, 28, "the burst is stored")
}

// The agent service's one face checks what it is asked for before it adds
// anything to the manager.
func TestSetupChecksConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  agentservice.Config
		want string
	}{
		"nothing asked for": {agentservice.Config{}, "neither the controller nor the API (Addr) is asked for"},
		"API without keys":  {agentservice.Config{Addr: ":7443", TLSCertFile: "c", TLSKeyFile: "k"}, "Keys are required"},
		"API without TLS":   {agentservice.Config{Addr: ":7443", Keys: &signing.Keeper{}}, "HTTPS only and needs a certificate and key"},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorContains(t, agentservice.SetupWithManager(nil, tc.cfg), tc.want)
		})
	}
}
