// Package baremetalhost is the BareMetalHost controller: it registers each
// host's BMC, keeps its power as spec.online says, boots hosts labelled with
// an InfraEnv into discovery (virtual media or PXE) and approves the Agent
// that registers from the host's boot MAC. It never writes a BareMetalHost's
// spec.
package baremetalhost

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/address"
	"github.com/agentboot/agentboot/bmc/internal/driver"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/observe"
	"github.com/agentboot/agentboot/internal/signing"
)

// Annotations and the finalizer agentboot reads or sets on BareMetalHosts.
const (
	// Finalizer lets the controller act (power off, eject) before a host
	// goes away.
	Finalizer = "agentboot.io/baremetalhost"
	// PowerOffOnDeleteAnnotation "true" powers the server off when its
	// BareMetalHost is deleted; by default deleting only forgets it.
	PowerOffOnDeleteAnnotation = "agentboot.io/power-off-on-delete"
	// PausedAnnotation (metal3's) stops all reconciliation of the host.
	PausedAnnotation = "baremetalhost.metal3.io/paused"
	// DetachedAnnotation (metal3's) keeps the host but stops BMC actions.
	DetachedAnnotation = "baremetalhost.metal3.io/detached"
	// DiscoveryBootAnnotation is when the controller last booted the host
	// into discovery (RFC 3339): an Agent registered from its boot MAC
	// before then is not approved automatically.
	DiscoveryBootAnnotation = "agentboot.io/discovery-booted-at"
	// ejectedAnnotation marks a deleted host whose virtual media is out.
	ejectedAnnotation = "agentboot.io/media-ejected"
)

// cacheLagRequeue is how soon a host is looked at again when the cache
// does not have this controller's last write of it yet.
const cacheLagRequeue = 100 * time.Millisecond

// Dialer opens a BMC session; driver.Open in production.
type Dialer func(ctx context.Context, a address.Address, c driver.Credentials, o driver.Options) (driver.BMC, error)

// Reconciler reconciles BareMetalHosts.
type Reconciler struct {
	Client  client.Client
	Secrets client.Reader // read, not watched: credentials are fetched when used
	Events  events.EventRecorder
	Dial    Dialer
	Driver  driver.Options
	// MaxConcurrent bounds how many BMCs are being talked to at once.
	MaxConcurrent int
	// PowerPoll is how often a pending power change is checked (5s).
	PowerPoll time.Duration
	// PowerTimeout is how long a BMC may take to report a power state it
	// accepted a request for before the request is sent again (1m); after
	// three requests it is an error.
	PowerTimeout time.Duration
	// SoftPowerOffTimeout is how long the OS gets to shut down after a
	// graceful shutdown request before the power is cut (3m).
	SoftPowerOffTimeout time.Duration
	// EjectOnDeleteTimeout is how long a deleted host's virtual media
	// eject is retried before the host is let go with a warning (10m).
	EjectOnDeleteTimeout time.Duration
	// Resync re-reads every host's credentials and power state this often
	// (1m, as Ironic syncs power state).
	Resync time.Duration
	// BackoffBase and BackoffCap shape the retry delay after errors.
	BackoffBase, BackoffCap time.Duration
	// Keys sign the boot proofs of inserted ISOs.
	Keys signing.Source
	// Networks, when set, are the only networks BMC addresses may be in.
	Networks []netip.Prefix
	// Resolve looks names up (net.DefaultResolver in production).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Clock tells the time the controller's own power and media windows
	// are measured in (the real clock unless a test sets one). Times it
	// writes for others to compare with theirs (status, annotations, boot
	// proofs) are the wall clock's.
	Clock clock.PassiveClock
	// Passes, when set, is told of each finished pass that looked at the
	// host: tests wait on passes, not on the wall clock.
	Passes observe.Hook

	bmcLocks keyedMutex
	mu       sync.Mutex
	hosts    map[types.NamespacedName]*memory
}

