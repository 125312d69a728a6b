// Package agentclassification labels Agents by their hardware, as
// assisted-service's AgentClassification does: an AgentClassification names
// a label and a jq query over an Agent's status.inventory, and every Agent
// of its namespace for which the query gives true gets
// agentclassification.agent-install.openshift.io/<labelKey>=<labelValue>;
// one the query fails on gets the value QUERYERROR-<labelValue>; the others
// none. A NodePool's agentLabelSelector then picks hosts by those labels.
//
// Two controllers: one keeps each Agent's labels (on a change of its
// inventory or of the namespace's classifications), one keeps each
// classification's status (counts, whether its query compiles and fails
// anywhere) and, through a finalizer, takes its labels off every Agent
// before it goes.
//
// The query is a program run by the manager: it sees the Agent's
// inventory and nothing else (an empty environment for $ENV and env), it
// runs for at most Config.Timeout on one Agent, and its only effect is one
// label of a fixed value on Agents of its own namespace. Its memory is not
// bounded (one jq operation can allocate gigabytes), so the controllers
// run only where the manager is told to (--agent-classifications).
package agentclassification

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/itchyny/gojq"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
)

// Finalizer holds a classification until no Agent has its label.
const Finalizer = "agentboot.io/agentclassification-labels"

// DefaultTimeout bounds one query on one Agent's inventory.
const DefaultTimeout = 100 * time.Millisecond

// Config configures the controllers.
type Config struct {
	Log logr.Logger
	// Timeout bounds one query on one Agent (default DefaultTimeout).
	Timeout time.Duration
	// Matcher runs the queries (default: InProcess, bounded in time only;
	// the manager runs them in a Sandbox).
	Matcher Matcher
}

// SetupWithManager adds both controllers to mgr.
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Matcher == nil {
		cfg.Matcher = InProcess{Timeout: cfg.Timeout}
	}
	q := &programs{byName: map[types.NamespacedName]program{}}
	c := mgr.GetClient()
	agents := &agentReconciler{c: c, programs: q, matcher: cfg.Matcher, log: cfg.Log.WithName("agent-labels")}
	if err := ctrl.NewControllerManagedBy(mgr).Named("agentclassification-labels").
		For(&v1beta1.Agent{}, builder.WithPredicates(inventoryOrLabelsChanged())).
		// A classification's spec or deletion changes labels; its status
		// and finalizer do not.
		Watches(&v1beta1.AgentClassification{}, handler.EnqueueRequestsFromMapFunc(inNamespace(c, func() client.ObjectList { return &v1beta1.AgentList{} })),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deletionStarted()))).
		Complete(agents); err != nil {
		return err
	}
	classes := &classificationReconciler{c: c, programs: q, log: cfg.Log.WithName("agentclassification")}
	return ctrl.NewControllerManagedBy(mgr).Named("agentclassification").
		For(&v1beta1.AgentClassification{}).
		// Which one of a key decides changes with the others.
		Watches(&v1beta1.AgentClassification{}, handler.EnqueueRequestsFromMapFunc(inNamespace(c, func() client.ObjectList { return &v1beta1.AgentClassificationList{} })),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deletionStarted()))).
		Watches(&v1beta1.Agent{}, handler.EnqueueRequestsFromMapFunc(inNamespace(c, func() client.ObjectList { return &v1beta1.AgentClassificationList{} })), builder.WithPredicates(classificationLabelsChanged())).
		Complete(classes)
}

// readOnly lists the cache's objects without copying them (every Agent's
// inventory, on every pass): the lists below are only read.
var readOnly = client.UnsafeDisableDeepCopy

// program is a compiled query, for one generation of a classification.
type program struct {
	uid        types.UID
	generation int64
	code       *gojq.Code
	err        error
}

// programs caches compiled queries by classification, one entry for each
// that exists (forget drops the entry of one that is gone).
type programs struct {
	mu     sync.Mutex
	byName map[types.NamespacedName]program
}

// compile is c's query compiled, or why it does not compile.
func (p *programs) compile(c *v1beta1.AgentClassification) (*gojq.Code, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
	if prog, ok := p.byName[key]; ok && prog.uid == c.UID && prog.generation == c.Generation {
		return prog.code, prog.err
	}
	code, err := Compile(c.Spec.Query)
	p.byName[key] = program{uid: c.UID, generation: c.Generation, code: code, err: err}
	return code, err
}

func (p *programs) forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byName, key)
}

// Compile compiles a query as the controllers run it: with an empty
// environment ($ENV and env see nothing of the manager's; gojq's default,
// said here so that it stays so) and no input but the inventory.
func Compile(query string) (*gojq.Code, error) {
	q, err := gojq.Parse(query)
	if err != nil {
		return nil, fmt.Errorf("query does not parse: %w", err)
	}
	code, err := gojq.Compile(q, gojq.WithEnvironLoader(func() []string { return nil }))
	if err != nil {
		return nil, fmt.Errorf("query does not compile: %w", err)
	}
	return code, nil
}

