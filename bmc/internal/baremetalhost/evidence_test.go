package baremetalhost

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/address"
)

// An Agent reporting a host's boot MAC is approved for it only on evidence
// the host cannot forge.
func TestBootEvidence(t *testing.T) {
	booted := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	host := func(addr string, bootedAt *time.Time) *metal3.BareMetalHost {
		h := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Name: "h", UID: "bmh-uid", Annotations: map[string]string{}}}
		h.Spec.BMC.Address = addr
		if bootedAt != nil {
			h.Annotations[DiscoveryBootAnnotation] = bootedAt.Format(time.RFC3339Nano)
		}
		return h
	}
	agent := func(rec v1beta1.AgentRegistration) *v1beta1.Agent {
		return &v1beta1.Agent{Status: v1beta1.AgentStatus{Registration: &rec}}
	}
	type reg = v1beta1.AgentRegistration
	at := func(d time.Duration) string { return booted.Add(d).Format(time.RFC3339Nano) }
	vm, pxe := "redfish-virtualmedia://10.0.0.1/redfish/v1/Systems/1", "ipmi://10.0.0.1"
	for name, c := range map[string]struct {
		host  *metal3.BareMetalHost
		agent *v1beta1.Agent
		want  string // "" approves
	}{
		"virtual media, proof of this host":   {host(vm, &booted), agent(reg{BootedBy: "bmh-uid"}), ""},
		"virtual media, no proof":             {host(vm, &booted), agent(reg{SessionStarted: at(time.Minute)}), "no proof"},
		"virtual media, another host's proof": {host(vm, &booted), agent(reg{BootedBy: "other-uid"}), "no proof"},
		"network boot, registered after":      {host(pxe, &booted), agent(reg{SessionStarted: at(time.Minute)}), ""},
		"network boot, registered before":     {host(pxe, &booted), agent(reg{SessionStarted: at(-time.Millisecond)}), "before the controller booted"},
		"network boot, never booted":          {host(pxe, nil), agent(reg{SessionStarted: at(time.Minute)}), "has not booted this host"},
		"network boot, no session time":       {host(pxe, &booted), agent(reg{}), "before the controller booted"},
		"disputed":                            {host(vm, &booted), agent(reg{BootedBy: "bmh-uid", Disputed: "two hosts"}), "disputed"},
	} {
		t.Run(name, func(t *testing.T) {
			err := bootEvidence(c.host, c.agent)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}

// BMC addresses outside --bmc-networks are never contacted, whether
// written as an address or as a name.
func TestBMCNetworks(t *testing.T) {
	r := &Reconciler{
		Networks: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8::/32")},
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			return map[string][]netip.Addr{
				"bmc.lab":      {netip.MustParseAddr("198.18.4.2")},
				"internal.svc": {netip.MustParseAddr("10.96.0.1")},
				"split.lab":    {netip.MustParseAddr("198.18.4.3"), netip.MustParseAddr("10.0.0.3")},
			}[host], nil
		},
	}
	// want is the address connected to, or the error.
	for addr, want := range map[string]string{
		"ipmi://198.18.0.9":                                     "198.18.0.9",
		"redfish://bmc.lab/redfish/v1/Systems/1":                "198.18.4.2",
		"redfish://[2001:db8::5]/redfish/v1/Systems/1":          "2001:db8::5",
		"redfish://127.0.0.1:8000/redfish/v1/Systems/1":         "BMC address 127.0.0.1 (127.0.0.1) is outside the BMC networks this agentboot may reach (--bmc-networks=198.18.0.0/15,2001:db8::/32)",
		"redfish://internal.svc/redfish/v1/Systems/1":           "(10.96.0.1) is outside",
		"redfish-virtualmedia://split.lab/redfish/v1/Systems/1": "(10.0.0.3) is outside",
		"ipmi://nowhere.lab":                                    "resolves to nothing",
		"ipmi://[::ffff:10.0.0.1]":                              "is outside",
	} {
		a, err := address.Parse(addr)
		require.NoError(t, err, addr)
		pins, err := r.resolve(context.Background(), a)
		if ip, perr := netip.ParseAddr(want); perr == nil {
			require.NoError(t, err, addr)
			require.Equal(t, []netip.Addr{ip}, pins, "%s is connected to at the address that was checked", addr)
			continue
		}
		require.ErrorContains(t, err, want, addr)
	}
	pins, err := (&Reconciler{}).resolve(context.Background(), address.Address{Host: "10.0.0.1"})
	require.NoError(t, err, "no --bmc-networks: any")
	require.Equal(t, []netip.Addr{netip.MustParseAddr("10.0.0.1")}, pins)
	// A name with several addresses, all inside: each is tried in turn.
	r.Resolve = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("198.18.4.7")}, nil
	}
	pins, err = r.resolve(context.Background(), address.Address{Host: "dual.lab"})
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("198.18.4.7")}, pins)
}

func TestBoundMessage(t *testing.T) {
	require.Equal(t, "power off: 500 a b", boundMessage("power off: 500 a\nb"))
	long := strings.Repeat("é", 400) // 800 bytes
	got := boundMessage(long)
	require.True(t, utf8.ValidString(got))
	require.LessOrEqual(t, len(got), maxMessage+len("… (999 more bytes)"))
	require.True(t, strings.HasSuffix(got, "… (288 more bytes)"), got[len(got)-30:])
}
