package bmc_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/poolmetrics"
	"github.com/agentboot/agentboot/internal/signing"
	"github.com/agentboot/agentboot/test/bmcsim"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// Its stacks take turns on one control plane.
func TestMain(m *testing.M) { stack.Main(m) }

const password = "s3cret-Pa55"

// fast keeps the controller's timing short enough for tests; the shape
// (backoff, polling, re-sends) is the production one.
var fast = bmc.Config{
	CallTimeout: 3 * time.Second, MediaTimeout: 3 * time.Second,
	PowerPoll: 200 * time.Millisecond, PowerTimeout: 3 * time.Second, Resync: 2 * time.Second,
	SoftPowerOffTimeout: 5 * time.Second, EjectOnDeleteTimeout: 3 * time.Second,
	BackoffBase: 200 * time.Millisecond, BackoffCap: 2 * time.Second,
}

type env struct {
	*stack.Stack
	t      *testing.T
	ns     string
	ie     *v1beta1.InfraEnv
	passes *testenv.Passes
}

func start(t *testing.T) *env {
	return startWith(t, fast, true)
}

func startWith(t *testing.T, cfg bmc.Config, isoOverHTTP bool) *env {
	passes := testenv.NewPasses()
	cfg.Passes = passes.Observe
	s := stack.Start(t, stack.Options{BMC: cfg, ISOOverHTTP: isoOverHTTP})
	e := &env{Stack: s, t: t, ie: s.CreateInfraEnv(t, "bmc", "lab", nil), passes: passes}
	e.ns = e.ie.Namespace
	e.secret("bmc-secret", "admin", password)
	return e
}

// settle waits until the controller has looked at h again since now (two
// passes): what did not happen by then is not going to happen on its own.
func (e *env) settle(t testing.TB, h *metal3.BareMetalHost) {
	t.Helper()
	e.passes.Settle(t, client.ObjectKeyFromObject(h))
}

func (e *env) secret(name, user, pass string) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		StringData: map[string]string{"username": user, "password": pass}}
	require.NoError(e.t, e.Client.Create(context.Background(), s))
}

func (e *env) host(name, addr string, n int, mutate ...func(*metal3.BareMetalHost)) *metal3.BareMetalHost {
	h := &metal3.BareMetalHost{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: map[string]string{v1beta1.InfraEnvNameLabel: e.ie.Name}},
		Spec: metal3.BareMetalHostSpec{Online: true, BootMACAddress: strings.ToUpper(stack.MAC(n)),
			BMC: metal3.BMCDetails{Address: addr, CredentialsName: "bmc-secret"}},
	}
	for _, m := range mutate {
		m(h)
	}
	require.NoError(e.t, e.Client.Create(context.Background(), h))
	return h
}

// media is the URL the controller inserts for host h, as waitEvents
// matches it: iso with a boot proof for this BareMetalHost (each boot has
// its own; requireProof checks one).
func (e *env) media(h *metal3.BareMetalHost, iso string) string {
	return iso + "&bmh=" + h.Name + "&proof=*"
}

// requireProof checks that media carries a boot proof only the manager's
// key makes, for host h and the boot its controller recorded last.
func (e *env) requireProof(h *metal3.BareMetalHost, media string) {
	e.t.Helper()
	ctx := context.Background()
	got := &metal3.BareMetalHost{}
	require.NoError(e.t, e.Client.Get(ctx, client.ObjectKeyFromObject(h), got))
	key, err := signing.Ensure(ctx, e.Client, nil, stack.Namespace)
	require.NoError(e.t, err)
	_, proof, ok := strings.Cut(media, "&proof=")
	require.True(e.t, ok, "no proof in %s", media)
	nonce, err := key.CheckBootProof(proof, got.Namespace, got.Name, string(got.UID), time.Now())
	require.NoError(e.t, err)
	require.Equal(e.t, got.Annotations[signing.BootNonceAnnotation], nonce, "the proof is of the boot the controller recorded")
}

// wait polls the host until ok holds, and fails with its last status.
func (e *env) wait(h *metal3.BareMetalHost, what string, ok func(*metal3.BareMetalHost) bool) *metal3.BareMetalHost {
	e.t.Helper()
	return e.waitT(e.t, h, what, ok)
}

// waitT is wait reporting to t (a subtest's).
func (e *env) waitT(t testing.TB, h *metal3.BareMetalHost, what string, ok func(*metal3.BareMetalHost) bool) *metal3.BareMetalHost {
	t.Helper()
	got := &metal3.BareMetalHost{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); <-tick.C {
		if err := e.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got); err == nil && ok(got) {
			return got
		}
	}
	t.Fatalf("BareMetalHost %s never %s; status: %+v", h.Name, what, got.Status)
	return nil
}

