//go:build e2e

package container_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/iso9660"
	"github.com/agentboot/agentboot/internal/liveiso"
	"github.com/agentboot/agentboot/test/container"
	"github.com/agentboot/agentboot/test/helmchart"
	"github.com/agentboot/agentboot/test/netns"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

// What a host's qemu user network reaches the load balancer's loopback at.
const lbFromGuest = "10.0.2.2"

// deployed is what an install path (the kustomize base, the Helm chart)
// renders, set up as a user sets it: the addresses hosts reach, the image
// by the digest make image built.
type deployed struct {
	namespace   string
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	// apply installs it as the README says.
	apply func(t *testing.T)
}

// kustomized copies deploy/ and edits it as the README says: the
// addresses hosts reach in config.env, the image by digest; it is applied
// with kubectl apply -k.
func kustomized(t *testing.T, env *testenv.Env, config map[string]string, digest string) deployed {
	t.Helper()
	var lines []string
	for k, v := range config {
		lines = append(lines, k+"="+v)
	}
	configEnv := strings.Join(lines, "\n") + "\n"
	base := filepath.Join(t.TempDir(), "deploy")
	require.NoError(t, os.CopyFS(base, os.DirFS(filepath.Join(testenv.RepoRoot(), "deploy"))))
	require.NoError(t, os.WriteFile(filepath.Join(base, "config.env"), []byte(configEnv), 0o644))
	kpath := filepath.Join(base, "kustomization.yaml")
	raw, err := os.ReadFile(kpath)
	require.NoError(t, err)
	var k map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &k))
	images, _ := k["images"].([]any)
	require.Len(t, images, 1, "deploy/ has one image entry, the one make image sets")
	entry := images[0].(map[string]any)
	require.Equal(t, "agentboot", entry["name"])
	delete(entry, "newTag")
	entry["newName"] = "agentboot" // whatever IMAGE_NAME pinned it to in this tree
	entry["digest"] = digest
	raw, err = yaml.Marshal(k)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(kpath, raw, 0o644))

	out, err := env.Kubectl(context.Background(), "", "kustomize", base)
	require.NoError(t, err)
	d := parse(t, stack.Namespace, out)
	d.apply = func(t *testing.T) {
		out, err := env.Kubectl(context.Background(), "", "apply", "-k", base)
		require.NoError(t, err, out)
	}
	return d
}

// charted renders the Helm chart into namespace, as helm install does with
// the values a user sets: the image's repository and digest, config.
func charted(t *testing.T, env *testenv.Env, namespace string, config map[string]string, digest string) deployed {
	t.Helper()
	cfg := map[string]any{}
	for k, v := range config {
		cfg[k] = v
	}
	out, err := helmchart.Render(namespace, map[string]any{"image": map[string]any{"repository": "agentboot", "digest": digest}, "config": cfg})
	require.NoError(t, err)
	d := parse(t, namespace, out)
	d.apply = func(t *testing.T) {
		// helm install --namespace … --create-namespace, with the label
		// the README says to add.
		ctx := context.Background()
		for _, args := range [][]string{{"create", "namespace", namespace}, {"label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"}} {
			out, err := env.Kubectl(ctx, "", args...)
			require.NoError(t, err, out)
		}
		out, err := env.Kubectl(ctx, out, "apply", "-f", "-")
		require.NoError(t, err, out)
	}
	return d
}

// parse finds the Deployments and Services of rendered manifests.
func parse(t *testing.T, namespace, manifests string) deployed {
	d := deployed{namespace: namespace, deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{}}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		switch u.GetKind() {
		case "Deployment":
			var dep appsv1.Deployment
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &dep))
			d.deployments[dep.Name] = &dep
		case "Service":
			var svc corev1.Service
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &svc))
			d.services[svc.Name] = &svc
		}
	}
	return d
}

// layoutDigest is the digest of the image index make image wrote: what a
// registry serves after the README's skopeo copy --all.
func layoutDigest(t *testing.T, dir string) string {
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	require.NoError(t, err, "make e2e runs make image first")
	var idx struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(raw, &idx))
	require.Len(t, idx.Manifests, 1)
	return idx.Manifests[0].Digest
}

