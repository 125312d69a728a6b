package infraenvcontroller_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/osimage"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
)

// Its stacks take turns on one control plane.
func TestMain(m *testing.M) { stack.Main(m) }

func TestPullSecretProblemsAreReportedAndRecovered(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t, "pull")
	ie := stack.NewInfraEnv(ns, "env")
	ie.Spec.PullSecretRef.Name = "missing"
	require.NoError(t, s.Client.Create(ctx, ie))
	key := client.ObjectKeyFromObject(ie)
	got := s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("pull secret "+ns+"/missing not found"))
	require.Equal(t, v1beta1.ImageCreationErrorReason, got.Status.Conditions[0].Reason)
	require.Empty(t, got.Status.ISODownloadURL)

	wrong := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "missing"}, StringData: map[string]string{"x": "y"}}
	require.NoError(t, s.Client.Create(ctx, wrong))
	s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains(`has type "Opaque", want kubernetes.io/dockerconfigjson`))

	require.NoError(t, s.Client.Delete(ctx, wrong))
	empty := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "missing"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
	require.NoError(t, s.Client.Create(ctx, empty))
	s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("is not a docker config with auths"))

	// Fixing the secret is noticed without touching the InfraEnv.
	empty.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{"quay.io":{"auth":"eDp5"}}}`)
	require.NoError(t, s.Client.Update(ctx, empty))
	ok := s.WaitImage(t, key)
	require.NotEmpty(t, ok.Status.ISODownloadURL)
	require.Equal(t, map[string]string{v1beta1.InfraEnvNameLabel: "env"}, ok.Status.AgentLabelSelector.MatchLabels)
	require.NotNil(t, ok.Status.CreatedTime)

	// Events explain the history.
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		if err := s.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false
		}
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			if e.Regarding.Name == "env" {
				reasons[e.Reason] = true
			}
		}
		return reasons[v1beta1.ImageCreationErrorReason] && reasons[v1beta1.ImageCreatedReason]
	}, 10*time.Second, 100*time.Millisecond)
}

func TestUnknownVersionListsWhatExists(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ns := s.Namespace(t, "version")
	ie := stack.NewInfraEnv(ns, "env")
	ie.Spec.OSImageVersion = "4.99"
	require.NoError(t, s.Client.Create(context.Background(), ie))
	got := s.WaitCondition(t, client.ObjectKeyFromObject(ie), corev1.ConditionFalse, stack.Contains("available: dev-"))
	require.Contains(t, stack.Message(got), `version "4.99" for x86_64`)

	power := stack.NewInfraEnv(ns, "power")
	power.Spec.CPUArchitecture = v1beta1.CPUArchitecturePPC64le
	require.NoError(t, s.Client.Create(context.Background(), power))
	got = s.WaitCondition(t, client.ObjectKeyFromObject(power), corev1.ConditionFalse, stack.Contains("for architecture ppc64le"))
	require.Contains(t, stack.Message(got), "aarch64/dev-", "the dev stream's architectures are listed")
	require.Contains(t, stack.Message(got), "x86_64/dev-")
}

// An InfraEnv of an architecture the catalog has but agentboot has no agent
// for says so, naming it, and publishes nothing: its hosts would boot and
// never register.
func TestArchitectureWithoutAgent(t *testing.T) {
	iso := "file://" + mustDevImage(t)
	s := stack.Start(t, stack.Options{Images: []osimage.Entry{
		{Version: "4.14", CPUArchitecture: "x86_64", URL: iso},
		{Version: "4.14", CPUArchitecture: "aarch64", URL: iso},
	}})
	ns := s.Namespace(t, "arch")
	arm := stack.NewInfraEnv(ns, "arm")
	arm.Spec.CPUArchitecture = v1beta1.CPUArchitectureArm64
	require.NoError(t, s.Client.Create(context.Background(), arm))
	got := s.WaitCondition(t, client.ObjectKeyFromObject(arm), corev1.ConditionFalse, stack.Contains("AgentBinaryMissing"))
	require.Contains(t, stack.Message(got), "no agent binary for aarch64 hosts (this agentboot has one for: x86_64)")
	require.Empty(t, got.Status.ISODownloadURL)
	s.WaitImage(t, client.ObjectKeyFromObject(s.CreateInfraEnv(t, "arch", "x86", nil)))
}

// An OS image that is slow, then failing, then fine: the InfraEnv says so at
// every step and the service recovers by itself.
func TestImageDownloadStates(t *testing.T) {
	iso, err := testenv.DevImage()
	require.NoError(t, err)
	var mode atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case 0: // slow: headers, then wait
			w.Header().Set("Content-Length", "23068672")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			panic(http.ErrAbortHandler)
		case 1:
			http.Error(w, "mirror is down", http.StatusInternalServerError)
		default:
			http.ServeFile(w, r, iso)
		}
	}))
	defer srv.Close()
	s := stack.Start(t, stack.Options{Images: []osimage.Entry{{Version: "4.14", CPUArchitecture: "x86_64", URL: srv.URL + "/rhcos-live.iso"}}})
	ns := s.Namespace(t, "download")
	ie := stack.NewInfraEnv(ns, "env")
	require.NoError(t, s.Client.Create(context.Background(), ie))
	key := client.ObjectKeyFromObject(ie)
	got := s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("downloading OS image x86_64/4.14"))
	require.Contains(t, stack.Message(got), "ImageDownloading")

	mode.Store(1)
	close(release)
	got = s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("ImageCreationError"))
	require.Contains(t, stack.Message(got), "OS image x86_64/4.14")
	require.Contains(t, stack.Message(got), "(retrying)")

	mode.Store(2)
	s.WaitImage(t, key)
}

func TestContentChangesChangeURLs(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t, "content")
	ie := stack.NewInfraEnv(ns, "env")
	ie.Spec.NMStateConfigLabelSelector = metav1.LabelSelector{MatchLabels: map[string]string{"static": "yes"}}
	require.NoError(t, s.Client.Create(ctx, ie))
	key := client.ObjectKeyFromObject(ie)
	first := s.WaitImage(t, key)

	nm := &v1beta1.NMStateConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "host-a", Labels: map[string]string{"static": "yes"}},
		Spec: v1beta1.NMStateConfigSpec{
			Interfaces: []*v1beta1.Interface{{Name: "eth0", MacAddress: "52:54:00:00:00:0a"}},
			NetConfig:  runtime.RawExtension{Raw: []byte(`{"interfaces":[{"name":"eth0","type":"ethernet","state":"up"}]}`)},
		},
	}
	require.NoError(t, s.Client.Create(ctx, nm))
	second := s.WaitCondition(t, key, corev1.ConditionTrue, func(ie *v1beta1.InfraEnv) bool { return ie.Status.ISODownloadURL != first.Status.ISODownloadURL })
	require.NotEqual(t, first.Status.BootArtifacts.IpxeScriptURL, second.Status.BootArtifacts.IpxeScriptURL)

	// An invalid override is reported with Ignition's own words, and no URL.
	var cur v1beta1.InfraEnv
	require.NoError(t, s.Client.Get(ctx, key, &cur))
	cur.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"etc/motd"}]}}`
	require.NoError(t, s.Client.Update(ctx, &cur))
	bad := s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("path not absolute"))
	require.Empty(t, bad.Status.ISODownloadURL)
	require.Empty(t, bad.Status.BootArtifacts.KernelURL)

	require.NoError(t, s.Client.Get(ctx, key, &cur))
	cur.Spec.IgnitionConfigOverride = `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hello"}}]}}`
	require.NoError(t, s.Client.Update(ctx, &cur))
	fixed := s.WaitImage(t, key)
	require.NotEqual(t, second.Status.ISODownloadURL, fixed.Status.ISODownloadURL)
	require.True(t, !fixed.Status.CreatedTime.Before(second.Status.CreatedTime))

	// A static network config that cannot work is named on the InfraEnv,
	// which publishes nothing, rather than booting hosts that never reach
	// the image service.
	require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(nm), nm))
	nm.Spec.NetConfig.Raw = []byte(`{"interfaces":[{"name":"eth0","type":"ethernet","state":"up","ipv4":{"enabled":true,"address":[{"ip":"198.18.1.10","prefix-length":24}]}}],` +
		`"routes":{"config":[{"destination":"0.0.0.0/0","next-hop-address":"198.18.2.1","next-hop-interface":"eth0"}]}}`)
	require.NoError(t, s.Client.Update(ctx, nm))
	wrongNet := s.WaitCondition(t, key, corev1.ConditionFalse, stack.Contains("NMStateConfig host-a: routes.config[0]: next hop 198.18.2.1 is on none of eth0's networks"))
	require.Empty(t, wrongNet.Status.ISODownloadURL)

	// Relabelling the NMStateConfig out of the selector changes the content again.
	require.NoError(t, s.Client.Get(ctx, client.ObjectKeyFromObject(nm), nm))
	nm.Labels["static"] = "no"
	require.NoError(t, s.Client.Update(ctx, nm))
	s.WaitCondition(t, key, corev1.ConditionTrue, func(ie *v1beta1.InfraEnv) bool { return ie.Status.ISODownloadURL != fixed.Status.ISODownloadURL })
}

// The stream metadata path: the dev image's stream.json names the version.
func TestDefaultImageIsNewestOfArchitecture(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ns := s.Namespace(t, "newest")
	ie := stack.NewInfraEnv(ns, "env")
	require.NoError(t, s.Client.Create(context.Background(), ie))
	got := s.WaitImage(t, client.ObjectKeyFromObject(ie))
	raw, err := os.ReadFile(strings.TrimSuffix(mustDevImage(t), "agentboot-dev-live.x86_64.iso") + "stream.json")
	require.NoError(t, err)
	require.Contains(t, got.Status.BootArtifacts.KernelURL, "/boot-artifacts/x86_64/dev-")
	require.Contains(t, string(raw), strings.Split(strings.Split(got.Status.BootArtifacts.KernelURL, "/x86_64/")[1], "/")[0])
}

func mustDevImage(t *testing.T) string {
	p, err := testenv.DevImage()
	require.NoError(t, err)
	return p
}