func state(s metal3.ProvisioningState) func(*metal3.BareMetalHost) bool {
	return func(h *metal3.BareMetalHost) bool {
		return h.Status.Provisioning.State == s && h.Status.ErrorType == ""
	}
}

func errorContains(t metal3.ErrorType, sub string) func(*metal3.BareMetalHost) bool {
	return func(h *metal3.BareMetalHost) bool {
		return h.Status.OperationalStatus == metal3.OperationalStatusError && h.Status.ErrorType == t && strings.Contains(h.Status.ErrorMessage, sub)
	}
}

func redfish(t *testing.T) (*bmcsim.Redfish, *bmcsim.MemMachine, string) {
	m := &bmcsim.MemMachine{}
	r := &bmcsim.Redfish{User: "admin", Password: password, Machine: m}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	t.Cleanup(r.Close)
	return r, m, strings.TrimPrefix(srv.URL, "http://")
}

func waitEvents(t *testing.T, events func() []string, want ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := events()
		i := 0
		for _, g := range got {
			if i == len(want) {
				break
			}
			// A want ending in "*" matches by prefix (a boot proof).
			if prefix, ok := strings.CutSuffix(want[i], "*"); g == want[i] || ok && strings.HasPrefix(g, prefix) {
				i++
			}
		}
		return i == len(want)
	}, 30*time.Second, 100*time.Millisecond, "want events %q in order", want)
}

