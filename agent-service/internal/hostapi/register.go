package hostapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/signing"
)

// register creates (or finds again) the host's Agent and hands out its token.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	start := s.o.Now()
	defer func() { registrationSeconds.Observe(s.o.Now().Sub(start).Seconds()) }()
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	var req agentwire.RegisterRequest
	if err := decode(w, r, maxBodyBytes, &req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	if err := validRegistration(req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	key, ok := s.key(w)
	if !ok {
		return
	}
	ie, code := s.infraEnvFor(r.Context(), key, ns, name, req.InfraEnvUID, bearer(r))
	switch code {
	case http.StatusOK:
	case http.StatusGone:
		writeError(w, code, agentwire.CodeInfraEnvGone, "InfraEnv %s/%s was deleted", ns, name)
		return
	case http.StatusUnauthorized:
		writeError(w, code, "Unauthorized", "unauthorized")
		return
	default:
		writeError(w, code, "Internal", "internal error")
		return
	}
	if !s.allow("register/"+string(ie.UID), registerRate, registerBurst) {
		tooMany(w)
		return
	}
	// Past every check that costs nothing, and with the body read: a
	// slot is never held while a client sends.
	leave, refused := s.gate.Enter(r.Context(), string(ie.UID))
	if refused != nil {
		busy(w, refused)
		return
	}
	defer leave()
	bootedBy, why := s.bootedBy(r.Context(), key, ns, req.BootProof)
	if why != "" {
		s.o.Log.Info("registration's boot proof not accepted", "infraEnv", ns+"/"+name, "agent", req.HostID, "why", why)
	}
	agent, secret, kind, err := s.ensureAgent(r.Context(), ie, req, identityDigest(key, ns, req), remoteIP(r), bootedBy)
	created := kind == kindCreated
	var capped *capError
	if errors.As(err, &capped) {
		writeError(w, http.StatusForbidden, capped.code(), "%v", err)
		// One event per InfraEnv and reason every 10 s: each is a write,
		// and a token's holder can be refused thousands of times a minute.
		if s.allow("event/"+capped.reason()+"/"+string(ie.UID), 0.1, 1) {
			s.o.Events.Eventf(ie, nil, corev1.EventTypeWarning, capped.reason(), "Register", "%v", err)
		}
		return
	}
	var spent *budgetError
	if errors.As(err, &spent) {
		overBudget(w, spent.wait)
		return
	}
	switch {
	case errors.Is(err, errConflict):
		writeError(w, http.StatusConflict, agentwire.CodeHostIDConflict, "host ID %s is registered to another host", req.HostID)
		return
	case errors.Is(err, errActive):
		w.Header().Set("Retry-After", strconv.Itoa(int(s.quietBefore()/time.Second)))
		writeError(w, http.StatusConflict, agentwire.CodeHostActive,
			"Agent %s/%s is still heard from; a host registering as it is refused until it has been silent for %s (if this host rebooted, that is its earlier boot and it only waits; if another host is alive as %s, the Agent is marked disputed)",
			ns, req.HostID, s.quietBefore(), req.HostID)
		return
	case errors.Is(err, errDeleting), apierrors.IsNotFound(err):
		agentDeleted(w, ns, req.HostID)
		return
	case errors.Is(err, errRecordPending):
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, "Registering", "Agent %s/%s is being registered a moment ago; register again", ns, req.HostID)
		return
	case errors.Is(err, errInDoubt):
		msg := fmt.Sprintf("a host registered as Agent %s from %s while the Agent is bound to a cluster: it was given nothing. If it is this host, restarted into discovery, unbind the Agent (scale its NodePool down, or let a MachineHealthCheck replace the Machine) and it registers into the free pool; if not, a host on the boot network is impersonating it", req.HostID, remoteIP(r))
		if a := (&v1beta1.Agent{}); s.o.Client.Get(r.Context(), client.ObjectKey{Namespace: ns, Name: req.HostID}, a) == nil {
			s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, "IdentityInDoubt", "Register", "%s", msg)
		}
		writeError(w, http.StatusConflict, agentwire.CodeIdentityInDoubt, "%s", msg)
		return
	}
	if err != nil {
		s.o.Log.Error(err, "register host", "infraEnv", ns+"/"+name, "agent", req.HostID)
		writeError(w, http.StatusInternalServerError, "Internal", "could not register the host")
		return
	}
	if kind == kindNewSession {
		if err := s.rebooted(r.Context(), agent); err != nil {
			if apierrors.IsNotFound(err) {
				agentDeleted(w, ns, req.HostID)
				return
			}
			s.o.Log.Error(err, "register host", "infraEnv", ns+"/"+name, "agent", req.HostID)
			writeError(w, http.StatusInternalServerError, "Internal", "could not register the host")
			return
		}
	}
	if err := s.renewLease(r.Context(), agent, 0, true); err != nil {
		s.o.Log.Error(err, "create lease", "agent", ns+"/"+agent.Name)
	}
	if created {
		s.o.Events.Eventf(agent, nil, corev1.EventTypeNormal, "Registered", "Register", "host %s registered through InfraEnv %s", agent.Name, ie.Name)
	}
	bootpath.Count(bootpath.Registered)
	writeJSON(w, http.StatusOK, agentwire.RegisterResponse{
		Namespace:        agent.Namespace,
		HostID:           agent.Name,
		AgentToken:       agentToken(key, agent, secret),
		PollSeconds:      int(s.o.PollInterval / time.Second),
		MinDiskSizeBytes: s.minDisk(ie),
	})
}

