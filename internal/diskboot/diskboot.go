// Package diskboot tells the image service which network-booting hosts
// were installed and now boot from their disks, without letting it read
// Agents (whose registration records it has no business with): the
// manager keeps, for every Agent that boots from its disk
// (lifecycle.BootsFromDisk), a ConfigMap in agentboot's namespace with the
// Agent's namespace, the InfraEnv it registered through and its MACs, and
// deletes it when the Agent no longer does or is gone. The image service
// caches those ConfigMaps and looks MACs up in them.
package diskboot

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentrecord"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/observe"
)

// Label marks the records (value "true").
const Label = "agentboot.io/disk-boot"

// Keys of a record.
const (
	keyInfraEnv = "infraEnv" // the InfraEnv it registered through
	keyMACs     = "macs"     // lowercased, comma-separated
)

// Indexes of the records in a cache.
const (
	// MACIndex finds records by "<agent namespace>/<mac>" and by
	// "<agent namespace>/<infraenv>/<mac>".
	MACIndex = "agentboot.diskBootMAC"
	// AgentIndex finds records by "<namespace>/<name>" of their Agent.
	AgentIndex = "agentboot.diskBootAgent"
)

// Name is the record's name for the Agent.
func Name(a *v1beta1.Agent) string { return "disk-boot-" + string(a.UID) }

// For is the record of a, in namespace, or nil when a does not boot from
// its disk (or reported no MAC).
func For(namespace string, a *v1beta1.Agent) *corev1.ConfigMap {
	macs := macindex.AgentMACs(a)
	if !lifecycle.BootsFromDisk(a) || len(macs) == 0 || !a.DeletionTimestamp.IsZero() {
		return nil
	}
	slices.Sort(macs)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: Name(a), Labels: map[string]string{Label: "true", "app.kubernetes.io/part-of": "agentboot"}},
		Data: map[string]string{
			agentrecord.AgentKey: agentrecord.Of(a),
			keyInfraEnv:          lifecycle.Registration(a).InfraEnv,
			keyMACs:              strings.Join(slices.Compact(macs), ","),
		},
	}
}

func macKeys(o client.Object) []string {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok || cm.Labels[Label] != "true" {
		return nil
	}
	ns, _, ok := strings.Cut(cm.Data[agentrecord.AgentKey], "/")
	if !ok || cm.Data[keyMACs] == "" {
		return nil
	}
	var keys []string
	for _, mac := range strings.Split(cm.Data[keyMACs], ",") {
		keys = append(keys, ns+"/"+mac)
		if ie := cm.Data[keyInfraEnv]; ie != "" {
			keys = append(keys, ns+"/"+ie+"/"+mac)
		}
	}
	return keys
}

var registered sync.Map // client.FieldIndexer → *onceErr

type onceErr struct {
	sync.Once
	err error
}

// Register adds the indexes to idx, once per idx (the manager and the
// image service may share one in `make run`).
func Register(idx client.FieldIndexer) error {
	v, _ := registered.LoadOrStore(idx, &onceErr{})
	o := v.(*onceErr)
	o.Do(func() {
		if o.err = idx.IndexField(context.Background(), &corev1.ConfigMap{}, MACIndex, macKeys); o.err == nil {
			o.err = idx.IndexField(context.Background(), &corev1.ConfigMap{}, AgentIndex, agentrecord.IndexBy(Label))
		}
	})
	return o.err
}

// BootsFromDisk reports whether an Agent in namespace with mac (of the
// InfraEnv infraEnv, when not "") boots from its disk, from the records in
// r (a cache with Register's indexes, over agentboot's namespace).
func BootsFromDisk(ctx context.Context, r client.Reader, namespace, mac, infraEnv string) (bool, error) {
	key := namespace + "/" + strings.ToLower(mac)
	if infraEnv != "" {
		key = namespace + "/" + infraEnv + "/" + strings.ToLower(mac)
	}
	var list corev1.ConfigMapList
	if err := r.List(ctx, &list, client.MatchingFields{MACIndex: key}); err != nil {
		return false, err
	}
	return len(list.Items) > 0, nil
}

// Reconciler keeps the records (in the manager).
type Reconciler struct {
	Client    client.Client
	Namespace string
	// Passes, when set, is told of each finished pass over an Agent:
	// tests wait on passes, not on the wall clock.
	Passes observe.Hook
}

// SetupWithManager follows Agents and the records.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := Register(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return agentrecord.Watch(ctrl.NewControllerManagedBy(mgr).
		Named("disk-boot").
		For(&v1beta1.Agent{}), r.Namespace, Label).
		Complete(observe.Passes(r, r.Passes))
}

// Reconcile makes one Agent's record current.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var want *corev1.ConfigMap
	a := &v1beta1.Agent{}
	switch err := r.Client.Get(ctx, req.NamespacedName, a); {
	case err == nil:
		want = For(r.Namespace, a)
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	again, err := agentrecord.Sync(ctx, r.Client, nil, r.Namespace, AgentIndex, req.Namespace+"/"+req.Name, want, func(have, want *corev1.ConfigMap) bool {
		return maps.Equal(have.Data, want.Data) && have.Labels[Label] == "true"
	})
	if again {
		return ctrl.Result{RequeueAfter: time.Second}, err
	}
	return ctrl.Result{}, err
}
