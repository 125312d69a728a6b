//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/test/bmcsim"
	"github.com/agentboot/agentboot/test/capiagent"
	"github.com/agentboot/agentboot/test/e2e/lab"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/vm"
)

// installTimeout covers writing the disk image and booting it under TCG.
const installTimeout = 12 * time.Minute

// waitWorker waits until the host's serial log shows it applied the worker
// config the hosted cluster's endpoint served, failing at once, with the
// reason, if its Agent's installation failed.
func waitWorker(t *testing.T, v *vm.VM, agent client.ObjectKey) {
	t.Helper()
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go func() {
		for ctx.Err() == nil {
			var a v1beta1.Agent
			if s.Client.Get(ctx, agent, &a) == nil {
				if c := conditions.Find(a.Status.Conditions, v1beta1.InstalledCondition); c != nil && c.Reason == v1beta1.InstallationFailedReason {
					cancel(fmt.Errorf("the installation of Agent %s failed: %s", agent, c.Message))
					return
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	_, err := v.WaitFor(ctx, regexp.MustCompile(regexp.QuoteMeta(hosted.WorkerMarker)), installTimeout)
	if ctx.Err() != nil && context.Cause(ctx) != nil {
		err = context.Cause(ctx)
	}
	require.NoError(t, err, "%s never applied its worker config; serial log:\n%s", v.Name, v.Tail(40))
}

// poolHost is a BMC-managed server of the NodePool scenario.
type poolHost struct {
	m     *vm.Machine
	disk  string // the VM's disk image
	sim   *bmcsim.Redfish
	bmh   *metal3.BareMetalHost
	agent string
}

// TestLabNodePool: a hosted cluster as HyperShift, Cluster API and
// cluster-api-provider-agent keep it (test/capiagent plays them, the
// provider as its own ServiceAccount), a second kube-apiserver as the
// hosted cluster, and two servers behind Redfish BMCs booted into
// discovery through virtual media. NodePool 0→2: the provider binds both;
// agentboot installs the dev disk image with the day-2 pointer Ignition;
// they reboot from disk, fetch their worker config from the hosted
// cluster's endpoint (token checked), and join as the test plays their
// kubelets: Done, AgentMachines Ready. 2→1: Cluster API deletes one
// Machine; the provider unbinds its Agent and holds the Machine until its
// BMC has booted it into discovery and it is back in the free pool, as the
// same Agent. `kubectl get agents` is recorded at each step.
func TestLabNodePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ie := s.CreateInfraEnv(t, "pool", "pool", func(ie *v1beta1.InfraEnv) {
		ie.Spec.HostRequirements = &v1beta1.HostRequirements{MinCPUCores: 1, MinMemoryMiB: 1024, MinDiskSizeGB: 10}
	})
	cluster := hosted.Start(t)
	ln, err := theLab.Listen("tcp", lab.HostIP+":0")
	require.NoError(t, err)
	endpoint := hosted.IgnitionEndpoint(t, ln, lab.HostIP)
	hc := capiagent.Start(t, s.Env, capiagent.Options{Namespace: s.Namespace(t, "clusters"), Name: "vcluster2", AgentNamespace: ie.Namespace,
		Hosted: cluster, IgnitionEndpoint: endpoint.Addr, IgnitionCA: endpoint.CA, Token: hosted.Token, Provider: true})
	np := hc.NodePool("vcluster2", map[string]string{"pool": "lab"})
	wantRequest := "/ignition Bearer " + hosted.Token + " " + hc.HC.Namespace + "/vcluster2"

	// Two servers enrolled through their BMCs come up in discovery,
	// approved; the admin labels them for the pool.
	hosts := make([]*poolHost, 2)
	for i := range hosts {
		name, mac := fmt.Sprintf("np-%d", i+1), fmt.Sprintf("52:54:00:2d:01:%02d", i+1)
		disk := sparseDisk(t, 20_000_000_000)
		// The disks write at a SATA SSD's pace, so that erasing one takes
		// close to a minute, as on a server, and its power can be cut
		// in the middle.
		h := &poolHost{disk: disk, m: machineOn(t, "br0", vm.Options{Name: name, MAC: mac, MemoryMB: 1536, Disks: []string{disk}, DiskWriteBPS: 400_000_000})}
		h.sim = &bmcsim.Redfish{User: "admin", Password: bmcPassword, Machine: h.m, MediaDir: t.TempDir(), Client: &http.Client{Transport: localTransport{}}}
		h.sim.SetTiming(realBMC)
		t.Cleanup(h.sim.Close)
		srv := httptest.NewServer(h.sim)
		t.Cleanup(srv.Close)
		h.bmh = enroll(t, ie, name, "redfish-virtualmedia+http://"+strings.TrimPrefix(srv.URL, "http://")+"/redfish/v1/Systems/1", mac)
		hosts[i] = h
	}
	for _, h := range hosts {
		a := approvedAgent(t, h.bmh, h.m)
		h.agent = a.Name
		patch := client.MergeFrom(a.DeepCopy())
		a.Labels["pool"] = "lab"
		require.NoError(t, s.Client.Patch(ctx, &a, patch))
	}
	for _, h := range hosts {
		h.wait(t, "validated and connected", bootTimeout, func(a *v1beta1.Agent) bool {
			return conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) && conditions.IsTrue(a.Status.Conditions, v1beta1.ConnectedCondition)
		})
	}
	getAgents(t, ie.Namespace, "in the free pool", `\s+true\s+auto-assign\s*$`, hosts...)

	// 0 → 2: the provider binds both; they install, boot their disks and
	// fetch the worker config.
	np.Scale(2)
	for _, h := range hosts {
		h.wait(t, "bound by cluster-api-provider-agent and installing", 2*time.Minute, func(a *v1beta1.Agent) bool {
			return a.Labels["agentMachineRef"] != "" && a.Spec.ClusterDeploymentName != nil && a.Status.Progress.CurrentStage != ""
		})
	}
	getAgents(t, ie.Namespace, "bound, installing", `\s+vcluster2\s+true\s+worker\s+\S+`, hosts...)
	for _, h := range hosts {
		waitWorker(t, h.m.VM(), client.ObjectKey{Namespace: h.bmh.Namespace, Name: h.agent})
		log := h.m.VM().Log()
		require.Contains(t, log, "booted from disk", "%s booted its installed disk", h.bmh.Name)
	}
	require.Contains(t, endpoint.Seen(), wantRequest, "the pointer config reached the endpoint with its token")
	for _, seen := range endpoint.Seen() {
		require.Equal(t, wantRequest, seen, "only requests with the token were made")
	}
	getAgents(t, ie.Namespace, "rebooted into the installed disk", `\s+vcluster2\s+true\s+worker\s+(Rebooting|Configuring)`, hosts...)

	// Each host's kubelet bootstraps, registers its Node, and it turns
	// Ready: Done.
	for _, h := range hosts {
		a := h.get(t)
		k := &hosted.Kubelet{T: t, C: cluster, Name: strings.ToLower(a.Hostname())}
		k.CSR(h.bmh.Name+"-client", hosted.ClientSigner, hosted.Bootstrapper, k.Name, nil, nil, hosted.ClientUsages...)
		require.Eventually(t, func() bool { return k.Approved(h.bmh.Name + "-client") }, 2*time.Minute, time.Second, "%s's client CSR never approved", k.Name)
		k.Register()
		k.Ready()
	}
	for _, h := range hosts {
		h.wait(t, "done", 2*time.Minute, func(a *v1beta1.Agent) bool {
			return a.Status.Progress.CurrentStage == v1beta1.StageDone && a.Status.DebugInfo.State == "added-to-existing-cluster"
		})
	}
	getAgents(t, ie.Namespace, "joined", `\s+vcluster2\s+true\s+worker\s+Done`, hosts...)
	require.Eventually(t, func() bool {
		for _, m := range np.Machines() {
			if ready, _, _ := unstructured.NestedBool(np.AgentMachine(m.GetName()).Object, "status", "ready"); !ready {
				return false
			}
		}
		return true
	}, 2*time.Minute, time.Second, "the AgentMachines never turned Ready")

	// The tenant's data: on each disk, outside the OS image's partitions
	// (written into the disk images: the dev OS runs from memory), and the
	// pointer config with the tenant's token inside them.
	tenantData := []string{tenantMarker, hosted.Token}
	for _, h := range hosts {
		writeMarkers(t, h.disk)
		require.Equal(t, tenantData, findData(t, h.disk, tenantData...), "%s holds the tenant's data before", h.bmh.Name)
	}

	// 2 → 1: Cluster API deletes the newer Machine; the provider unbinds
	// its Agent; its BMC boots it into discovery, where it sanitizes its
	// disks; the provider's hook holds the Machine until the host is back
	// in discovery, and the host is bindable once its evidence is in.
	np.Scale(1)
	var released, kept *poolHost
	var releasedAt time.Time
	require.Eventually(t, func() bool {
		for i, h := range hosts {
			if h.get(t).Spec.ClusterDeploymentName == nil {
				released, kept, releasedAt = h, hosts[1-i], time.Now()
				return true
			}
		}
		return false
	}, 2*time.Minute, time.Second, "scaling to 1 unbound no host")
	released.wait(t, "unbinding, rebooting into discovery", 3*time.Minute, func(a *v1beta1.Agent) bool {
		return a.Status.DebugInfo.State == "unbinding" || a.Status.DebugInfo.State == "known-unbound"
	})
	getAgents(t, ie.Namespace, "one released", `\s+true\s+auto-assign\b`, released)

	// Its power is cut in the middle of the erase, once the host reported
	// progress. Its disk no longer boots the tenant's OS; the controller
	// finds the host off and its BMC boots discovery again; the host starts
	// over in a new session and is never bindable in between.
	progress := regexp.MustCompile(`^\d+%: `)
	released.wait(t, "erasing its disks", bootTimeout, func(a *v1beta1.Agent) bool {
		ds := a.Status.DiskSanitization
		return ds != nil && ds.State == v1beta1.SanitizationRunning && progress.MatchString(ds.Message)
	})
	cut := released.get(t).Status.DiskSanitization
	require.NoError(t, released.m.PowerOff())
	t.Logf("power cut %s after the release, the erase at %q", time.Since(releasedAt).Round(time.Second), cut.Message)
	// The erase goes from the start; its last MiB (the backup GPT, and
	// a tenant marker) was wiped ahead of it, with the first.
	f, err := os.Open(released.disk)
	require.NoError(t, err)
	st, err := f.Stat()
	require.NoError(t, err)
	for _, off := range []int64{0, st.Size() - 1<<20} {
		b := make([]byte, 1<<20)
		_, err = f.ReadAt(b, off)
		require.NoError(t, err)
		require.Equal(t, make([]byte, len(b)), b, "the MiB at %d was wiped before the long erase", off)
	}
	f.Close()
	bindableEarly := ""
	released.wait(t, "sanitized, back in the free pool", bootTimeout+installTimeout, func(a *v1beta1.Agent) bool {
		ds := a.Status.DiskSanitization
		done := ds != nil && ds.State == v1beta1.SanitizationDone
		if !done && conditions.IsTrue(a.Status.Conditions, v1beta1.ValidatedCondition) && bindableEarly == "" {
			bindableEarly = fmt.Sprintf("%+v", ds)
		}
		return a.Spec.ClusterDeploymentName == nil && a.Status.DebugInfo.State == "known-unbound" && a.Status.Progress.CurrentStage == "" && done
	})
	require.Empty(t, bindableEarly, "the host was Validated before its disks were sanitized")
	t.Logf("released host sanitized and back in the pool %s after the provider unbound it", time.Since(releasedAt).Round(time.Second))
	ds := released.get(t).Status.DiskSanitization
	require.NotEqual(t, cut.Session, ds.Session, "the erase cut short was done again in the host's next boot")
	t.Logf("evidence: %s", ds.Message)
	require.Equal(t, "erase", ds.Level)
	methods := map[string]string{}
	for _, d := range ds.Disks {
		methods[d.Disk] = d.Method
		if d.Disk == "/dev/vda" {
			require.Contains(t, d.Checked, "read back as zeros (read with O_DIRECT)")
		}
	}
	require.Equal(t, map[string]string{"/dev/vda": "write-zeroes", "/dev/sr0": "skip"}, methods,
		"qemu's virtio disk zeroes ranges itself; the virtual media CD is the boot medium")
	require.Empty(t, findData(t, released.disk, tenantData...), "the released host's disk still holds the tenant's data")
	require.Equal(t, tenantData, findData(t, kept.disk, tenantData...), "the host still in the cluster keeps its data")
	require.Eventually(t, func() bool { return len(np.Machines()) == 1 }, 2*time.Minute, time.Second, "the pre-terminate hook was never released")
	require.Eventually(t, func() bool {
		_, err := cluster.Admin.CoreV1().Nodes().Get(ctx, strings.ToLower(released.get(t).Hostname()), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, time.Second, "Cluster API deletes the released host's Node")
	require.GreaterOrEqual(t, strings.Count(strings.Join(released.sim.Events(), "\n"), "power on cdrom"), 3,
		"the BMC booted the released host from the discovery ISO after its release and after the power cut: %v", released.sim.Events())
	kept.wait(t, "still done", time.Second, func(a *v1beta1.Agent) bool {
		return a.Spec.ClusterDeploymentName != nil && a.Status.Progress.CurrentStage == v1beta1.StageDone
	})
	getAgents(t, ie.Namespace, "scaled down to 1", `\s+vcluster2\s+true\s+worker\s+Done`, kept)
	getAgents(t, ie.Namespace, "scaled down to 1", `\s+true\s+auto-assign\s*$`, released)
}

// tenantMarker is what the lab writes as a tenant's data.
const tenantMarker = "AGENTBOOT-LAB-TENANT-DATA"

// writeMarkers writes the tenant marker into a disk image past the OS
// image (which is well under 1 GiB) and in its last block.
func writeMarkers(t *testing.T, disk string) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	for _, off := range []int64{1 << 30, 10_000_000_000 + 17, st.Size() - 4096} {
		_, err := f.WriteAt([]byte(tenantMarker), off)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
}

// findData says which of texts a sparse disk image holds, reading only its
// allocated extents (SEEK_DATA), so that a 20 GB image takes a moment.
func findData(t *testing.T, disk string, texts ...string) []string {
	t.Helper()
	f, err := os.Open(disk)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	found := map[string]bool{}
	const overlap = 4096
	buf := make([]byte, 4<<20+overlap)
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // nothing but a hole to the end
		}
		require.NoError(t, err)
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		require.NoError(t, err)
		for pos := data; pos < hole; pos += int64(len(buf) - overlap) {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if err != nil && !errors.Is(err, io.EOF) {
				require.NoError(t, err)
			}
			for _, text := range texts {
				found[text] = found[text] || bytes.Contains(buf[:n], []byte(text))
			}
		}
		off = hole
	}
	var out []string
	for _, text := range texts {
		if found[text] {
			out = append(out, text)
		}
	}
	return out
}

func (h *poolHost) get(t *testing.T) *v1beta1.Agent {
	t.Helper()
	a := &v1beta1.Agent{}
	require.NoError(t, s.Client.Get(context.Background(), client.ObjectKey{Namespace: h.bmh.Namespace, Name: h.agent}, a))
	return a
}

// wait polls the host's Agent until ok, failing with its state and the
// host's console.
func (h *poolHost) wait(t *testing.T, what string, timeout time.Duration, ok func(*v1beta1.Agent) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		a := h.get(t)
		if ok(a) {
			return
		}
		if time.Now().After(deadline) {
			tail := ""
			if v := h.m.VM(); v != nil {
				tail = v.Tail(40)
			}
			t.Fatalf("%s (Agent %s) never %s: state %q, progress %+v, conditions %+v\nserial log:\n%s",
				h.bmh.Name, h.agent, what, a.Status.DebugInfo.State, a.Status.Progress, a.Status.Conditions, tail)
		}
		time.Sleep(2 * time.Second)
	}
}

// getAgents records `kubectl get agents` and checks each host's row
// against the shape in api.md (NAME CLUSTER APPROVED ROLE STAGE): its
// columns after the name match cols.
func getAgents(t *testing.T, ns, step, cols string, hosts ...*poolHost) {
	t.Helper()
	out, err := s.Env.Kubectl(context.Background(), "", "-n", ns, "get", "agents")
	require.NoError(t, err)
	t.Logf("kubectl get agents (%s):\n%s", step, out)
	require.Regexp(t, `^NAME\s+CLUSTER\s+APPROVED\s+ROLE\s+STAGE\n`, out)
	for _, h := range hosts {
		require.Regexp(t, `(?m)^`+h.agent+cols, out, "%s: row of %s", step, h.bmh.Name)
	}
}