func TestRedfishVirtualMediaLifecycle(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	sim, m, hostport := redfish(t)
	h := e.host("vm1", "redfish-virtualmedia+http://"+hostport+"/redfish/v1/Systems/1", 1, func(h *metal3.BareMetalHost) {
		h.Annotations = map[string]string{metal3.HostnameAnnotation: "worker-1.example", metal3.RoleAnnotation: "worker"}
		h.Spec.RootDeviceHints = &metal3.RootDeviceHints{MinSizeGigabytes: 100, Rotational: new(false)}
	})

	// Registered, then the ISO is mounted, a one-time CD boot set and the
	// host powered on.
	got := e.wait(h, "provisioned", state(metal3.StateProvisioned))
	require.Equal(t, e.ie.Status.ISODownloadURL, got.Status.Provisioning.Image.URL)
	require.Equal(t, metal3.OperationalStatusOK, got.Status.OperationalStatus)
	media := e.media(h, e.ie.Status.ISODownloadURL)
	waitEvents(t, sim.Events, "insert "+media, "boot-override Cd Once", "power on cdrom")
	e.requireProof(h, sim.Image())
	require.True(t, m.On())
	e.wait(h, "powered on", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })

	// A host reporting the boot MAC is no evidence: without the proof the
	// inserted ISO carries, its Agent is matched but not approved.
	impostor := e.Register(t, e.ie, 1)
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		require.NoError(t, e.Client.List(ctx, &evs, client.InNamespace(e.ns)))
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "vm1" && ev.Reason == "AgentNotApproved" && strings.Contains(ev.Note, "no proof that it booted the ISO this host's BMC inserted") {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "an AgentNotApproved event")
	var unproven v1beta1.Agent
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: impostor.NS, Name: impostor.ID}, &unproven))
	require.False(t, unproven.Spec.Approved)
	require.NoError(t, e.Client.Delete(ctx, &unproven))
	// Nor is a proof made up, or another BareMetalHost's.
	forged := strings.Replace(sim.Image(), "&proof=", "&proof=AAAA", 1)
	impostor = e.RegisterBooted(t, e.ie, 1, forged)
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: impostor.NS, Name: impostor.ID}, &unproven))
	require.Empty(t, lifecycle.Registration(&unproven).BootedBy)
	e.settle(t, h)
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: impostor.NS, Name: impostor.ID}, &unproven))
	require.False(t, unproven.Spec.Approved)
	require.NoError(t, e.Client.Delete(ctx, &unproven))

	// Another host keeps reporting the boot MAC; that does not stop the
	// one with the proof.
	squatter := e.Register(t, e.ie, 2)
	require.NoError(t, squatter.PutInventory(stack.FakeInventory("squatter", stack.MAC(1))))

	// The host registers from the ISO its BMC inserted: its Agent is
	// approved with the host's hostname, role and disk, and the host gets
	// a hardware summary. The time from the boot is counted.
	counted := func() float64 {
		n, _ := stack.Metric(t, "agentboot_agent_phase_seconds", map[string]string{"phase": poolmetrics.PhaseBootToRegistered})
		return n
	}
	before := counted()
	genuine := e.RegisterBooted(t, e.ie, 1, sim.Image())
	var agent v1beta1.Agent
	require.Eventually(t, func() bool {
		return e.Client.Get(ctx, client.ObjectKey{Namespace: genuine.NS, Name: genuine.ID}, &agent) == nil &&
			agent.Labels[v1beta1.BMHLabel] == "vm1" && agent.Spec.Approved
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "worker-1.example", agent.Spec.Hostname)
	require.Equal(t, before+1, counted(), "boot_to_registered counted once, for the proven session")
	var squatted v1beta1.Agent
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: squatter.NS, Name: squatter.ID}, &squatted))
	require.False(t, squatted.Spec.Approved, "reporting the MAC is not enough")
	require.Empty(t, squatted.Labels[v1beta1.BMHLabel], "and it is not the host's Agent")
	require.Equal(t, v1beta1.AgentRoleWorker, agent.Spec.Role)
	require.Equal(t, "/dev/disk/by-id/virtio-disk0", agent.Spec.InstallationDiskID)
	got = e.wait(h, "given hardware details", func(h *metal3.BareMetalHost) bool { return h.Status.HardwareDetails != nil })
	require.Equal(t, 16384, got.Status.HardwareDetails.RAMMebibytes)
	require.Equal(t, 4, got.Status.HardwareDetails.CPU.Count)
	require.Equal(t, stack.MAC(1), got.Status.HardwareDetails.NIC[0].MAC)

	// Bound and installed: the CD is ejected and the next boot is the disk.
	// Merge patches: the controllers write the Agent too.
	patch := client.MergeFrom(agent.DeepCopy())
	agent.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Name: "vcluster2", Namespace: "clusters-vcluster2"}
	require.NoError(t, e.Client.Patch(ctx, &agent, patch))
	patch = client.MergeFrom(agent.DeepCopy())
	agent.Status.Progress.CurrentStage = v1beta1.StageRebooting
	agent.Status.Progress.InstallationPercentage = 100
	require.NoError(t, e.Client.Status().Patch(ctx, &agent, patch))
	waitEvents(t, sim.Events, "eject", "boot-override Hdd Once")
	e.wait(h, "cleared its image", func(h *metal3.BareMetalHost) bool { return h.Status.Provisioning.Image.URL == "" })
	require.Empty(t, sim.Image())
	// An installed host that loses power is powered on from its disk,
	// never booted into discovery.
	require.NoError(t, m.PowerOff())
	waitEvents(t, sim.Events, "eject", "boot-override Hdd Once", "power on default")
	require.Empty(t, sim.Image())
	require.True(t, m.On())

	// Released from its cluster: back into discovery through the BMC, and
	// the Agent says so until the host registers again.
	patch = client.MergeFrom(agent.DeepCopy())
	agent.Spec.ClusterDeploymentName = nil
	require.NoError(t, e.Client.Patch(ctx, &agent, patch))
	waitEvents(t, sim.Events, "boot-override Hdd Once", "insert "+media, "boot-override Cd Once")
	e.wait(h, "booted discovery again", func(h *metal3.BareMetalHost) bool {
		return h.Status.Provisioning.Image.URL == e.ie.Status.ISODownloadURL
	})
	require.Eventually(t, func() bool {
		require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(&agent), &agent))
		c := conditions.Find(agent.Status.Conditions, v1beta1.BoundCondition)
		return c != nil && c.Reason == v1beta1.UnbindingReason && agent.Status.DebugInfo.State == "unbinding"
	}, 30*time.Second, 100*time.Millisecond, "%+v", agent.Status.Conditions)

	// online: false powers it off, and it stays off.
	require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(h), got))
	got.Spec.Online = false
	require.NoError(t, e.Client.Update(ctx, got))
	e.wait(h, "powered off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
	require.False(t, m.On())
	require.Equal(t, metal3.StateProvisioned, got.Status.Provisioning.State)
}

