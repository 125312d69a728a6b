//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/test/bmcsim"
	"github.com/agentboot/agentboot/test/vm"
)

const bmcPassword = "lab-bmc-Pa55"

// realBMC is how the lab's simulated BMCs switch power: as real servers
// do (bmcsim.Realistic, without the answer latency, which only slows the
// lab down), while the controller runs with its production timeouts.
var realBMC = func() bmcsim.Timing {
	t := bmcsim.Realistic
	t.Latency = bmcsim.Span{}
	return t
}()

// machineOn is a server on bridge that a simulated BMC powers.
func machineOn(t *testing.T, bridge string, o vm.Options) *vm.Machine {
	t.Helper()
	return vm.NewMachine(t, onBridge(t, bridge, o))
}

// enroll creates the credentials and the BareMetalHost, as a user would.
func enroll(t *testing.T, ie *v1beta1.InfraEnv, name, addr, mac string) *metal3.BareMetalHost {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: name + "-bmc"},
		StringData: map[string]string{"username": "admin", "password": bmcPassword}}))
	h := &metal3.BareMetalHost{
		ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: name, Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name},
			Annotations: map[string]string{metal3.HostnameAnnotation: name + ".lab.example"}},
		Spec: metal3.BareMetalHostSpec{Online: true, BootMACAddress: mac, BootMode: metal3.BootModeLegacy,
			BMC: metal3.BMCDetails{Address: addr, CredentialsName: name + "-bmc"}},
	}
	require.NoError(t, s.Client.Create(ctx, h))
	return h
}

// approvedAgent waits for the host's Agent to register and be approved
// because of its BareMetalHost.
func approvedAgent(t *testing.T, h *metal3.BareMetalHost, m *vm.Machine) v1beta1.Agent {
	t.Helper()
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		var list v1beta1.AgentList
		if s.Client.List(context.Background(), &list, client.InNamespace(h.Namespace), client.MatchingLabels{v1beta1.BMHLabel: h.Name}) == nil &&
			len(list.Items) == 1 && list.Items[0].Spec.Approved {
			return list.Items[0]
		}
		time.Sleep(2 * time.Second)
	}
	got := &metal3.BareMetalHost{}
	_ = s.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got)
	tail := "(never powered on)"
	if v := m.VM(); v != nil {
		tail = v.Tail(60)
	}
	t.Fatalf("no approved Agent for BareMetalHost %s; its status: %+v\nserial log:\n%s", h.Name, got.Status, tail)
	return v1beta1.Agent{}
}

// powerOff sets online: false and waits until the machine and the
// BareMetalHost agree it is off.
func powerOff(t *testing.T, h *metal3.BareMetalHost, m *vm.Machine) {
	t.Helper()
	ctx := context.Background()
	cur := &metal3.BareMetalHost{}
	require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(h), cur))
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Online = false
	require.NoError(t, s.Client.Patch(ctx, cur, patch))
	require.Eventually(t, func() bool {
		return s.Client.Get(ctx, client.ObjectKeyFromObject(h), cur) == nil && !cur.Status.PoweredOn && !m.On()
	}, 3*time.Minute, time.Second, "online: false did not power %s off", h.Name)
}

// A BareMetalHost with an ipmi:// BMC (the real ipmi_sim, whose chassis
// control drives a VM): the host is set to boot from the network once and
// powered on, agentboot's ProxyDHCP boots it into its InfraEnv, and the
// Agent that registers from its boot MAC is approved; online: false powers
// it off.
func TestLabBMCIPMI(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	seg, err := theLab.Segment(4)
	require.NoError(t, err)
	require.NoError(t, theLab.Dnsmasq("bmc-dhcp", seg.Bridge, seg.HostIP, seg.Prefix))
	startPXE(t, "pxe-bmc", seg.Bridge, seg.HostIP)
	const mac = "52:54:00:2d:00:01"
	m := machineOn(t, seg.Bridge, vm.Options{Name: "bmc-ipmi", MAC: mac, MemoryMB: 1536})
	port := freeUDPPort(t)
	sim := bmcsim.StartIPMI(t, bmcsim.IPMIOptions{User: "admin", Password: bmcPassword, Port: port, Machine: m, Timing: realBMC})
	h := enroll(t, ie, "ipmi-host", fmt.Sprintf("ipmi://127.0.0.1:%d", port), mac)

	a := approvedAgent(t, h, m)
	require.Equal(t, "ipmi-host.lab.example", a.Spec.Hostname)
	require.Contains(t, sim.Events(), "power on pxe")
	requireSerial(t, m.VM(), "Filename: "+bootScriptURL()+"?mac="+mac)
	powerOff(t, h, m)
}

