package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/test/bindtest"
)

// bindSome leaves a share of the registered hosts as a site's pool holds
// them once NodePools took some: bound (the fraction bound) through
// AgentMachines of a hosted cluster per InfraEnv namespace, as
// cluster-api-provider-agent binds them, and installed (stage Done); and
// installing (the fraction installing): bound, rebooted into their
// installation, their Node in the hosted cluster not Ready yet (stage
// Joined), which the manager polls every 10 s. Neither runs the agent any
// more (stop ends a host's heartbeats). The hosted clusters' apiserver is
// the bench's own. It returns how many of each it made.
func bindSome(ctx context.Context, c client.Client, cfg *rest.Config, kubeconfig string, hosts []*host, stop []context.CancelFunc, namespaces []string, bound, installing float64) (nBound, nInstalling int, err error) {
	kc, err := os.ReadFile(kubeconfig)
	if err != nil {
		return 0, 0, err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clusters"}}); err != nil {
		return 0, 0, err
	}
	clusters := map[string]bindtest.Names{}
	for _, ns := range namespaces {
		n := bindtest.Names{HCNamespace: "clusters", HCName: "hc-" + ns, AgentNamespace: ns}
		clusters[ns] = n
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.CP()}}); err != nil {
			return 0, 0, err
		}
		objs := append(n.Objects(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: n.CP(), Name: bindtest.KubeconfigSecret},
			Data: map[string][]byte{"kubeconfig": kc}})
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				return 0, 0, fmt.Errorf("hosted cluster %s: %w", n.HCName, err)
			}
		}
	}
	var nb, ni atomic.Int64
	work := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				h := hosts[i]
				share := float64(i%100) / 100
				stage := v1beta1.StageJoined
				switch {
				case share < installing:
					ni.Add(1)
				case share < installing+bound:
					stage = v1beta1.StageDone
					nb.Add(1)
				default:
					continue
				}
				stop[i]()
				if err := bindHost(ctx, c, clusters[h.ns], h, stage); err != nil {
					select {
					case errs <- fmt.Errorf("host %d: %w", h.i, err):
					default:
					}
				}
			}
		}()
	}
	for i, h := range hosts {
		if h != nil && h.token != "" {
			work <- i
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return 0, 0, err
	default:
	}
	return int(nb.Load()), int(ni.Load()), nil
}

// bindHost binds host h to an AgentMachine of cluster n and leaves its
// installation at stage; a Joined host's Node exists and is not Ready.
func bindHost(ctx context.Context, c client.Client, n bindtest.Names, h *host, stage v1beta1.HostStage) error {
	am := n.AgentMachine("m-" + h.id[len(h.id)-12:])
	if err := c.Create(ctx, am); err != nil {
		return err
	}
	n.Reference(am, h.id)
	if err := c.Status().Update(ctx, am); err != nil {
		return err
	}
	node := fmt.Sprintf("host-%d", h.i+1)
	key := client.ObjectKey{Namespace: h.ns, Name: h.id}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a := &v1beta1.Agent{}
		if err := c.Get(ctx, key, a); err != nil {
			return err
		}
		n.Bound(a, am.GetName())
		a.Spec.Approved = true
		return c.Update(ctx, a)
	}); err != nil {
		return err
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a := &v1beta1.Agent{}
		if err := c.Get(ctx, key, a); err != nil {
			return err
		}
		now := metav1.Now()
		if a.Status.Registration == nil {
			return fmt.Errorf("agent %s has no registration", key)
		}
		a.Status.Registration.NodeName = node
		a.Status.Progress = v1beta1.HostProgressInfo{CurrentStage: stage, StageStartTime: &now, StageUpdateTime: &now}
		return c.Status().Update(ctx, a)
	}); err != nil {
		return err
	}
	if stage != v1beta1.StageJoined {
		return nil
	}
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// settledBound reports how many of the bound and installing hosts the
// manager has taken in: the installed ones shown so, the installing ones
// polled (the worker said why they are not done). An installing or
// installed host stays Connected, as assisted-service has it.
func settledBound(ctx context.Context, c client.Client, namespaces []string) int {
	return countAgents(ctx, c, namespaces, func(a *v1beta1.Agent) bool {
		switch p := a.Status.Progress; p.CurrentStage {
		case v1beta1.StageDone:
			return a.Status.DebugInfo.State == lifecycle.StateAddedToExistingCluster
		case v1beta1.StageJoined:
			return p.ProgressInfo != ""
		}
		return false
	})
}

// perSecond formats counts between two readings as rates, by resource.
func perSecond(r0, r1 map[string]int64, seconds float64) string {
	parts, _ := per(r0, r1, seconds, "%s %.1f/s")
	return parts
}