// agentDeleted answers a registration whose Agent went away while it was
// handled (the cache still had it): the agent registers again and gets a
// new one.
func agentDeleted(w http.ResponseWriter, ns, id string) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "Deleting", "Agent %s/%s was deleted a moment ago; register again", ns, id)
}

// agentToken authorises the per-host calls of the Agent's current session:
// the session's secret, and a MAC of the Agent's name and the secret, so
// that it is checked before the Agent is read. The token exists only in
// the registration's answer: the Agent records the session's ID
// (hosts.SessionID), from which no token can be made.
func agentToken(key signing.Key, a *v1beta1.Agent, secret string) string {
	return secret + "." + key.Token(signing.PurposeAgent, a.Namespace+"/"+a.Name, secret)
}

// verifyAgentToken checks a token for the Agent ns/name and returns the
// session secret it holds.
func verifyAgentToken(key signing.Key, token, ns, name string) (secret string, ok bool) {
	i := strings.LastIndexByte(token, '.')
	if i <= 0 {
		return "", false
	}
	secret = token[:i]
	return secret, key.Verify(token[i+1:], signing.PurposeAgent, ns+"/"+name, secret)
}

// remoteIP is the address a request came from, for messages.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// capError says an InfraEnv has as many Agents, or unapproved Agents, as
// it may.
type capError struct {
	ie         string
	have, at   int
	unapproved bool
}

func (e *capError) Error() string {
	if e.unapproved {
		return fmt.Sprintf("InfraEnv %s has %d unapproved Agents, its cap of %d (agentboot manager --max-unapproved-agents-per-infraenv): approve or delete them, or raise the cap", e.ie, e.have, e.at)
	}
	return fmt.Sprintf("InfraEnv %s has %d Agents, its cap of %d (agentboot manager --max-agents-per-infraenv): delete Agents of hosts that are gone, or raise the cap", e.ie, e.have, e.at)
}

func (e *capError) code() string {
	if e.unapproved {
		return agentwire.CodeUnapprovedCap
	}
	return agentwire.CodeAgentCap
}

func (e *capError) reason() string {
	if e.unapproved {
		return "UnapprovedCapReached"
	}
	return "AgentCapReached"
}

// budgetError says the write budget cannot take a registration now.
type budgetError struct{ wait time.Duration }

func (e *budgetError) Error() string { return "write budget spent; retry in " + e.wait.String() }