// A host that loses power while it runs discovery (its Agent perhaps
// erasing its disks, or writing its installation) boots discovery again:
// its default device might be a half-erased or half-written disk.
func TestPowerLossInDiscoveryBootsDiscoveryAgain(t *testing.T) {
	e := start(t)
	sim, m, hostport := redfish(t)
	h := e.host("cut", "redfish-virtualmedia+http://"+hostport, 3)
	e.wait(h, "provisioned", state(metal3.StateProvisioned))
	media := e.media(h, e.ie.Status.ISODownloadURL)
	waitEvents(t, sim.Events, "insert "+media, "boot-override Cd Once", "power on cdrom")
	e.wait(h, "powered on", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })

	require.NoError(t, m.PowerOff()) // the power cut: no request went through the BMC
	waitEvents(t, sim.Events, "insert "+media, "boot-override Cd Once", "power on cdrom", "boot-override Cd Once", "power on cdrom")
	requireEvent(t, e, "cut", "found powered off while running discovery")
	boots := m.Boots()
	require.Len(t, boots, 2)
	require.True(t, strings.HasPrefix(boots[1], "cdrom "), "the discovery ISO again, not the disk: %q", boots)
	e.wait(h, "provisioned again", func(h *metal3.BareMetalHost) bool {
		return state(metal3.StateProvisioned)(h) && h.Status.PoweredOn && h.Status.Provisioning.Image.URL == e.ie.Status.ISODownloadURL
	})

	// Powered off on purpose, it stays off; online again, it is powered
	// on as it always was (its default device): no power was lost.
	got := e.wait(h, "read", func(*metal3.BareMetalHost) bool { return true })
	got.Spec.Online = false
	require.NoError(t, e.Client.Update(context.Background(), got))
	e.wait(h, "powered off", func(h *metal3.BareMetalHost) bool { return !h.Status.PoweredOn })
	e.settle(t, h)
	require.False(t, m.On(), "powered on against online: false")
	require.Len(t, m.Boots(), 2)
	got = e.wait(h, "read", func(*metal3.BareMetalHost) bool { return true })
	got.Spec.Online = true
	require.NoError(t, e.Client.Update(context.Background(), got))
	require.Eventually(t, func() bool { return len(m.Boots()) == 3 }, 30*time.Second, 100*time.Millisecond)
	require.True(t, strings.HasPrefix(m.Boots()[2], " "), "the default device: %q", m.Boots())
}

// The administrator's disks to keep and request for a wipe, written on the
// BareMetalHost (which holds the server's BMC credentials), reach the host's Agent; the
// request waits while the Agent is bound and is consumed once recorded.
func TestDiskAnnotations(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	sim, _, hostport := redfish(t)
	h := e.host("disks", "redfish-virtualmedia+http://"+hostport, 4)
	e.wait(h, "provisioned", state(metal3.StateProvisioned))
	genuine := e.RegisterBooted(t, e.ie, 4, sim.Image())
	agent := &v1beta1.Agent{}
	key := client.ObjectKey{Namespace: genuine.NS, Name: genuine.ID}
	agentHas := func(what string, ok func(*v1beta1.AgentDiskSanitization) bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			return e.Client.Get(ctx, key, agent) == nil && agent.Spec.Approved && agent.Status.DiskSanitization != nil && ok(agent.Status.DiskSanitization)
		}, 30*time.Second, 100*time.Millisecond, "the Agent never %s: %+v", what, agent.Status.DiskSanitization)
	}
	annotate := func(kv ...string) {
		t.Helper()
		got := &metal3.BareMetalHost{}
		require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(h), got))
		patch := client.MergeFrom(got.DeepCopy())
		for i := 0; i < len(kv); i += 2 {
			got.Annotations[kv[i]] = kv[i+1]
		}
		require.NoError(t, e.Client.Patch(ctx, got, patch))
	}
	hostAnnotation := func(k string) (string, bool) {
		got := &metal3.BareMetalHost{}
		require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(h), got))
		v, ok := got.Annotations[k]
		return v, ok
	}

	annotate("agentboot.io/sanitize-keep", " /dev/disk/by-id/wwn-0x5000c500a1b2c3d4 ,ZA1B2C3D,,ZA1B2C3D")
	agentHas("got the disks to keep", func(ds *v1beta1.AgentDiskSanitization) bool {
		return slices.Equal(ds.Keep, []string{"/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "ZA1B2C3D"})
	})
	require.Empty(t, agent.Status.DiskSanitization.Required, "keeping disks asks for no wipe")

	// Bound: the request waits.
	patch := client.MergeFrom(agent.DeepCopy())
	agent.Spec.ClusterDeploymentName = &v1beta1.ClusterReference{Name: "vcluster2", Namespace: "clusters-vcluster2"}
	require.NoError(t, e.Client.Patch(ctx, agent, patch))
	annotate("agentboot.io/sanitize-disks", "metadata")
	e.settle(t, h)
	require.NoError(t, e.Client.Get(ctx, key, agent))
	require.Empty(t, agent.Status.DiskSanitization.Required, "a bound host is not asked to wipe its disks")
	_, pending := hostAnnotation("agentboot.io/sanitize-disks")
	require.True(t, pending, "the request stays until it is recorded")

	// Unbound: recorded, and the annotation is consumed.
	require.NoError(t, e.Client.Get(ctx, key, agent))
	patch = client.MergeFrom(agent.DeepCopy())
	agent.Spec.ClusterDeploymentName = nil
	require.NoError(t, e.Client.Patch(ctx, agent, patch))
	agentHas("owed the requested wipe", func(ds *v1beta1.AgentDiskSanitization) bool {
		return ds.Required == "metadata" && ds.State == v1beta1.SanitizationPending
	})
	require.Equal(t, "requested by an administrator on BareMetalHost disks", agent.Status.DiskSanitization.Reason)
	require.Eventually(t, func() bool { _, ok := hostAnnotation("agentboot.io/sanitize-disks"); return !ok }, 30*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		return e.Client.Get(ctx, key, agent) == nil && strings.Contains(conditions.Find(agent.Status.Conditions, v1beta1.ValidatedCondition).Message, "disks must be sanitized")
	}, 30*time.Second, 100*time.Millisecond, "the Agent is not Validated while it owes the wipe: %+v", agent.Status.Conditions)

	// A stronger request raises the level; a bad one is refused, saying so.
	annotate("agentboot.io/sanitize-disks", "erase")
	agentHas("owed the stronger wipe", func(ds *v1beta1.AgentDiskSanitization) bool { return ds.Required == "erase" })
	annotate("agentboot.io/sanitize-disks", "shred")
	requireEvent(t, e, "disks", `annotation agentboot.io/sanitize-disks: "shred": want metadata or erase`)
	annotate("agentboot.io/sanitize-keep", "/dev/sdb /dev/sdc")
	requireEvent(t, e, "disks", "the host's next sanitization waits until it is corrected")
	agentHas("held by the invalid keep list", func(ds *v1beta1.AgentDiskSanitization) bool {
		return slices.Equal(ds.Keep, []string{"/dev/sdb /dev/sdc"})
	})
	require.Equal(t, "erase", agent.Status.DiskSanitization.Required)
}