func (r *Reconciler) defaults() {
	if r.MaxConcurrent <= 0 {
		r.MaxConcurrent = 8
	}
	if r.PowerPoll <= 0 {
		r.PowerPoll = 5 * time.Second
	}
	if r.PowerTimeout <= 0 {
		r.PowerTimeout = time.Minute
	}
	if r.SoftPowerOffTimeout <= 0 {
		r.SoftPowerOffTimeout = 3 * time.Minute
	}
	if r.EjectOnDeleteTimeout <= 0 {
		r.EjectOnDeleteTimeout = 10 * time.Minute
	}
	if r.Resync <= 0 {
		r.Resync = time.Minute
	}
	if r.BackoffBase <= 0 {
		r.BackoffBase = 5 * time.Second
	}
	if r.BackoffCap <= 0 {
		r.BackoffCap = 3 * time.Minute
	}
	if r.Dial == nil {
		r.Dial = driver.Open
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.hosts = map[types.NamespacedName]*memory{}
}

// stale is true when the cached host is one this controller has since
// written; otherwise the record of earlier writes is dropped.
func (r *Reconciler) stale(host *metal3.BareMetalHost) bool {
	mem := r.memoryOf(host)
	if slices.Contains(mem.written, host.ResourceVersion) {
		return true
	}
	mem.written = nil
	return false
}

// update writes the host (or its status, or a patch of it) and records the
// resourceVersion it replaced.
func (r *Reconciler) update(host *metal3.BareMetalHost, write func() error) error {
	before := host.ResourceVersion
	if err := write(); err != nil {
		return err
	}
	mem := r.memoryOf(host)
	mem.written = append(mem.written, before)
	return nil
}

// SetupWithManager registers the controller. MaxConcurrent workers bound
// the BMC calls in flight; controller-runtime never reconciles one host
// twice at once, and bmcLocks serialise hosts that share a BMC.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.defaults()
	if err := macindex.Register(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("baremetalhost").
		// Not on our own status writes: a failing host would retry at
		// once instead of after its backoff.
		For(&metal3.BareMetalHost{}, builder.WithPredicates(predicate.Or[client.Object](
			predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return !e.ObjectNew.GetDeletionTimestamp().Equal(e.ObjectOld.GetDeletionTimestamp())
			}}))).
		Watches(&v1beta1.Agent{}, handler.EnqueueRequestsFromMapFunc(r.hostsForAgent)).
		Watches(&v1beta1.InfraEnv{}, handler.EnqueueRequestsFromMapFunc(r.hostsForInfraEnv)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrent}).
		Complete(observe.Passes(r, r.Passes))
}

// Reconcile drives one BareMetalHost.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	host := &metal3.BareMetalHost{}
	if err := r.Client.Get(ctx, req.NamespacedName, host); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName) // also when its finalizer was removed by hand
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, paused := host.Annotations[PausedAnnotation]; paused {
		return ctrl.Result{}, nil
	}
	if r.stale(host) {
		// This pass wrote the host a moment ago and the cache has not
		// caught up: acting on the old state would repeat BMC requests.
		observe.Skip(ctx)
		return ctrl.Result{RequeueAfter: cacheLagRequeue}, nil
	}
	if !host.DeletionTimestamp.IsZero() {
		return r.delete(ctx, host)
	}
	if !controllerutil.ContainsFinalizer(host, Finalizer) {
		controllerutil.AddFinalizer(host, Finalizer)
		if err := r.update(host, func() error { return r.Client.Update(ctx, host) }); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := host.Status.DeepCopy()
	agent, err := r.matchAgent(ctx, host)
	if err != nil {
		return ctrl.Result{}, err
	}
	if agent != nil {
		// What the admin asks of the disks never stops the pass (the
		// power and boots of the host): a failure is said, and retried
		// at the next pass.
		if err := r.diskRequests(ctx, host, agent); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "disk requests", "host", req.NamespacedName)
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "DiskRequestsFailed", "Sanitize", "%v", err)
		}
	}
	var res step
	if _, detached := host.Annotations[DetachedAnnotation]; detached {
		host.Status.OperationalStatus = metal3.OperationalStatusDetached
	} else {
		res = r.drive(ctx, host, agent, before.PoweredOn)
	}
	if err := r.writeStatus(ctx, host, before, res); err != nil {
		return ctrl.Result{}, err
	}
	res.errCount = host.Status.ErrorCount
	return res.result(r), nil
}

// drive opens the BMC and runs the handler of the host's state.
func (r *Reconciler) drive(ctx context.Context, host *metal3.BareMetalHost, agent *v1beta1.Agent, wasOn bool) step {
	if host.Status.Provisioning.State == metal3.StateNone {
		host.Status.Provisioning.State = metal3.StateRegistering
	}
	return r.withBMC(ctx, host, func(bmc driver.BMC, addr address.Address, power driver.Power) step {
		h := &hostRun{r: r, host: host, bmc: bmc, addr: addr, agent: agent, power: power, wasOn: wasOn}
		handler, ok := stateHandlers[h.state()]
		if !ok {
			// A state only metal3 uses (inspecting, preparing, ...): start over.
			host.Status.Provisioning.State = metal3.StateRegistering
			handler = stateHandlers[metal3.StateRegistering]
		}
		return handler(h, ctx)
	})
}

// withBMC runs fn with an open session to the host's BMC, one at a time
// per BMC, after reading the power state into the status.
func (r *Reconciler) withBMC(ctx context.Context, host *metal3.BareMetalHost, fn func(driver.BMC, address.Address, driver.Power) step) step {
	return r.withSession(ctx, host, func(bmc driver.BMC, addr address.Address, errType metal3.ErrorType) step {
		power, err := bmc.PowerState(ctx)
		if err != nil {
			return failed(errType, err)
		}
		host.Status.PoweredOn = power.IsOn()
		return fn(bmc, addr, power)
	})
}