// underCap refuses a new Agent when the InfraEnv has MaxAgents already, or
// MaxUnapproved unapproved ones and would not approve it. The count is the
// cache's: concurrent registrations can pass it by at most the
// registration burst.
func (s *Server) underCap(ctx context.Context, ie *v1beta1.InfraEnv) error {
	if s.o.MaxAgents <= 0 && s.o.MaxUnapproved <= 0 {
		return nil
	}
	// Counted from the cache without copying the Agents out of it, by the
	// InfraEnv their hosts registered through (not the tenant-writable
	// label: relabelling Agents makes no room).
	var list v1beta1.AgentList
	if err := s.o.Client.List(ctx, &list, client.InNamespace(ie.Namespace), client.MatchingFields{hosts.InfraEnvIndex: string(ie.UID)}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	name := ie.Namespace + "/" + ie.Name
	if s.o.MaxAgents > 0 && len(list.Items) >= s.o.MaxAgents {
		return &capError{ie: name, have: len(list.Items), at: s.o.MaxAgents}
	}
	if s.o.MaxUnapproved > 0 && (ie.Spec.AgentApproval == nil || !ie.Spec.AgentApproval.AutoApprove) {
		unapproved := 0
		for i := range list.Items {
			if !list.Items[i].Spec.Approved {
				unapproved++
			}
		}
		if unapproved >= s.o.MaxUnapproved {
			return &capError{ie: name, have: unapproved, at: s.o.MaxUnapproved, unapproved: true}
		}
	}
	return nil
}

func validRegistration(req agentwire.RegisterRequest) error {
	if !agentwire.UUIDForm.MatchString(req.HostID) {
		return fmt.Errorf("hostID %q is not a lower-case UUID", req.HostID)
	}
	if !agentwire.UUIDForm.MatchString(req.InfraEnvUID) {
		return fmt.Errorf("infraEnvUID %q is not a UUID", req.InfraEnvUID)
	}
	if len(req.Identity.MACAddresses) > 256 {
		return fmt.Errorf("%d MAC addresses: at most 256", len(req.Identity.MACAddresses))
	}
	for _, m := range req.Identity.MACAddresses {
		if !agentwire.MACForm.MatchString(m) {
			return fmt.Errorf("MAC address %q is not six lower-case hex pairs", m)
		}
	}
	if len(req.Session) > 64 {
		return fmt.Errorf("session longer than 64 characters")
	}
	if p := req.BootProof; p != nil && (len(p.BareMetalHost) == 0 || len(p.BareMetalHost) > 253 || len(p.Proof) == 0 || len(p.Proof) > 128) {
		return fmt.Errorf("bootProof needs a bareMetalHost name (at most 253 bytes) and a proof (at most 128)")
	}
	if req.AgentVersion != "" && !agentwire.AgentVersionForm.MatchString(req.AgentVersion) {
		return fmt.Errorf("agentVersion %q is not a version (at most 64 letters, digits and ._+~-)", clip.Text(req.AgentVersion, 80))
	}
	if len(req.Identity.SerialNumber) > 256 || len(req.Identity.SystemUUID) > 64 {
		return fmt.Errorf("identity fields too long")
	}
	return nil
}

// infraEnvFor resolves the InfraEnv a registration names. The token is
// checked first, before anything is read: 401 for a token that is not one
// of ours for that UID, whether the InfraEnv exists or not; then 410 when
// the InfraEnv with that UID is gone (deleted, or deleted and recreated),
// and 401 when its registration token was rotated since.
func (s *Server) infraEnvFor(ctx context.Context, key signing.Key, ns, name, uid, token string) (*v1beta1.InfraEnv, int) {
	epoch, ok := key.VerifyRegistration(token, uid)
	if !ok {
		return nil, http.StatusUnauthorized
	}
	var ie v1beta1.InfraEnv
	err := s.o.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ie)
	switch {
	case apierrors.IsNotFound(err):
		return nil, http.StatusGone
	case err != nil:
		return nil, http.StatusInternalServerError
	case string(ie.UID) != uid || !ie.DeletionTimestamp.IsZero():
		return nil, http.StatusGone
	case signing.Epoch(ie.Annotations[signing.RotateAnnotation]) != epoch:
		return nil, http.StatusUnauthorized
	}
	return &ie, http.StatusOK
}