func TestChangedImageReboots(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	sim, _, hostport := redfish(t)
	h := e.host("vm2", "redfish-virtualmedia+http://"+hostport, 2)
	e.wait(h, "provisioned", state(metal3.StateProvisioned))
	first := e.ie.Status.ISODownloadURL

	// A new SSH key is a new image: the host gets it and reboots.
	require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(e.ie), e.ie))
	e.ie.Spec.SSHAuthorizedKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB7QqAcYC1t0VkqXnqL0gbqA4RUmlcXHc3B0tTK0UX7T new@example"
	require.NoError(t, e.Client.Update(ctx, e.ie))
	got := e.wait(h, "given the new image", func(h *metal3.BareMetalHost) bool {
		return h.Status.Provisioning.Image.URL != "" && h.Status.Provisioning.Image.URL != first
	})
	waitEvents(t, sim.Events, "insert "+e.media(h, first), "power on cdrom", "insert "+e.media(h, got.Status.Provisioning.Image.URL), "boot-override Cd Once", "power off", "power on cdrom")
}

func TestIPMIBootsFromNetwork(t *testing.T) {
	e := start(t)
	m := &bmcsim.MemMachine{}
	port := freeUDPPort(t)
	// Power takes time, as on a server: the BMC reports the old state until
	// the new one is reached.
	sim := bmcsim.StartIPMI(t, bmcsim.IPMIOptions{User: "admin", Password: password, Port: port, Machine: m, Timing: bmcsim.Timing{
		PowerOn: bmcsim.Span{Min: 300 * time.Millisecond, Max: time.Second}, PowerOff: bmcsim.Span{Min: 300 * time.Millisecond, Max: time.Second},
		Shutdown: bmcsim.Span{Min: 300 * time.Millisecond, Max: time.Second},
	}})
	h := e.host("ipmi1", fmt.Sprintf("ipmi://127.0.0.1:%d", port), 3)
	e.wait(h, "provisioned", state(metal3.StateProvisioned))
	waitEvents(t, sim.Events, "boot pxe", "power on pxe")
	e.wait(h, "powered on", func(h *metal3.BareMetalHost) bool { return h.Status.PoweredOn })
	ctx := context.Background()

	// Network boot is weaker evidence (docs/bmc.md): the first host to
	// report the boot MAC after the boot is matched and approved, and one
	// reporting it after that is neither; the host's events say the match
	// is ambiguous. (Whether 31 is the server cannot be told: prefer
	// virtual media where the boot network is not trusted.)
	first := e.Register(t, e.ie, 31)
	require.NoError(t, first.PutInventory(stack.FakeInventory("claimant-31", stack.MAC(3))))
	matched := &v1beta1.Agent{}
	require.Eventually(t, func() bool {
		return e.Client.Get(ctx, client.ObjectKey{Namespace: first.NS, Name: first.ID}, matched) == nil && matched.Labels[v1beta1.BMHLabel] == "ipmi1" && matched.Spec.Approved
	}, 30*time.Second, 100*time.Millisecond, "the first to report the MAC after the boot is matched")
	second := e.Register(t, e.ie, 32)
	require.NoError(t, second.PutInventory(stack.FakeInventory("claimant-32", stack.MAC(3))))
	requireEvent(t, e, "ipmi1", "2 Agents report boot MAC "+stack.MAC(3))
	late := &v1beta1.Agent{}
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: second.NS, Name: second.ID}, late))
	require.Empty(t, late.Labels[v1beta1.BMHLabel])
	require.False(t, late.Spec.Approved)

	// An outage of the BMC is an error while it lasts, then forgotten.
	sim.Stop()
	got := &metal3.BareMetalHost{}
	require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(h), got))
	got.Spec.Online = false
	require.NoError(t, e.Client.Update(ctx, got))
	e.wait(h, "reporting the outage", errorContains(metal3.PowerManagementError, "127.0.0.1"))
	require.NoError(t, sim.Start())
	e.wait(h, "powered off after the outage", func(h *metal3.BareMetalHost) bool {
		return !h.Status.PoweredOn && h.Status.ErrorType == "" && h.Status.Provisioning.State == metal3.StateProvisioned
	})
	require.False(t, m.On())
}

