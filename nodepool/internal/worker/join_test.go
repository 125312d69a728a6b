package worker

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/lru"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/scheme"
	"github.com/agentboot/agentboot/test/bindtest"
	"github.com/agentboot/agentboot/test/testenv"
)

// The worker polls from a cache, which may not have seen a revocation
// yet: a host whose binding was revoked a moment ago is not called joined,
// nor its Node labelled, however ready its Node is; restored, it is.
func TestJoinConfirmsTheBinding(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	c := env.Client
	sch, err := scheme.New()
	require.NoError(t, err)
	cl := bindtest.NewCluster(t, ctx, c)
	// The hosted cluster is this control plane too.
	kc, err := os.ReadFile(env.Kubeconfig)
	require.NoError(t, err)
	require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: bindtest.CP, Name: bindtest.KubeconfigSecret},
		Data: map[string][]byte{"kubeconfig": kc}}))
	a, am := cl.Bind(ctx, "00000000-0000-4000-8000-000000000001", "vcluster2-abcde")
	a.Spec.NodeLabels = map[string]string{"pool": "a"}
	require.NoError(t, c.Create(ctx, a))
	now := metav1.Now()
	a.Status.Registration = &v1beta1.AgentRegistration{NodeName: "host-1"}
	a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: v1beta1.StageJoined, StageStartTime: &now, StageUpdateTime: &now}
	require.NoError(t, c.Status().Update(ctx, a))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "host-1"}}
	require.NoError(t, c.Create(ctx, node))
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now}}
	require.NoError(t, c.Status().Update(ctx, node))

	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, APIReader: c, Events: rec, Poll: 10 * time.Second, Now: time.Now, refused: lru.New(16),
		Timeouts: Timeouts{Install: 20 * time.Minute, Join: 30 * time.Minute, Ready: 20 * time.Minute}}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(a)}

	// Revoked (the AgentMachine deleted) while the cache still holds it.
	r.Bindings = bindtest.Freeze(t, ctx, c, sch)
	require.NoError(t, c.Delete(ctx, am))
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	got := &v1beta1.Agent{}
	require.NoError(t, c.Get(ctx, req.NamespacedName, got))
	require.Equal(t, v1beta1.StageJoined, got.Status.Progress.CurrentStage, "a host whose binding was revoked is not joined")
	require.Contains(t, got.Status.Progress.ProgressInfo, "waiting: no AgentMachine in namespace clusters-vcluster2 references this Agent")
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(node), node))
	require.NotContains(t, node.Labels, "pool", "its Node is not labelled")
	require.Contains(t, <-rec.Events, "BindingRefused")

	// Restored.
	cl.AgentMachine(ctx, am.GetName(), a.Name)
	r.Bindings = bindtest.Freeze(t, ctx, c, sch)
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.NoError(t, c.Get(ctx, req.NamespacedName, got))
	require.Equal(t, v1beta1.StageDone, got.Status.Progress.CurrentStage)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(node), node))
	require.Equal(t, "a", node.Labels["pool"])
}

// A hosted cluster whose apiserver hangs holds at most half the worker's
// polls for their calls' timeout: the next poll of one of its hosts is put
// off at once, leaving the worker to other tenants' clusters.
func TestHungClusterHoldsHalfThePolls(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{HyperShift: true})
	ctx := context.Background()
	c := env.Client
	cl := bindtest.NewCluster(t, ctx, c)
	var mu sync.Mutex
	inFlight := 0
	release := make(chan struct{})
	hung := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		mu.Unlock()
		<-release
		http.Error(w, "hung", http.StatusServiceUnavailable)
	}))
	defer hung.Close()
	defer close(release)
	kc, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": {Server: hung.URL, CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hung.Certificate().Raw})}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"u": {Token: "t"}},
		Contexts:       map[string]*clientcmdapi.Context{"x": {Cluster: "c", AuthInfo: "u"}},
		CurrentContext: "x",
	})
	require.NoError(t, err)
	require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: bindtest.CP, Name: bindtest.KubeconfigSecret},
		Data: map[string][]byte{"kubeconfig": kc}}))
	var reqs []ctrl.Request
	for i := range maxPollsPerCluster + 1 {
		a, _ := cl.Bind(ctx, fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), fmt.Sprintf("vcluster2-m%d", i))
		require.NoError(t, c.Create(ctx, a))
		now := metav1.Now()
		a.Status.Registration = &v1beta1.AgentRegistration{NodeName: fmt.Sprintf("host-%d", i+1)}
		a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: v1beta1.StageJoined, StageStartTime: &now, StageUpdateTime: &now}
		require.NoError(t, c.Status().Update(ctx, a))
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(a)})
	}
	r := &Reconciler{Client: c, APIReader: c, Bindings: c, Events: events.NewFakeRecorder(100), Poll: 10 * time.Second, JoinPoll: 2 * time.Second,
		CallTimeout: time.Minute, Now: time.Now, refused: lru.New(16),
		Timeouts: Timeouts{Install: 20 * time.Minute, Join: 30 * time.Minute, Ready: 20 * time.Minute}}
	done := make(chan struct{}, maxPollsPerCluster)
	for _, req := range reqs[:maxPollsPerCluster] {
		go func() {
			_, _ = r.Reconcile(ctx, req)
			done <- struct{}{}
		}()
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return inFlight == maxPollsPerCluster }, 30*time.Second, 10*time.Millisecond,
		"half the worker's polls wait on the hung apiserver")
	res, err := r.Reconcile(ctx, reqs[maxPollsPerCluster])
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, res.RequeueAfter, "the next poll of the hung cluster is put off")
	mu.Lock()
	require.Equal(t, maxPollsPerCluster, inFlight, "and made no call to it")
	mu.Unlock()
	for range maxPollsPerCluster {
		release <- struct{}{}
	}
	for range maxPollsPerCluster {
		<-done
	}
}