func (s *Server) minDisk(ie *v1beta1.InfraEnv) int64 {
	if b := ie.Spec.HostRequirements.MinDiskSizeBytes(); b > 0 {
		return b
	}
	return s.o.MinDiskSizeBytes
}

// registration is what a registration did.
type registration int

const (
	kindNone registration = iota
	// kindCreated: a new Agent.
	kindCreated
	// kindNewSession: an existing Agent's host, in a new boot.
	kindNewSession
)

// Why a registration does not continue an existing Agent.
var (
	// errConflict: the Agent's host said something else about itself.
	errConflict = errors.New("host ID registered to another host")
	// errActive: the Agent's current session is still heard from.
	errActive = errors.New("the Agent's host is still connected")
	// errInDoubt: the Agent is bound or installing and the registration
	// cannot prove it is that host.
	errInDoubt = errors.New("the Agent is bound to a cluster")
	// errDeleting: the Agent went away while the registration continued
	// it; registering again creates it anew.
	errDeleting = errors.New("the Agent was deleted meanwhile")
	// errRecordPending: the Agent was created a moment ago and its record
	// is not written yet (another request, or replica, is writing it).
	errRecordPending = errors.New("the Agent's registration record is being written")
)

// identityDigest is a keyed digest of everything a host says it is. It is
// keyed so that the registration record does not give away the serial number to
// whoever reads Agents, and cannot be computed from a guess.
func identityDigest(key signing.Key, ns string, req agentwire.RegisterRequest) string {
	id := req.Identity
	return key.Token(signing.PurposeIdentity, ns+"/"+req.HostID,
		strings.ToLower(id.SystemUUID)+"\n"+id.SerialNumber+"\n"+strings.Join(hosts.MACs(id.MACAddresses), ","))
}

// newSecret is a new session's secret.
func newSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ensureAgent returns the host's Agent, creating it on first registration
// or beginning a new session of it. The identity rule:
//   - a host must say exactly what it said when the Agent was created (host
//     ID, SMBIOS UUID and serial, every MAC address), else errConflict;
//   - while the current session is heard from, no new one begins
//     (errActive), and the attempt is recorded: if the current session is
//     heard from after it, two hosts claim the identity and the Agent is
//     disputed (see Server.host);
//   - an Agent bound to a cluster, or installing, never begins a new
//     session (errInDoubt): the registration cannot prove it is the host
//     that was bound, and a new session would get its installation.
func (s *Server) ensureAgent(ctx context.Context, ie *v1beta1.InfraEnv, req agentwire.RegisterRequest, digest, from, bootedBy string) (*v1beta1.Agent, string, registration, error) {
	key := client.ObjectKey{Namespace: ie.Namespace, Name: req.HostID}
	var existing v1beta1.Agent
	// The cache only: a miss goes straight to Create, which tells apart a
	// new host (created) from one the cache has not seen yet (exists).
	err := s.o.Client.Get(ctx, key, &existing)
	if err == nil {
		return s.resume(ctx, &existing, ie, req, digest, from, bootedBy)
	}
	if !apierrors.IsNotFound(err) {
		return nil, "", kindNone, err
	}
	if err := s.underCap(ctx, ie); err != nil {
		return nil, "", kindNone, err
	}
	labels := map[string]string{}
	for k, v := range ie.Spec.AgentLabels {
		labels[k] = v
	}
	labels[v1beta1.InfraEnvNameLabel] = ie.Name
	agent := &v1beta1.Agent{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       ie.Namespace,
			Name:            req.HostID,
			Labels:          labels,
			OwnerReferences: []metav1.OwnerReference{infraEnvOwner(ie)},
		},
		Spec: v1beta1.AgentSpec{
			Role:     v1beta1.AgentRoleAutoAssign,
			Approved: ie.Spec.AgentApproval != nil && ie.Spec.AgentApproval.AutoApprove,
		},
	}
	// Created, given its record, then its finalizer and first status by
	// the Agent controller: four writes of about its size.
	if wait := s.budget.spend(string(ie.UID), 4*size(agent)+2048, s.o.Now()); wait > 0 {
		return nil, "", kindNone, &budgetError{wait}
	}
	if err := s.o.Client.Create(ctx, agent); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Registered a moment ago (another replica, a retry).
			if err := s.o.APIReader.Get(ctx, key, &existing); err != nil {
				if apierrors.IsNotFound(err) {
					return nil, "", kindNone, errDeleting
				}
				return nil, "", kindNone, err
			}
			return s.resume(ctx, &existing, ie, req, digest, from, bootedBy)
		}
		return nil, "", kindNone, err
	}
	writes.WithLabelValues("agent").Inc()
	// The record goes in the status, a second write: an Agent whose record
	// could not be written is deleted again, so that no Agent is left that
	// nobody can continue (the host registers again and is created anew).
	secret, sess := s.newSession(ie, req, digest, from, bootedBy)
	written, err := writeRecord(ctx, s.o.Client, s.o.APIReader, agent, sess, nil)
	if err != nil {
		if derr := s.o.Client.Delete(ctx, agent, client.Preconditions{UID: &agent.UID}); derr != nil && !apierrors.IsNotFound(derr) {
			s.o.Log.Error(derr, "delete an Agent whose registration record could not be written", "agent", agent.Namespace+"/"+agent.Name)
		}
		return nil, "", kindNone, err
	}
	return written, secret, kindCreated, nil
}