// Each Deployment of deploy/ runs from the image make image built, exactly
// as the manifests describe it (Kubelet), against a real control plane
// that has deploy/ applied, RBAC included; then the README's tour goes
// through them: an InfraEnv's ISO downloads, its minimal ISO (made by the
// image's own xorriso) boots a VM that registers and is approved. A pod
// restarted keeps its cache and checks it; a ConfigMap without a key
// leaves a pod unready, saying which.
func TestDeploymentsRunAsDescribed(t *testing.T) {
	for _, path := range []string{"kustomize", "helm"} {
		t.Run(path, func(t *testing.T) { runAsDescribed(t, path) })
	}
}

func runAsDescribed(t *testing.T, path string) {
	layoutDir := filepath.Join(testenv.RepoRoot(), "dist", "image")
	digest := layoutDigest(t, layoutDir)
	ctx := context.Background()
	env := testenv.StartT(t, testenv.Options{NoCRDs: true})

	// The load balancer's addresses, where hosts also live: qemu's user
	// network there reaches its loopback at 10.0.2.2.
	netns.RemoveStale(container.NetnsPrefix)
	lb, err := netns.New(fmt.Sprintf("%s%d-lb", container.NetnsPrefix, os.Getpid()))
	require.NoError(t, err)
	t.Cleanup(lb.Close)

	// A site's mirror of the OS images the stream names.
	devStream, err := testenv.DevStream()
	require.NoError(t, err)
	var mirrored atomic.Int64 // images the mirror served (the stream is read again on every start)
	files := http.FileServer(http.Dir(filepath.Dir(devStream)))
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+filepath.Base(devStream) {
			mirrored.Add(1)
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(mirror.Close)
	const mirrorPort = 18080 // on each pod's loopback

	config := map[string]string{
		"AGENT_API_URL":           "https://" + lbFromGuest + ":7443",
		"IMAGE_SERVICE_URL":       "https://" + lbFromGuest + ":8443",
		"IMAGE_SERVICE_HTTP_URL":  "http://" + lbFromGuest + ":8080",
		"OS_IMAGE_STREAM":         fmt.Sprintf("http://127.0.0.1:%d/%s", mirrorPort, filepath.Base(devStream)),
		"BOOT_NETWORK_NAMESPACES": "",
	}
	var d deployed
	if path == "helm" {
		// Another namespace than the base's: the chart takes the release's.
		d = charted(t, env, "agentboot", config, digest)
	} else {
		d = kustomized(t, env, config, digest)
	}
	for _, name := range []string{"agentboot-manager", "agentboot-image-service", "agentboot-agent-api"} {
		require.Contains(t, d.deployments, name)
		require.Equal(t, "agentboot@"+digest, d.deployments[name].Spec.Template.Spec.Containers[0].Image, "the manifests name the image by digest")
	}
	d.apply(t)

	k := &container.Kubelet{Env: env, Layout: layoutDir, Arch: "amd64", Dir: t.TempDir(), Node: lb,
		Forwards: map[int]string{mirrorPort: strings.TrimPrefix(mirror.URL, "http://")}}
	pods := map[string]*container.Pod{}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range pods {
				t.Logf("log of %s:\n%s", name, p.LogTail(40))
			}
		}
	})
	for _, name := range []string{"agentboot-manager", "agentboot-image-service", "agentboot-agent-api"} {
		pods[name] = k.Start(t, d.deployments[name])
	}
	// Before the Secret the README makes next, each container runs,
	// unready, naming what it lacks in its log and its readiness answer.
	for name, want := range map[string]string{
		"agentboot-manager":       "--ca-bundle-file /etc/agentboot/tls/ca.crt cannot be read: no such file or directory",
		"agentboot-image-service": "--tls-cert-file /etc/agentboot/tls/tls.crt cannot be read: no such file or directory",
		"agentboot-agent-api":     "--agent-api-tls-cert-file /etc/agentboot/tls/tls.crt cannot be read: no such file or directory",
	} {
		p := pods[name]
		var code int
		var body string
		require.Eventually(t, func() bool {
			var err error
			code, body, err = p.Probe(ctx, p.Container.ReadinessProbe)
			return err == nil
		}, time.Minute, 100*time.Millisecond, "%s never answered its readiness probe; log:\n%s", name, p.LogTail(20))
		require.Equal(t, http.StatusServiceUnavailable, code, name)
		require.Contains(t, body, want, name)
		require.Contains(t, p.Log(), want, name)
	}

	// The README's Secret, as it says to make it.
	tlsDir := t.TempDir()
	_, _, caPEM, err := stack.Certificates(tlsDir, lbFromGuest)
	require.NoError(t, err)
	out, err := env.Kubectl(ctx, "", "-n", d.namespace, "create", "secret", "generic", "agentboot-tls",
		"--from-file="+filepath.Join(tlsDir, "tls.crt"), "--from-file="+filepath.Join(tlsDir, "tls.key"), "--from-file="+filepath.Join(tlsDir, "ca.crt"))
	require.NoError(t, err, out)
	created := time.Now()
	for _, name := range []string{"agentboot-manager", "agentboot-image-service", "agentboot-agent-api"} {
		pods[name].AwaitReady(t, 3*time.Minute)
		t.Logf("%s: ready %s after the Secret was created", name, time.Since(created).Round(10*time.Millisecond))
	}
	for name, svc := range d.services {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		// The pods whose labels the Service's selector matches.
		var selected []*container.Pod
		for dep, p := range pods {
			if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.deployments[dep].Spec.Template.Labels)) {
				selected = append(selected, p)
			}
		}
		require.Len(t, selected, 1, "Service %s selects one Deployment's pods", name)
		selected[0].Expose(t, lb, svc)
	}

	// The tour, through the load balancer.
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	web := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return lb.Dial(ctx, network, net.JoinHostPort("127.0.0.1", port))
		}}}
	t.Cleanup(web.CloseIdleConnections)
	download := func(u string) string {
		t.Helper()
		var resp *http.Response
		require.Eventually(t, func() bool {
			r, err := web.Get(u)
			if err != nil {
				return false
			}
			if r.StatusCode == http.StatusServiceUnavailable { // a base image or minimal ISO still being made
				r.Body.Close()
				return false
			}
			resp = r
			return true
		}, 2*time.Minute, 500*time.Millisecond, "GET %s", u)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, u)
		p := filepath.Join(t.TempDir(), "discovery.iso")
		f, err := os.Create(p)
		require.NoError(t, err)
		_, err = io.Copy(f, resp.Body)
		require.NoError(t, f.Close())
		require.NoError(t, err)
		return p
	}
	// hasRootfs says whether an ISO holds the live root file system.
	hasRootfs := func(p string) bool {
		t.Helper()
		f, err := os.Open(p)
		require.NoError(t, err)
		defer f.Close()
		fs, err := iso9660.Open(f)
		require.NoError(t, err, "%s is not an ISO 9660 image", p)
		_, err = fs.Stat(liveiso.RootfsPath)
		if errors.Is(err, iso9660.ErrNotExist) {
			return false
		}
		require.NoError(t, err)
		return true
	}
	const ns = "hardware-inventory"
	for _, args := range [][]string{
		{"create", "namespace", ns},
		{"-n", ns, "create", "secret", "docker-registry", "pull-secret", "--docker-server=quay.io", "--docker-username=me", "--docker-password=secret"},
	} {
		out, err := env.Kubectl(ctx, "", args...)
		require.NoError(t, err, out)
	}
	out, err = env.Kubectl(ctx, `apiVersion: agent-install.openshift.io/v1beta1
kind: InfraEnv
metadata:
  name: hardware-inventory
  namespace: hardware-inventory
spec:
  pullSecretRef:
    name: pull-secret
  sshAuthorizedKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample me@laptop
`, "apply", "-f", "-")
	require.NoError(t, err, out)
	key := client.ObjectKey{Namespace: ns, Name: "hardware-inventory"}
	image := func(previous string) *v1beta1.InfraEnv {
		t.Helper()
		var ie v1beta1.InfraEnv
		require.Eventually(t, func() bool {
			return env.Client.Get(ctx, key, &ie) == nil && ie.Status.ISODownloadURL != "" && ie.Status.ISODownloadURL != previous
		}, 3*time.Minute, 200*time.Millisecond, "the InfraEnv's ISO URL; manager log:\n%s", pods["agentboot-manager"].LogTail(30))
		return &ie
	}
	ie := image("")
	require.True(t, hasRootfs(download(ie.Status.ISODownloadURL)), "the full ISO holds the root file system")

	// A minimal ISO: the image service makes it with the image's xorriso.
	out, err = env.Kubectl(ctx, "", "-n", ns, "patch", "infraenv", "hardware-inventory", "--type", "merge", "--patch", `{"spec":{"imageType":"minimal-iso"}}`)
	require.NoError(t, err, out)
	ie = image(ie.Status.ISODownloadURL)
	iso := download(ie.Status.ISODownloadURL)
	require.False(t, hasRootfs(iso), "the minimal ISO leaves the root file system out")

	// Booted as the README's server (2 cores, 8 GiB, a 120 GB disk) with
	// UEFI, it fetches its root file system from the image service and
	// registers with the agent API.
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	out2, err := exec.Command("qemu-img", "create", "-f", "qcow2", disk, "120G").CombinedOutput()
	require.NoError(t, err, string(out2))
	v := vm.Start(t, vm.Options{Name: "deployed", CDROM: iso, Boot: "d", Net: "user", UEFI: true, MemoryMB: 8192, CPUs: 2, Disks: []string{disk}, Prefix: lb.Exec()})
	for _, p := range []string{
		`devinit: fetched root filesystem from ` + regexp.QuoteMeta(ie.Status.BootArtifacts.RootfsURL) + ` \(\d+ bytes, sha256 verified\)`,
		`devinit: ignition: found /config.ign`,
		`devinit: starting agent.service`,
	} {
		_, err := v.WaitFor(ctx, regexp.MustCompile(p), 8*time.Minute)
		require.NoError(t, err, "serial log:\n%s", v.Tail(30))
	}
	var agents v1beta1.AgentList
	require.Eventually(t, func() bool {
		return env.Client.List(ctx, &agents, client.InNamespace(ns)) == nil && len(agents.Items) == 1 && agents.Items[0].Status.Inventory.Hostname != ""
	}, 3*time.Minute, time.Second, "the Agent; agent API log:\n%s", pods["agentboot-agent-api"].LogTail(30))
	name := agents.Items[0].Name
	out, err = env.Kubectl(ctx, "", "patch", "-n", ns, "agent", name, "--type", "merge", "--patch", `{"spec":{"approved":true}}`)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool {
		var a v1beta1.Agent
		if env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &a) != nil {
			return false
		}
		c := conditions.Find(a.Status.Conditions, v1beta1.RequirementsMetCondition)
		return c != nil && c.Reason == v1beta1.AgentReadyReason
	}, 3*time.Minute, time.Second, "RequirementsMet AgentIsReady; manager log:\n%s", pods["agentboot-manager"].LogTail(30))
	v.Kill()

	// A restarted container keeps its emptyDir: the image service checks
	// the images it holds and serves them without a new download.
	img := pods["agentboot-image-service"]
	logged, fetched := len(img.Log()), mirrored.Load()
	img.Restart(t)
	took := img.AwaitReady(t, 3*time.Minute)
	t.Logf("agentboot-image-service restarted: ready %s after its container started", took.Round(10*time.Millisecond))
	require.Eventually(t, func() bool { return strings.Contains(img.Log()[logged:], "OS image ready (cached, sha256 verified)") },
		time.Minute, 100*time.Millisecond, "log:\n%s", img.LogTail(20))
	again := download(ie.Status.ISODownloadURL)
	require.False(t, hasRootfs(again))
	require.Equal(t, fetched, mirrored.Load(), "the restarted image service downloaded images again")
	for name, p := range pods {
		if peak := p.PeakMemory(); peak >= 0 {
			t.Logf("%s: at most %.0f MiB of memory (its limit: %s)", name, float64(peak)/(1<<20), p.Container.Resources.Limits.Memory())
		}
	}

	// A ConfigMap without a key the Deployment's arguments use: the pod
	// runs, unready, and says which.
	broken := d.deployments["agentboot-image-service"].DeepCopy()
	broken.Name = "agentboot-image-service-broken"
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: d.namespace, Name: broken.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name}, &cm))
	cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: d.namespace, Name: "agentboot-config-broken"}, Data: cm.Data}
	delete(cm.Data, "OS_IMAGE_STREAM")
	require.NoError(t, env.Client.Create(ctx, &cm))
	broken.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name = cm.Name
	bad := k.Start(t, broken)
	var code int
	var body string
	require.Eventually(t, func() bool {
		code, body, err = bad.Probe(ctx, bad.Container.ReadinessProbe)
		return err == nil
	}, time.Minute, 200*time.Millisecond, "log:\n%s", bad.Log())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, `--os-image-stream refers to $(OS_IMAGE_STREAM), and the environment has no OS_IMAGE_STREAM`)
	require.Contains(t, bad.Log(), "the environment has no OS_IMAGE_STREAM")
	code, _, err = bad.Probe(ctx, bad.Container.LivenessProbe)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "alive: a restart would not bring the key")
	require.NotContains(t, bad.Log(), "panic")
}