// withSession runs fn with an open session to the host's BMC, one at a
// time per BMC; errType classifies a failure of its first call.
func (r *Reconciler) withSession(ctx context.Context, host *metal3.BareMetalHost, fn func(driver.BMC, address.Address, metal3.ErrorType) step) step {
	unlock := r.bmcLocks.lock(host.Spec.BMC.Address)
	defer unlock()
	bmc, addr, res := r.open(ctx, host)
	if res.err != nil {
		return res
	}
	defer bmc.Close()
	return fn(bmc, addr, res.errType)
}

// open parses the address, reads the credentials and connects.
func (r *Reconciler) open(ctx context.Context, host *metal3.BareMetalHost) (driver.BMC, address.Address, step) {
	errType := metal3.PowerManagementError
	if host.Status.Provisioning.State == metal3.StateNone || host.Status.Provisioning.State == metal3.StateRegistering {
		errType = metal3.RegistrationError
	}
	a, err := address.Parse(host.Spec.BMC.Address)
	if err != nil {
		return nil, address.Address{}, failed(metal3.RegistrationError, err)
	}
	pins, err := r.resolve(ctx, a)
	if err != nil {
		return nil, address.Address{}, failed(metal3.RegistrationError, err)
	}
	if host.Spec.BMC.CredentialsName == "" {
		return nil, address.Address{}, failed(metal3.RegistrationError, errors.New("spec.bmc.credentialsName is empty"))
	}
	creds, ca, err := r.credentials(ctx, host)
	if err != nil {
		return nil, address.Address{}, failed(metal3.RegistrationError, err)
	}
	opts := r.Driver
	opts.InsecureTLS = host.Spec.BMC.DisableCertificateVerification
	opts.Pins = pins
	if ca != nil {
		opts.RootCAs = ca
	}
	bmc, err := r.Dial(ctx, a, creds, opts)
	if err != nil {
		return nil, address.Address{}, failed(errType, fmt.Errorf("BMC %s: %w", a.Endpoint(), err))
	}
	// errType tells the caller how to classify its first call's failure.
	return bmc, a, step{errType: errType}
}

// resolve returns the addresses to connect to the BMC at: an IP literal, or
// every address its name resolves to, each checked against Networks.
// Connections go to those addresses only (driver.Options.Pins), so what was
// checked is what is reached.
func (r *Reconciler) resolve(ctx context.Context, a address.Address) ([]netip.Addr, error) {
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(a.Host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		resolve := r.Resolve
		if resolve == nil {
			resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			}
		}
		if addrs, err = resolve(ctx, a.Host); err != nil {
			return nil, fmt.Errorf("BMC address %s: %w", a.Host, err)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("BMC address %s resolves to nothing", a.Host)
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	if len(r.Networks) == 0 {
		return addrs, nil
	}
	for _, ip := range addrs {
		ip = ip.Unmap()
		in := false
		for _, n := range r.Networks {
			if n.Contains(ip) {
				in = true
				break
			}
		}
		if !in {
			nets := make([]string, len(r.Networks))
			for i, n := range r.Networks {
				nets[i] = n.String()
			}
			return nil, fmt.Errorf("BMC address %s (%s) is outside the BMC networks this agentboot may reach (--bmc-networks=%s): nothing was sent to it", a.Host, ip, strings.Join(nets, ","))
		}
	}
	return addrs, nil
}

// CAKey is the key of a BareMetalHost's credentials Secret that may hold
// the CA certificates (PEM) its Redfish BMC's certificate is checked
// against, instead of the system's: a BMC with a certificate of its own
// needs no disableCertificateVerification.
const CAKey = "ca.crt"

// credentials reads the BMC's credentials Secret: the username and
// password, and the CA certificates of CAKey when present.
func (r *Reconciler) credentials(ctx context.Context, host *metal3.BareMetalHost) (driver.Credentials, *x509.CertPool, error) {
	name := host.Spec.BMC.CredentialsName
	s := &corev1.Secret{}
	if err := r.Secrets.Get(ctx, client.ObjectKey{Namespace: host.Namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return driver.Credentials{}, nil, fmt.Errorf("credentials Secret %s/%s not found", host.Namespace, name)
		}
		return driver.Credentials{}, nil, fmt.Errorf("read credentials Secret %s/%s: %w", host.Namespace, name, err)
	}
	c := driver.Credentials{Username: string(s.Data["username"]), Password: string(s.Data["password"])}
	if c.Username == "" || c.Password == "" {
		return c, nil, fmt.Errorf("credentials Secret %s/%s needs non-empty keys username and password", host.Namespace, name)
	}
	pem, ok := s.Data[CAKey]
	if !ok {
		return c, nil, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return c, nil, fmt.Errorf("credentials Secret %s/%s: %s holds no PEM certificate", host.Namespace, name, CAKey)
	}
	return c, pool, nil
}

// writeStatus derives the error fields from res and patches the status
// when anything changed.
func (r *Reconciler) writeStatus(ctx context.Context, host *metal3.BareMetalHost, before *metal3.BareMetalHostStatus, res step) error {
	st := &host.Status
	switch {
	case res.err != nil:
		msg := boundMessage(res.err.Error())
		if st.ErrorMessage != msg || st.ErrorType != res.errType {
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, reasonFor(res.errType), "BMC", "%s", msg)
		}
		st.OperationalStatus, st.ErrorType, st.ErrorMessage = metal3.OperationalStatusError, res.errType, msg
		st.ErrorCount++
	case st.OperationalStatus != metal3.OperationalStatusDetached:
		if st.ErrorType != "" {
			r.Events.Eventf(host, nil, corev1.EventTypeNormal, "Recovered", "BMC", "the BMC answers again")
		}
		st.OperationalStatus, st.ErrorType, st.ErrorMessage, st.ErrorCount = metal3.OperationalStatusOK, "", "", 0
	}
	if equality.Semantic.DeepEqual(before, st) {
		return nil
	}
	now := metav1.Now() // written for others to read: the wall clock
	st.LastUpdated = &now
	return r.update(host, func() error { return r.Client.Status().Update(ctx, host) })
}