// writeRecord writes a new session's registration record onto the Agent a
// as it was read, and onto no other: the write carries the resourceVersion
// a was read at. On a conflict the Agent is read again and, if it is the
// same Agent (its UID) and still may take the session (recheck, when
// given), written again: another writer (the Agent controller adding its
// finalizer) changed it meanwhile. An Agent deleted, or deleted and created
// anew, meanwhile is errDeleting, never given the record. (A UID in a
// status patch would not do this: the apiserver takes only the status from
// a status patch of a custom resource.)
func writeRecord(ctx context.Context, c client.Client, r client.Reader, a *v1beta1.Agent, sess lifecycle.Session, recheck func(*v1beta1.Agent) error) (*v1beta1.Agent, error) {
	cur := a
	for attempt := 0; ; attempt++ {
		next := cur.DeepCopy()
		lifecycle.BeginSession(next, sess)
		writes.WithLabelValues("agent-status").Inc()
		err := c.Status().Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			return next, nil
		case apierrors.IsNotFound(err):
			return nil, errDeleting
		case !apierrors.IsConflict(err) || attempt == 4:
			return nil, err
		}
		fresh := &v1beta1.Agent{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(a), fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, errDeleting
			}
			return nil, err
		}
		if fresh.UID != a.UID || !fresh.DeletionTimestamp.IsZero() {
			return nil, errDeleting
		}
		if recheck != nil {
			if err := recheck(fresh); err != nil {
				return nil, err
			}
		}
		cur = fresh
	}
}