// A BareMetalHost with a redfish-virtualmedia+http:// BMC (the Redfish
// simulator, backed by a VM): the InfraEnv ISO is inserted, the host boots
// it from the virtual CD, and its Agent is approved. The BMC drops off the
// network right after the ISO is inserted, for 40 seconds; enrollment
// recovers by itself.
func TestLabBMCRedfishVirtualMedia(t *testing.T) {
	t.Parallel()
	ie := infraEnv(t, nil)
	const mac = "52:54:00:2d:00:02"
	m := machineOn(t, "br0", vm.Options{Name: "bmc-redfish", MAC: mac, MemoryMB: 1536})
	sim := &bmcsim.Redfish{User: "admin", Password: bmcPassword, Machine: m, MediaDir: t.TempDir(),
		Client: &http.Client{Transport: localTransport{}}}
	sim.SetTiming(realBMC)
	t.Cleanup(sim.Close)
	var outage sync.Once
	sim.Hook = func(ev string) {
		if strings.HasPrefix(ev, "insert ") {
			outage.Do(func() {
				sim.SetFaults(bmcsim.Faults{Unreachable: true})
				time.AfterFunc(40*time.Second, func() { sim.SetFaults(bmcsim.Faults{}) })
			})
		}
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	h := enroll(t, ie, "redfish-host", "redfish-virtualmedia+http://"+strings.TrimPrefix(srv.URL, "http://")+"/redfish/v1/Systems/1", mac)

	// The outage shows as an error on the host, then goes away.
	require.Eventually(t, func() bool {
		got := &metal3.BareMetalHost{}
		return s.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got) == nil && got.Status.ErrorType != ""
	}, 2*time.Minute, 500*time.Millisecond, "the BMC outage never showed on the host")
	approvedAgent(t, h, m)
	got := &metal3.BareMetalHost{}
	require.Eventually(t, func() bool {
		return s.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got) == nil && got.Status.ErrorType == ""
	}, 3*time.Minute, time.Second, "the host never recovered from the outage: %+v", got.Status)
	require.Equal(t, metal3.StateProvisioned, got.Status.Provisioning.State)
	// The ISO inserted carries this host's boot proof, which approved it.
	require.True(t, strings.HasPrefix(sim.Image(), ie.Status.ISODownloadURL+"&bmh=redfish-host&proof="), sim.Image())
	require.Contains(t, sim.Events(), "power on cdrom")
	powerOff(t, h, m)
	// Off the graceful way, asked once: the OS shut down within its grace.
	evs := sim.Events()
	require.Equal(t, 1, strings.Count(strings.Join(evs, "\n")+"\n", "request GracefulShutdown\n"), "%q", evs)
	require.NotContains(t, evs, "request ForceOff", "the power was cut although the OS shut down in time")
	require.NoError(t, s.Client.Get(context.Background(), client.ObjectKeyFromObject(h), got))
	require.Empty(t, got.Status.ErrorType, "a healthy power-off left an error: %s", got.Status.ErrorMessage)
}

// localTransport fetches published image URLs through the stack's client.
type localTransport struct{}

func (localTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u, err := url.Parse(s.Local(req.URL.String()))
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.URL, out.Host = u, ""
	return s.HTTP.Transport.RoundTrip(out)
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}