func TestRedfishFaultsRecover(t *testing.T) {
	e := start(t)
	sim, m, hostport := redfish(t)
	sim.SetFaults(bmcsim.Faults{DropBootOverride: true})
	h := e.host("flaky", "redfish-virtualmedia+http://"+hostport, 4)
	e.wait(h, "reporting the dropped override", errorContains(metal3.ProvisioningError, "kept"))
	require.False(t, m.On(), "a host whose boot override was dropped must not be booted")

	sim.SetFaults(bmcsim.Faults{ServerErrors: true})
	e.wait(h, "reporting the 500s", errorContains(metal3.PowerManagementError, "simulated internal error"))
	sim.SetFaults(bmcsim.Faults{Delay: 5 * time.Second})
	e.wait(h, "reporting the timeout", func(h *metal3.BareMetalHost) bool {
		return h.Status.ErrorType != "" && (strings.Contains(h.Status.ErrorMessage, "deadline") || strings.Contains(h.Status.ErrorMessage, "Timeout"))
	})
	sim.SetFaults(bmcsim.Faults{Unreachable: true})
	e.wait(h, "reporting the unreachable BMC", func(h *metal3.BareMetalHost) bool {
		return h.Status.ErrorType != "" && strings.Contains(h.Status.ErrorMessage, "EOF")
	})
	sim.SetFaults(bmcsim.Faults{})
	e.wait(h, "provisioned", state(metal3.StateProvisioned))
	require.True(t, m.On())
}