// resume begins a new session of an existing Agent, under the identity
// rule of ensureAgent.
func (s *Server) resume(ctx context.Context, a *v1beta1.Agent, ie *v1beta1.InfraEnv, req agentwire.RegisterRequest, digest, from, bootedBy string) (*v1beta1.Agent, string, registration, error) {
	rec := lifecycle.Registration(a)
	recorded := rec.Identity
	if recorded == "" && s.o.Now().Sub(a.CreationTimestamp.Time) < recordGrace {
		// Created a moment ago: its record is on its way (a retried
		// request, another replica). Asked again, not sent elsewhere.
		return nil, "", kindNone, errRecordPending
	}
	if orphaned(a, ie) {
		return s.adopt(ctx, a, ie, req, digest, from, bootedBy)
	}
	if recorded == "" || recorded != digest {
		// Every Agent records its identity at creation; one without is
		// nobody's to continue.
		return nil, "", kindNone, errConflict
	}
	if rec.InfraEnvUID != string(ie.UID) {
		// Registering through another InfraEnv is joining it: its caps
		// apply, or Agents could be moved out of one to make room.
		if err := s.underCap(ctx, ie); err != nil {
			return nil, "", kindNone, err
		}
	}
	// A boot proof outweighs neither: it says which BareMetalHost's BMC
	// booted the host, not that the Agent's host is gone, nor that it is
	// the host that was bound (docs/agents.md).
	alive, err := s.sessionAlive(ctx, a)
	if err != nil {
		return nil, "", kindNone, err
	}
	if alive {
		if req.Session != "" {
			// No registration continues a live session: a session's
			// token is handed out once. (An earlier draft continued one
			// for a registration showing the secret its annotation is
			// the digest of, which whoever may write the annotation could
			// choose.) Naming one is a replay or a forgery.
			s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, "SessionRefused", "Register",
				"a registration from %s named a session while this Agent's host is heard from: it was given nothing (a live session is never continued or handed out again)", from)
		}
		if rec.Contested == "" && s.budget.spend(rec.InfraEnvUID, 2*size(a), s.o.Now()) == 0 {
			patch := client.MergeFrom(a.DeepCopy())
			lifecycle.Contest(a, s.o.Now().UTC().Format(time.RFC3339)+" from "+from)
			writes.WithLabelValues("agent-status").Inc()
			if err := s.o.Client.Status().Patch(ctx, a, patch); err != nil {
				return nil, "", kindNone, err
			}
		}
		return nil, "", kindNone, errActive
	}
	if lifecycle.Bound(a) {
		return nil, "", kindNone, errInDoubt
	}
	// The record, and the Agent controller's status after it.
	if wait := s.budget.spend(string(ie.UID), 2*size(a), s.o.Now()); wait > 0 {
		return nil, "", kindNone, &budgetError{wait}
	}
	// The label and owner users and cluster-api-provider-agent read; what
	// agentboot decides by is in the record below.
	if o := a.OwnerReferences; a.Labels[v1beta1.InfraEnvNameLabel] != ie.Name || len(o) != 1 || o[0].UID != ie.UID || o[0].Kind != "InfraEnv" || o[0].Name != ie.Name {
		patch := client.MergeFrom(a.DeepCopy())
		if a.Labels == nil {
			a.Labels = map[string]string{}
		}
		a.Labels[v1beta1.InfraEnvNameLabel] = ie.Name
		a.OwnerReferences = []metav1.OwnerReference{infraEnvOwner(ie)}
		writes.WithLabelValues("agent").Inc()
		if err := s.o.Client.Patch(ctx, a, patch); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "", kindNone, errDeleting
			}
			return nil, "", kindNone, err
		}
	}
	secret, sess := s.newSession(ie, req, digest, from, bootedBy)
	written, err := writeRecord(ctx, s.o.Client, s.o.APIReader, a, sess, func(fresh *v1beta1.Agent) error {
		// Changed meanwhile: still this host's, and still not bound.
		if lifecycle.Registration(fresh).Identity != digest {
			return errConflict
		}
		if lifecycle.Bound(fresh) {
			return errInDoubt
		}
		return nil
	})
	if err != nil {
		return nil, "", kindNone, err
	}
	return written, secret, kindNewSession, nil
}

// recordGrace is how long after its creation an Agent without a record is
// taken to be one whose record is being written.
const recordGrace = 30 * time.Second