// Match runs code on inventory (JSON-shaped, as json.Unmarshal makes it):
// its first result must be a boolean, within timeout.
func Match(ctx context.Context, code *gojq.Code, inventory any, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	iter := code.RunWithContext(ctx, inventory)
	v, ok := iter.Next()
	if !ok {
		return false, errors.New("the query gave no result")
	}
	if err, ok := v.(error); ok {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return false, fmt.Errorf("the query ran longer than %s", timeout)
		}
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("the query gave %s, not a boolean", kind(v))
	}
	return b, nil
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return "a number"
	}
}

// inventory is the Agent's inventory as a query sees it: the JSON of
// status.inventory.
func inventory(a *v1beta1.Agent) ([]byte, error) { return json.Marshal(a.Status.Inventory) }

// winners are the namespace's live classifications that decide a label
// key: for each key the one with the first name (ordered), so that two
// classifications of one key do not fight over the value.
func winners(list []v1beta1.AgentClassification) map[string]*v1beta1.AgentClassification {
	slices.SortFunc(list, func(a, b v1beta1.AgentClassification) int { return strings.Compare(a.Name, b.Name) })
	out := map[string]*v1beta1.AgentClassification{}
	for i := range list {
		c := &list[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		if _, taken := out[c.Spec.LabelKey]; !taken {
			out[c.Spec.LabelKey] = c
		}
	}
	return out
}

type agentReconciler struct {
	c        client.Client
	programs *programs
	matcher  Matcher
	log      logr.Logger
}

// Reconcile puts on the Agent the labels of the classifications that
// match it and takes off those of the ones that no longer do or are gone.
func (r *agentReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var a v1beta1.Agent
	if err := r.c.Get(ctx, req.NamespacedName, &a); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var list v1beta1.AgentClassificationList
	if err := r.c.List(ctx, &list, client.InNamespace(a.Namespace), readOnly); err != nil {
		return reconcile.Result{}, err
	}
	want := map[string]string{}
	if !a.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	inv, err := inventory(&a)
	if err != nil {
		return reconcile.Result{}, err
	}
	for key, c := range winners(list.Items) {
		if _, err := r.programs.compile(c); err != nil {
			continue // no label; its status says why
		}
		ok, err := r.matcher.Match(ctx, c.Spec.Query, inv)
		switch {
		case err != nil:
			r.log.V(1).Info("query failed", "agent", req.String(), "classification", c.Name, "error", err.Error())
			want[v1beta1.ClassificationLabelPrefix+key] = v1beta1.ClassificationQueryErrorPrefix + c.Spec.LabelValue
		case ok:
			want[v1beta1.ClassificationLabelPrefix+key] = c.Spec.LabelValue
		}
	}
	before := a.DeepCopy()
	changed := false
	for k, v := range a.Labels {
		if !strings.HasPrefix(k, v1beta1.ClassificationLabelPrefix) {
			continue
		}
		if w, ok := want[k]; !ok {
			delete(a.Labels, k)
			changed = true
		} else if w != v {
			a.Labels[k] = w
			changed = true
		}
	}
	for k, w := range want {
		if _, ok := a.Labels[k]; !ok {
			if a.Labels == nil {
				a.Labels = map[string]string{}
			}
			a.Labels[k] = w
			changed = true
		}
	}
	if !changed {
		return reconcile.Result{}, nil
	}
	// Optimistic: labels someone else changed meanwhile are read again.
	err = r.c.Patch(ctx, &a, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return reconcile.Result{Requeue: true}, nil
	}
	return reconcile.Result{}, client.IgnoreNotFound(err)
}

type classificationReconciler struct {
	c        client.Client
	programs *programs
	log      logr.Logger
}

// Reconcile keeps the classification's finalizer and status.
func (r *classificationReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c v1beta1.AgentClassification
	if err := r.c.Get(ctx, req.NamespacedName, &c); err != nil {
		if apierrors.IsNotFound(err) {
			r.programs.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	key := v1beta1.ClassificationLabelPrefix + c.Spec.LabelKey
	var agents v1beta1.AgentList
	if err := r.c.List(ctx, &agents, client.InNamespace(c.Namespace), readOnly); err != nil {
		return reconcile.Result{}, err
	}
	var others v1beta1.AgentClassificationList
	if err := r.c.List(ctx, &others, client.InNamespace(c.Namespace), readOnly); err != nil {
		return reconcile.Result{}, err
	}
	winner := winners(others.Items)[c.Spec.LabelKey]
	decides := winner != nil && winner.UID == c.UID

	if !c.DeletionTimestamp.IsZero() {
		// Its labels come off (the Agents' controller, woken by this
		// change); it goes once none is left, unless another one of the
		// same key has taken them over.
		// Agents being deleted keep theirs: their labels no longer matter.
		for _, a := range agents.Items {
			if _, ok := a.Labels[key]; ok && winner == nil && a.DeletionTimestamp.IsZero() {
				return reconcile.Result{RequeueAfter: time.Second}, nil
			}
		}
		r.programs.forget(req.NamespacedName)
		if controllerutil.RemoveFinalizer(&c, Finalizer) {
			return reconcile.Result{}, client.IgnoreNotFound(r.c.Update(ctx, &c))
		}
		return reconcile.Result{}, nil
	}
	if controllerutil.AddFinalizer(&c, Finalizer) {
		if err := r.c.Update(ctx, &c); err != nil {
			return reconcile.Result{}, err
		}
	}

	status := c.Status.DeepCopy()
	status.MatchedCount, status.ErrorCount = 0, 0
	var failing []string
	if decides {
		for _, a := range agents.Items {
			v, ok := a.Labels[key]
			if !ok {
				continue
			}
			switch v {
			case c.Spec.LabelValue:
				status.MatchedCount++
			case v1beta1.ClassificationQueryErrorPrefix + c.Spec.LabelValue:
				status.ErrorCount++
				failing = append(failing, a.Name)
			}
		}
	}
	now := metav1.Now()
	_, err := r.programs.compile(&c)
	switch {
	case err != nil:
		status.Conditions = conditions.Set(status.Conditions, conditions.New(v1beta1.QueryValidCondition, false, v1beta1.QueryNotValidReason, err.Error()), now)
	case !decides:
		status.Conditions = conditions.Set(status.Conditions, conditions.New(v1beta1.QueryValidCondition, false, "LabelKeyConflict",
			fmt.Sprintf("AgentClassification %s, first by name, already decides the label %s in this namespace: this one labels nothing", winner.Name, key)), now)
	default:
		status.Conditions = conditions.Set(status.Conditions, conditions.New(v1beta1.QueryValidCondition, true, v1beta1.QueryValidReason, "the query compiles"), now)
	}
	if len(failing) > 0 {
		slices.Sort(failing)
		shown := failing
		if len(shown) > 5 {
			shown = shown[:5]
		}
		msg := fmt.Sprintf("the query fails on %d Agent(s) (labelled %s=%s%s): %s", len(failing), key, v1beta1.ClassificationQueryErrorPrefix, c.Spec.LabelValue, strings.Join(shown, ", "))
		status.Conditions = conditions.Set(status.Conditions, conditions.New(v1beta1.QueryErrorsCondition, true, v1beta1.QueryHasErrorsReason, msg), now)
	} else {
		status.Conditions = conditions.Set(status.Conditions, conditions.New(v1beta1.QueryErrorsCondition, false, v1beta1.QueryNoErrorsReason, "the query runs on every Agent of the namespace"), now)
	}
	if reflect.DeepEqual(status, &c.Status) {
		return reconcile.Result{}, nil
	}
	before := c.DeepCopy()
	c.Status = *status
	return reconcile.Result{}, client.IgnoreNotFound(r.c.Status().Patch(ctx, &c, client.MergeFrom(before)))
}

// inventoryOrLabelsChanged passes the Agent events that can change its
// classification labels: a new Agent, a new inventory, or its labels of
// that prefix changed (by someone else).
func inventoryOrLabelsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*v1beta1.Agent)
			n, ok2 := e.ObjectNew.(*v1beta1.Agent)
			if !ok1 || !ok2 {
				return true
			}
			return !reflect.DeepEqual(o.Status.Inventory, n.Status.Inventory) || !reflect.DeepEqual(classLabels(o), classLabels(n))
		},
	}
}

// deletionStarted passes the update that marks an object for deletion.
func deletionStarted() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
	}
}

// classificationLabelsChanged passes the Agent events that change what a
// classification counts.
func classificationLabelsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !reflect.DeepEqual(classLabels(e.ObjectOld), classLabels(e.ObjectNew))
		},
	}
}

func classLabels(o client.Object) map[string]string {
	out := map[string]string{}
	for k, v := range o.GetLabels() {
		if strings.HasPrefix(k, v1beta1.ClassificationLabelPrefix) {
			out[k] = v
		}
	}
	return out
}

// inNamespace maps an object to a request for each object of newList's
// kind in its namespace.
func inNamespace(c client.Client, newList func() client.ObjectList) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := newList()
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace()), readOnly); err != nil {
			return nil
		}
		var out []reconcile.Request
		_ = meta.EachListItem(list, func(item runtime.Object) error {
			if m, ok := item.(client.Object); ok {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)})
			}
			return nil
		})
		return out
	}
}