func TestBadInput(t *testing.T) {
	e := start(t)
	_, _, hostport := redfish(t)
	e.secret("wrong", "admin", "not-the-password")
	e.secret("partial", "admin", "")
	closed := closedPort(t)
	ipmiPort := freeUDPPort(t)
	bmcsim.StartIPMI(t, bmcsim.IPMIOptions{User: "admin", Password: password, Port: ipmiPort, Machine: &bmcsim.MemMachine{}})
	cases := []struct {
		name, addr, secret string
		errType            metal3.ErrorType
		want               string
	}{
		{"scheme", "libvirt://10.0.0.1", "bmc-secret", metal3.RegistrationError, `unknown BMC address scheme "libvirt"`},
		{"address", "redfish://bmc:99999", "bmc-secret", metal3.RegistrationError, `port "99999" is not 1-65535`},
		{"secret", "redfish+http://" + hostport, "missing", metal3.RegistrationError, "credentials Secret " + e.ns + "/missing not found"},
		{"keys", "redfish+http://" + hostport, "partial", metal3.RegistrationError, "needs non-empty keys username and password"},
		{"password", "redfish+http://" + hostport, "wrong", metal3.RegistrationError, "the BMC rejected the username or password"},
		{"ipmi-password", fmt.Sprintf("ipmi://127.0.0.1:%d", ipmiPort), "wrong", metal3.RegistrationError, "no IPMI session"},
		{"unreachable", "redfish+http://" + closed, "bmc-secret", metal3.RegistrationError, "connection refused"},
	}
	// Every host at once: the controller retries them side by side, and
	// the 4 s over which retries are counted are waited once.
	hosts := make([]*metal3.BareMetalHost, len(cases))
	for i, tc := range cases {
		hosts[i] = e.host("bad-"+tc.name, tc.addr, 10+i, func(h *metal3.BareMetalHost) { h.Spec.BMC.CredentialsName = tc.secret })
	}
	before := make([]int, len(cases))
	since := make([]time.Time, len(cases))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := e.waitT(t, hosts[i], "reporting "+tc.name, errorContains(tc.errType, tc.want))
			require.NotContains(t, got.Status.ErrorMessage, password)
			require.NotContains(t, got.Status.ErrorMessage, "not-the-password")
			require.Equal(t, metal3.StateRegistering, got.Status.Provisioning.State)
			before[i], since[i] = got.Status.ErrorCount, time.Now()
		})
	}
	for i, tc := range cases {
		t.Run("backoff-"+tc.name, func(t *testing.T) {
			t.Parallel() // each waits for its host's passes, seconds apart
			require.False(t, since[i].IsZero(), "%s never reported its error", tc.name)
			// Retried with backoff, not in a hot loop: each failed pass
			// asks to be looked at again no sooner than the backoff (a
			// 200ms base, doubling per error to a 2s cap, ±20%), and no
			// pass is retried at once through an error.
			passes := e.passes.Await(t, e.passes.Mark(client.ObjectKeyFromObject(hosts[i])), 3)
			got := e.waitT(t, hosts[i], "still failing", errorContains(tc.errType, tc.want))
			// (A pass that found the cache behind its own write asked
			// no BMC, and is not told.)
			for _, p := range passes {
				require.NoError(t, p.Err)
				floor := min(fast.BackoffBase<<min(before[i], 10), fast.BackoffCap) * 8 / 10
				require.GreaterOrEqual(t, p.Result.RequeueAfter, floor, "a failed pass retried sooner than its backoff")
			}
			require.Greater(t, got.Status.ErrorCount, before[i], "still trying")
			requireEvent(t, e, hosts[i].Name, tc.want)
		})
	}
}

func TestDeletion(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	_, keep, addrKeep := redfish(t)
	_, off, addrOff := redfish(t)
	hKeep := e.host("keep", "redfish+http://"+addrKeep, 30)
	hOff := e.host("off", "redfish+http://"+addrOff, 31, func(h *metal3.BareMetalHost) {
		h.Annotations = map[string]string{"agentboot.io/power-off-on-delete": "true"}
	})
	e.wait(hKeep, "provisioned", state(metal3.StateProvisioned))
	e.wait(hOff, "provisioned", state(metal3.StateProvisioned))
	require.True(t, keep.On())
	require.True(t, off.On())
	for _, h := range []*metal3.BareMetalHost{hKeep, hOff} {
		require.NoError(t, e.Client.Delete(ctx, h))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(e.Client.Get(ctx, client.ObjectKeyFromObject(h), &metal3.BareMetalHost{}))
		}, 30*time.Second, 100*time.Millisecond, "%s not deleted", h.Name)
	}
	require.True(t, keep.On(), "deleting a BareMetalHost powered the server off without being asked to")
	require.False(t, off.On())
}

func TestDetachedAndPaused(t *testing.T) {
	e := start(t)
	_, m, hostport := redfish(t)
	h := e.host("detached", "redfish+http://"+hostport, 40, func(h *metal3.BareMetalHost) {
		h.Annotations = map[string]string{"baremetalhost.metal3.io/detached": ""}
	})
	e.wait(h, "detached", func(h *metal3.BareMetalHost) bool {
		return h.Status.OperationalStatus == metal3.OperationalStatusDetached
	})
	e.settle(t, h)
	require.False(t, m.On(), "a detached host was powered on")
}

func requireEvent(t *testing.T, e *env, name, sub string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		if err := e.Client.List(context.Background(), &evs, client.InNamespace(e.ns)); err != nil {
			return false
		}
		return slices.ContainsFunc(evs.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Name == name && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Note, sub)
		})
	}, 10*time.Second, 100*time.Millisecond, "no warning event on %s mentioning %q", name, sub)
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestOutageDuringEnrollment(t *testing.T) {
	e := start(t)
	sim, m, hostport := redfish(t)
	var once sync.Once
	sim.Hook = func(ev string) {
		if strings.HasPrefix(ev, "insert ") {
			once.Do(func() {
				sim.SetFaults(bmcsim.Faults{Unreachable: true})
				time.AfterFunc(3*time.Second, func() { sim.SetFaults(bmcsim.Faults{}) })
			})
		}
	}
	h := e.host("outage", "redfish-virtualmedia+http://"+hostport, 50)
	e.wait(h, "reporting the outage", func(h *metal3.BareMetalHost) bool { return h.Status.ErrorType != "" })
	got := e.wait(h, "provisioned", state(metal3.StateProvisioned))
	require.Equal(t, metal3.OperationalStatusOK, got.Status.OperationalStatus)
	require.True(t, m.On())
	media := e.media(h, e.ie.Status.ISODownloadURL)
	waitEvents(t, sim.Events, "insert "+media, "eject", "insert "+media, "boot-override Cd Once", "power on cdrom")
}