// orphaned reports whether Agent a is what a registration leaves when its
// process stops between creating the Agent and writing its record (a
// replica killed, a node lost): made for this InfraEnv as registrations
// make Agents, and past recordGrace without any record of a registration.
// Nobody holds a session of it (a token exists only in the answer sent
// after the record), and it is bound to nothing. Left alone it would be
// nobody's to continue, its host refused as HostIDConflict for good.
func orphaned(a *v1beta1.Agent, ie *v1beta1.InfraEnv) bool {
	o := a.OwnerReferences
	return a.Status.Registration == nil && !lifecycle.Bound(a) && a.DeletionTimestamp.IsZero() &&
		len(o) == 1 && o[0].UID == ie.UID && o[0].Kind == "InfraEnv" && a.Labels[v1beta1.InfraEnvNameLabel] == ie.Name
}

// adopt gives an orphaned Agent to the host registering with its host ID,
// as its first registration would have: the record of a new session,
// written only if the Agent is still an orphan then.
func (s *Server) adopt(ctx context.Context, a *v1beta1.Agent, ie *v1beta1.InfraEnv, req agentwire.RegisterRequest, digest, from, bootedBy string) (*v1beta1.Agent, string, registration, error) {
	// As a first registration: under the InfraEnv's caps and budget.
	if err := s.underCap(ctx, ie); err != nil {
		return nil, "", kindNone, err
	}
	if wait := s.budget.spend(string(ie.UID), 2*size(a), s.o.Now()); wait > 0 {
		return nil, "", kindNone, &budgetError{wait}
	}
	secret, sess := s.newSession(ie, req, digest, from, bootedBy)
	written, err := writeRecord(ctx, s.o.Client, s.o.APIReader, a, sess, func(fresh *v1beta1.Agent) error {
		if !orphaned(fresh, ie) {
			// Another registration adopted it first, or it changed.
			return errRecordPending
		}
		return nil
	})
	if err != nil {
		return nil, "", kindNone, err
	}
	s.o.Log.Info("adopted an Agent a registration left without its record", "agent", a.Namespace+"/"+a.Name, "created", a.CreationTimestamp.Time, "from", from)
	s.o.Events.Eventf(written, nil, corev1.EventTypeNormal, "Adopted", "Register",
		"the registration that created this Agent at %s stopped before it recorded the host (its replica stopped); the host registering as it from %s has it now",
		a.CreationTimestamp.UTC().Format(time.RFC3339), from)
	return written, secret, kindCreated, nil
}

// newSession is a new session for an Agent's registration record
// (lifecycle.BeginSession, written by writeRecord): the InfraEnv it
// registered through, what the host said it is, the session's ID, when it
// began, and the BareMetalHost whose virtual media it proved it booted
// from, if any. It returns the session's secret too, which only the
// registration's answer carries.
func (s *Server) newSession(ie *v1beta1.InfraEnv, req agentwire.RegisterRequest, digest, from, bootedBy string) (string, lifecycle.Session) {
	secret := newSecret()
	return secret, lifecycle.Session{
		InfraEnv: ie.Name, InfraEnvUID: string(ie.UID),
		Identity: digest, MACs: hosts.MACs(req.Identity.MACAddresses),
		ID: hosts.SessionID(secret), Started: s.o.Now(),
		BootedBy: bootedBy, From: sourceIP(from), AgentVersion: req.AgentVersion,
	}
}

// bootedBy checks a registration's boot proof and returns the UID of the
// BareMetalHost it proves, or "" (with why, for the log) when there is
// none or it does not hold.
func (s *Server) bootedBy(ctx context.Context, key signing.Key, ns string, p *agentwire.BootProof) (string, string) {
	if p == nil {
		return "", ""
	}
	// From the apiserver, not the cache: a registration with a proof
	// comes once per boot, and the nonce its BMC controller wrote a moment
	// ago may not be in the cache yet.
	var bmh metal3.BareMetalHost
	if err := s.o.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: p.BareMetalHost}, &bmh); err != nil {
		return "", fmt.Sprintf("BareMetalHost %s/%s: %v", ns, p.BareMetalHost, err)
	}
	nonce, err := key.CheckBootProof(p.Proof, ns, bmh.Name, string(bmh.UID), s.o.Now())
	if err != nil {
		return "", fmt.Sprintf("the boot proof for BareMetalHost %s/%s %v", ns, bmh.Name, err)
	}
	if nonce != bmh.Annotations[signing.BootNonceAnnotation] {
		return "", fmt.Sprintf("the boot proof for BareMetalHost %s/%s is of an earlier boot than the one its BMC sent last", ns, bmh.Name)
	}
	return string(bmh.UID), ""
}

