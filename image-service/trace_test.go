package imageservice_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/test/stack"
)

const observationsToken = "observations-token-0123456789"

// The image service keeps a BootTrace per MAC: the boot script it served,
// the boot files the same address then fetched, and the PXE service's
// observations it was posted. A MAC nothing claims has its trace in
// agentboot's namespace, saying so; a claimed one in its InfraEnv's.
func TestBootTrace(t *testing.T) {
	s := stack.Start(t, stack.Options{BootObservationsToken: observationsToken})
	ctx := context.Background()
	trace := func(ns, mac string, done func(*v1alpha1.BootTrace) bool) *v1alpha1.BootTrace {
		t.Helper()
		var bt v1alpha1.BootTrace
		require.Eventually(t, func() bool {
			return s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: boottrace.Name(mac)}, &bt) == nil && done(&bt)
		}, 30*time.Second, 100*time.Millisecond, "trace of %s in %s: %+v", mac, ns, &bt.Status)
		return &bt
	}
	hop := func(bt *v1alpha1.BootTrace, name string) *v1alpha1.BootTraceHop {
		for i := range bt.Status.Hops {
			if bt.Status.Hops[i].Hop == name {
				return &bt.Status.Hops[i]
			}
		}
		return nil
	}

	// Nothing claims the MAC: the host is told so, and the trace says it.
	stranger := "52:54:00:00:77:01"
	get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.ipxe?mac="+url.QueryEscape(stranger), nil)
	bt := trace(stack.Namespace, stranger, func(bt *v1alpha1.BootTrace) bool { return hop(bt, boottrace.BootScript) != nil })
	require.Equal(t, "52-54-00-00-77-01", bt.Labels[v1alpha1.MACLabel])
	require.Empty(t, bt.Status.InfraEnv)
	require.Contains(t, bt.Status.Claim, "unknown: no BareMetalHost has boot MAC "+stranger)
	h := hop(bt, boottrace.BootScript)
	require.False(t, h.OK)
	require.Equal(t, boottrace.SourceImageService, h.Source)
	require.Contains(t, h.Outcome, "unknown: no BareMetalHost has boot MAC")
	d := boottrace.Diagnose(bt, nil)
	require.Equal(t, boottrace.BootScript, d.Stopped)
	require.Contains(t, d.Reason, "no BareMetalHost has boot MAC "+stranger)

	// The PXE default claims it: the boot script, then the files iPXE
	// fetches from the same address, in the InfraEnv's namespace.
	def := setup(t, s, func(ie *v1beta1.InfraEnv) { ie.Labels = map[string]string{v1beta1.PXEDefaultLabel: "true"} })
	mac := stack.MAC(1)
	script := get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.ipxe?mac="+url.QueryEscape(mac), nil)
	require.Contains(t, string(script.body), "kernel ")
	b := def.Status.BootArtifacts
	for _, u := range []string{b.KernelURL, b.InitrdURL, b.RootfsURL} {
		require.Equal(t, http.StatusOK, get(t, s, u, nil).code)
	}
	bt = trace(def.Namespace, mac, func(bt *v1alpha1.BootTrace) bool { return bt.Status.LastHop == boottrace.RootFS })
	require.Equal(t, def.Namespace+"/"+def.Name, bt.Status.InfraEnv)
	for _, name := range []string{boottrace.BootScript, boottrace.Kernel, boottrace.Initrd, boottrace.RootFS} {
		h := hop(bt, name)
		require.NotNil(t, h, name)
		require.True(t, h.OK, "%s: %s", name, h.Outcome)
		require.EqualValues(t, 1, h.Count, name)
	}
	require.Contains(t, hop(bt, boottrace.Initrd).Outcome, "sent, ")
	d = boottrace.Diagnose(bt, nil)
	require.Equal(t, boottrace.RootFS, d.Stopped)
	require.Contains(t, d.Reason, "its agent never registered")

	// The PXE service posts what it saw, with the token.
	post := func(token string, body []byte) (int, string) {
		req, err := http.NewRequest(http.MethodPost, s.Local(s.Settings.ImageServiceURL)+"/boot-observations", bytes.NewReader(body))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := s.HTTP.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(resp.Body)
		return resp.StatusCode, out.String()
	}
	at := time.Now().Add(-time.Minute)
	batch, err := json.Marshal(boottrace.Batch{Observations: []boottrace.Observation{
		{MAC: strings.ToUpper(mac), Hop: boottrace.DHCP, At: at, OK: true, Outcome: "offered ipxe.efi", Detail: "x86-64 UEFI PXE", Count: 2},
		{MAC: mac, Hop: boottrace.BootFile, At: at.Add(time.Second), OK: true, Outcome: "sent, 1048576 bytes", Detail: "ipxe.efi"},
	}})
	require.NoError(t, err)
	for _, token := range []string{"", "not-the-token-0123456789"} {
		code, _ := post(token, batch)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	for body, why := range map[string]string{
		`{"observations":[{"mac":"zz","hop":"dhcp"}]}`:                           `mac "zz"`,
		`{"observations":[{"mac":"52:54:00:00:00:01","hop":"shell"}]}`:           `hop "shell"`,
		`{"observations":[],"extra":1}`:                                          "unknown field",
		`{"observations":[{"mac":"52:54:00:00:00:01","hop":"dhcp","count":-1}]}`: "count -1",
	} {
		code, msg := post(observationsToken, []byte(body))
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, msg, why, body)
	}
	code, msg := post(observationsToken, batch)
	require.Equal(t, http.StatusNoContent, code, msg)
	bt = trace(def.Namespace, mac, func(bt *v1alpha1.BootTrace) bool {
		return hop(bt, boottrace.DHCP) != nil && hop(bt, boottrace.BootFile) != nil
	})
	require.Equal(t, []string{boottrace.DHCP, boottrace.BootFile, boottrace.BootScript, boottrace.Kernel, boottrace.Initrd, boottrace.RootFS}, hopNames(bt), "in boot order")
	require.Equal(t, boottrace.SourcePXE, hop(bt, boottrace.DHCP).Source)
	require.EqualValues(t, 2, hop(bt, boottrace.DHCP).Count)
	require.Equal(t, boottrace.RootFS, bt.Status.LastHop, "the latest hop is still the root file system")

	// Once the host registers, its Agent continues the path.
	host := s.Register(t, def, 1)
	var a v1beta1.Agent
	require.Eventually(t, func() bool {
		return s.Client.Get(ctx, client.ObjectKey{Namespace: host.NS, Name: host.ID}, &a) == nil && a.Status.Inventory.ReportTime != nil
	}, 30*time.Second, 100*time.Millisecond)
	d = boottrace.Diagnose(bt, &a)
	require.Contains(t, []string{boottrace.Inventory, boottrace.Heartbeat}, d.Stopped, "%+v", d)
}