func TestTLSVerification(t *testing.T) {
	e := start(t)
	sim := &bmcsim.Redfish{User: "admin", Password: password, Machine: &bmcsim.MemMachine{}}
	srv := httptest.NewTLSServer(sim)
	t.Cleanup(srv.Close)
	addr := "redfish-virtualmedia://" + strings.TrimPrefix(srv.URL, "https://")
	verified := e.host("tls-verified", addr, 60)
	e.wait(verified, "refusing the self-signed certificate", errorContains(metal3.RegistrationError, "certificate"))
	insecure := e.host("tls-insecure", addr, 61, func(h *metal3.BareMetalHost) { h.Spec.BMC.DisableCertificateVerification = true })
	e.wait(insecure, "provisioned", state(metal3.StateProvisioned))

	// The BMC's own CA beside its credentials: verified, no need to turn
	// verification off.
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	require.NoError(t, e.Client.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "with-ca"},
		Data: map[string][]byte{"username": []byte("admin"), "password": []byte(password), "ca.crt": ca}}))
	withCA := e.host("tls-own-ca", addr, 62, func(h *metal3.BareMetalHost) { h.Spec.BMC.CredentialsName = "with-ca" })
	e.wait(withCA, "provisioned", state(metal3.StateProvisioned))
	require.NoError(t, e.Client.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "bad-ca"},
		Data: map[string][]byte{"username": []byte("admin"), "password": []byte(password), "ca.crt": []byte("not a certificate")}}))
	badCA := e.host("tls-bad-ca", addr, 63, func(h *metal3.BareMetalHost) { h.Spec.BMC.CredentialsName = "bad-ca" })
	e.wait(badCA, "refusing the CA", errorContains(metal3.RegistrationError, "credentials Secret "+e.ns+"/bad-ca: ca.crt holds no PEM certificate"))
}

// A BMC that answers without end (here 1 GiB) is read no further than
// driver.MaxAnswerBytes: the manager's memory stays flat, the host gets an
// error naming the cause, and the BMC sent little of what it meant to.
func TestBMCAnswerIsBounded(t *testing.T) {
	e := start(t)
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := []byte(strings.Repeat(" ", 64<<10))
		if n, err := w.Write([]byte(`{"@odata.id": "/redfish/v1/", "Name": "`)); err == nil {
			sent.Add(int64(n))
		}
		for i := 0; i < (1<<30)/len(chunk); i++ {
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	before := peakRSS(t)
	h := e.host("endless", "redfish+http://"+strings.TrimPrefix(srv.URL, "http://")+"/redfish/v1/Systems/1", 64)
	got := e.wait(h, "reporting the endless answer", errorContains(metal3.RegistrationError, "larger than 8 MiB"))
	require.LessOrEqual(t, len(got.Status.ErrorMessage), 600)
	require.Less(t, sent.Load(), int64(64<<20), "the BMC was read no further than the bound (plus socket buffers)")
	require.Less(t, peakRSS(t)-before, int64(256<<20), "the manager's peak memory stayed flat")
}

// peakRSS is this process's peak resident memory (VmHWM), which holds the
// stack's manager.
func peakRSS(t *testing.T) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// With --bmc-networks, a BareMetalHost pointing its BMC anywhere else is an
// error naming the networks, and not one request reaches that address: a
// tenant cannot make the manager probe internal services with credentials.
func TestBMCNetworksRefuseOtherAddresses(t *testing.T) {
	cfg := fast
	cfg.Networks = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	e := startWith(t, cfg, false)
	var requests atomic.Int64
	sim := &bmcsim.Redfish{User: "admin", Password: password, Machine: &bmcsim.MemMachine{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	h := e.host("elsewhere", "redfish-virtualmedia+"+srv.URL+"/redfish/v1/Systems/1", 60)
	got := e.wait(h, "refused", errorContains(metal3.RegistrationError, "is outside the BMC networks this agentboot may reach (--bmc-networks=198.18.0.0/15)"))
	require.LessOrEqual(t, len(got.Status.ErrorMessage), 600)
	e.settle(t, h)
	require.Zero(t, requests.Load(), "nothing was sent to the BMC address")
}