// maxMessage bounds an error message in status and events: BMC replies
// end up in them, and a BMC address may point anywhere (--bmc-networks).
const maxMessage = 512

// boundMessage keeps the first maxMessage bytes of a message, on one line
// of printable characters.
func boundMessage(msg string) string {
	msg = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, msg)
	if len(msg) <= maxMessage {
		return msg
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + fmt.Sprintf("… (%d more bytes)", len(msg)-cut)
}

func reasonFor(t metal3.ErrorType) string {
	switch t {
	case metal3.RegistrationError:
		return "RegistrationError"
	case metal3.ProvisioningError:
		return "ProvisioningError"
	}
	return "PowerManagementError"
}

// step is what a phase decided: when to look again, or what went wrong.
type step struct {
	requeue time.Duration
	errType metal3.ErrorType
	err     error
	// errCount is the host's error count, for the backoff.
	errCount int
}

func failed(t metal3.ErrorType, err error) step { return step{errType: t, err: err} }

func poll(d time.Duration) step { return step{requeue: d} }

func (s step) result(r *Reconciler) ctrl.Result {
	if s.err != nil {
		return ctrl.Result{RequeueAfter: r.backoff(s.errCount)}
	}
	if s.requeue > 0 {
		return ctrl.Result{RequeueAfter: s.requeue}
	}
	// Nothing pending: re-read the power state now and then, so a host
	// switched on or off behind our back is noticed.
	return ctrl.Result{RequeueAfter: r.Resync}
}

// backoff is capped exponential with ±20% jitter, so that many hosts
// behind one failed switch do not retry in lock step.
func (r *Reconciler) backoff(count int) time.Duration {
	d := r.BackoffBase
	for i := 1; i < count && d < r.BackoffCap; i++ {
		d *= 2
	}
	d = min(d, r.BackoffCap)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func (r *Reconciler) hostsForAgent(ctx context.Context, o client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	for _, mac := range macindex.AgentMACs(o) {
		var hosts metal3.BareMetalHostList
		if err := r.Client.List(ctx, &hosts, client.InNamespace(o.GetNamespace()), client.MatchingFields{macindex.BootMAC: mac}); err != nil {
			continue
		}
		for _, h := range hosts.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&h)})
		}
	}
	return reqs
}

func (r *Reconciler) hostsForInfraEnv(ctx context.Context, o client.Object) []reconcile.Request {
	var hosts metal3.BareMetalHostList
	if err := r.Client.List(ctx, &hosts, client.InNamespace(o.GetNamespace()), client.MatchingLabels{v1beta1.InfraEnvNameLabel: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(hosts.Items))
	for _, h := range hosts.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&h)})
	}
	return reqs
}

// keyedMutex serialises operations per BMC address. An address's entry lives
// while someone holds or waits for it, so addresses of deleted hosts are not
// kept. (k8s.io/utils' keymutex hashes keys onto a fixed set of mutexes: two
// BMCs sharing one would wait for each other's calls, seconds each.)
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	sync.Mutex
	users int
}

func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedEntry{}
	}
	e, ok := k.locks[key]
	if !ok {
		e = &keyedEntry{}
		k.locks[key] = e
	}
	e.users++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.users--; e.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
