package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/lifecycle"
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
	agent := func(kv ...string) *v1beta1.Agent {
		a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		for i := 0; i+1 < len(kv); i += 2 {
			a.Annotations[kv[i]] = kv[i+1]
		}
		return a
	}
	at := func(d time.Duration) string { return booted.Add(d).Format(time.RFC3339Nano) }
	vm, pxe := "redfish-virtualmedia://10.0.0.1/redfish/v1/Systems/1", "ipmi://10.0.0.1"
	for name, c := range map[string]struct {
		host  *metal3.BareMetalHost
		agent *v1beta1.Agent
		want  string // "" approves
	}{
		"virtual media, proof of this host":   {host(vm, &booted), agent(lifecycle.BootedByAnnotation, "bmh-uid"), ""},
		"virtual media, no proof":             {host(vm, &booted), agent(lifecycle.SessionStartedAnnotation, at(time.Minute)), "no proof"},
		"virtual media, another host's proof": {host(vm, &booted), agent(lifecycle.BootedByAnnotation, "other-uid"), "no proof"},
		"network boot, registered after":      {host(pxe, &booted), agent(lifecycle.SessionStartedAnnotation, at(time.Minute)), ""},
		"network boot, registered before":     {host(pxe, &booted), agent(lifecycle.SessionStartedAnnotation, at(-time.Millisecond)), "before the controller booted"},
		"network boot, never booted":          {host(pxe, nil), agent(lifecycle.SessionStartedAnnotation, at(time.Minute)), "has not booted this host"},
		"network boot, no session time":       {host(pxe, &booted), agent(), "before the controller booted"},
		"disputed":                            {host(vm, &booted), agent(lifecycle.BootedByAnnotation, "bmh-uid", lifecycle.DisputedAnnotation, "two hosts"), "disputed"},
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