// sessionAlive reports whether the Agent's host was heard from recently
// enough that it may still be running: its Lease renewed within
// LeaseRenewInterval (the Lease is written no more often) plus one and a
// half heartbeats.
func (s *Server) sessionAlive(ctx context.Context, a *v1beta1.Agent) (bool, error) {
	var l coordinationv1.Lease
	err := s.o.Client.Get(ctx, client.ObjectKey{Namespace: s.o.LeaseNamespace, Name: hosts.LeaseName(a.Namespace, a.Name)}, &l)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if l.Spec.RenewTime == nil {
		return false, nil
	}
	return s.o.Now().Sub(l.Spec.RenewTime.Time) < s.quietBefore(), nil
}

// quietBefore is how long a host must have been silent before its Agent
// begins a new session.
func (s *Server) quietBefore() time.Duration {
	return s.o.LeaseRenewInterval + s.o.PollInterval*3/2
}

// rebooted settles an installation when its host registers again in a new
// boot of the discovery image: released from its cluster, it is back in the
// pool with its installation forgotten, owing a sanitization of its disks
// before it can be bound again; bound since the registration was accepted
// (resume refuses a bound Agent), its installation failed.
func (s *Server) rebooted(ctx context.Context, cached *v1beta1.Agent) error {
	// Read fresh: the cache may not have an installation claimed a moment ago.
	a := &v1beta1.Agent{}
	if err := s.o.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), a); err != nil {
		return err
	}
	p := a.Status.Progress
	if !lifecycle.Started(a) || lifecycle.Bound(a) && lifecycle.Finished(p.CurrentStage) {
		return nil
	}
	before := a.DeepCopy()
	if lifecycle.Bound(a) {
		// resume refuses a bound Agent; one bound since, whose host
		// began installing and then registered again, has lost its
		// installation.
		why := "the host restarted into the discovery image during the installation, at " + string(p.CurrentStage)
		if lifecycle.StageIndex(p.CurrentStage) >= lifecycle.StageIndex(v1beta1.StageRebooting) {
			why = "the host booted the discovery image again instead of its installed disk; check its boot order"
		}
		_ = lifecycle.FailInstallation(a, why, s.o.Now())
		s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, v1beta1.InstallationFailedReason, "Register", "%s", why)
		writes.WithLabelValues("agent-status").Inc()
		return s.o.Client.Status().Patch(ctx, a, client.MergeFrom(before))
	}
	msg := "the host booted the discovery image again and is back in the free pool"
	// One write frees the host and makes it owe its sanitization: there is
	// no moment when it is bindable with the last tenant's data on it.
	if lifecycle.ForgetInstallation(&a.Status, fmt.Sprintf("it left a cluster it had been installed into (at %s)", p.CurrentStage)) {
		msg = fmt.Sprintf("the host booted the discovery image again; it sanitizes its disks (level %s) before it can be bound again", a.Status.DiskSanitization.Required)
	}
	s.o.Events.Eventf(a, nil, corev1.EventTypeNormal, "BackInDiscovery", "Register", "%s", msg)
	writes.WithLabelValues("agent-status").Inc()
	return s.o.Client.Status().Patch(ctx, a, client.MergeFrom(before))
}

func infraEnvOwner(ie *v1beta1.InfraEnv) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: v1beta1.GroupVersion.String(), Kind: "InfraEnv", Name: ie.Name, UID: ie.UID,
		BlockOwnerDeletion: ptr.To(false),
	}
}

// get reads through the cache and, on a miss, from the apiserver.
func (s *Server) get(ctx context.Context, key client.ObjectKey, obj client.Object) error {
	err := s.o.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return s.o.APIReader.Get(ctx, key, obj)
	}
	return err
}