func hopNames(bt *v1alpha1.BootTrace) []string {
	var out []string
	for _, h := range bt.Status.Hops {
		out = append(out, h.Hop)
	}
	return out
}

// A host that stops on its boot path gets a BootStalled event, where
// people look: on its BareMetalHost (whose boot MAC it is) and on its
// trace, saying where it stopped and the likely reason (once per stall:
// internal/boottrace TestStallsTellOnce).
func TestBootStalledEvent(t *testing.T) {
	s := stack.Start(t, stack.Options{BootStallAfter: 2 * time.Second})
	ctx := context.Background()
	ie := setup(t, s, nil)
	mac := "52:54:00:aa:10:01"
	host := &metal3.BareMetalHost{ObjectMeta: metav1.ObjectMeta{Namespace: ie.Namespace, Name: "worker-0",
		Annotations: map[string]string{"baremetalhost.metal3.io/detached": ""}, Labels: map[string]string{v1beta1.InfraEnvNameLabel: ie.Name}},
		Spec: metal3.BareMetalHostSpec{BootMACAddress: mac, BMC: metal3.BMCDetails{Address: "ipmi://198.18.0.9", CredentialsName: "bmc-secret"}}}
	require.NoError(t, s.Client.Create(ctx, host))
	require.Eventually(t, func() bool {
		return strings.Contains(string(get(t, s, s.Settings.ImageServiceHTTPURL+"/boot.ipxe?mac="+url.QueryEscape(mac), nil).body), "kernel ")
	}, 10*time.Second, 100*time.Millisecond)
	// It got its boot script and went no further.
	events := func(kind, name string) []string {
		var list eventsv1.EventList
		require.NoError(t, s.Client.List(ctx, &list, client.InNamespace(ie.Namespace)))
		var out []string
		for _, ev := range list.Items {
			if ev.Regarding.Kind == kind && ev.Regarding.Name == name && ev.Reason == boottrace.StallReason {
				out = append(out, ev.Note)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(events("BareMetalHost", host.Name)) == 1 }, 30*time.Second, 200*time.Millisecond)
	note := events("BareMetalHost", host.Name)[0]
	require.Contains(t, note, "MAC "+mac+" stopped at boot_script")
	require.Contains(t, note, "never fetched the kernel")
	require.Contains(t, note, "agentboot trace "+mac)
	require.Eventually(t, func() bool { return len(events("BootTrace", boottrace.Name(mac))) == 1 }, 30*time.Second, 200*time.Millisecond)
}
