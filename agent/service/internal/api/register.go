package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent/service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentapi"
	"github.com/agentboot/agentboot/internal/installprogress"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/signing"
)

// register creates (or finds again) the host's Agent and hands out its token.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	start := s.o.Now()
	defer func() { registrationSeconds.Observe(s.o.Now().Sub(start).Seconds()) }()
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	var req agentapi.RegisterRequest
	if err := decode(w, r, maxBodyBytes, &req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	if err := validRegistration(req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	key, err := s.o.Keys.Key()
	if err != nil {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "Starting", "the service is starting")
		return
	}
	ie, code := s.infraEnvFor(r.Context(), key, ns, name, req.InfraEnvUID, bearer(r))
	switch code {
	case http.StatusOK:
	case http.StatusGone:
		writeError(w, code, agentapi.CodeInfraEnvGone, "InfraEnv %s/%s was deleted", ns, name)
		return
	case http.StatusNotFound:
		writeError(w, code, "NotFound", "unknown InfraEnv %s/%s", ns, name)
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
	agent, created, err := s.ensureAgent(r.Context(), ie, req)
	var capped *capError
	if errors.As(err, &capped) {
		writeError(w, http.StatusForbidden, agentapi.CodeAgentCap, "%v", err)
		s.o.Events.Eventf(ie, nil, corev1.EventTypeWarning, "AgentCapReached", "Register", "%v", err)
		return
	}
	if apierrors.IsAlreadyExists(err) || err == errConflict {
		writeError(w, http.StatusConflict, agentapi.CodeHostIDConflict, "host ID %s is registered to another host", req.HostID)
		return
	}
	if err != nil {
		s.o.Log.Error(err, "register host", "infraEnv", ns+"/"+name, "agent", req.HostID)
		writeError(w, http.StatusInternalServerError, "Internal", "could not register the host")
		return
	}
	if !created {
		if err := s.rebooted(r.Context(), agent); err != nil {
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
	writeJSON(w, http.StatusOK, agentapi.RegisterResponse{
		Namespace:        agent.Namespace,
		HostID:           agent.Name,
		AgentToken:       key.Token(signing.PurposeAgent, string(ie.UID), agent.Namespace+"/"+agent.Name),
		PollSeconds:      int(s.o.PollInterval / time.Second),
		MinDiskSizeBytes: s.minDisk(ie),
	})
}

// capError says an InfraEnv has as many Agents as it may.
type capError struct {
	ie       string
	have, at int
}

func (e *capError) Error() string {
	return fmt.Sprintf("InfraEnv %s has %d Agents, its cap of %d (agentboot manager --max-agents-per-infraenv): delete Agents of hosts that are gone, or raise the cap", e.ie, e.have, e.at)
}

// underCap refuses a new Agent when the InfraEnv has MaxAgents already.
// The count is the cache's: concurrent registrations can pass it by at most
// the registration burst.
func (s *Server) underCap(ctx context.Context, ie *v1beta1.InfraEnv) error {
	if s.o.MaxAgents <= 0 {
		return nil
	}
	// Counted from the cache without copying the Agents out of it.
	var list v1beta1.AgentList
	if err := s.o.Client.List(ctx, &list, client.InNamespace(ie.Namespace), client.MatchingLabels{v1beta1.InfraEnvNameLabel: ie.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	if len(list.Items) >= s.o.MaxAgents {
		return &capError{ie: ie.Namespace + "/" + ie.Name, have: len(list.Items), at: s.o.MaxAgents}
	}
	return nil
}

func validRegistration(req agentapi.RegisterRequest) error {
	if !uuidPattern.MatchString(req.HostID) {
		return fmt.Errorf("hostID %q is not a lower-case UUID", req.HostID)
	}
	if !uuidPattern.MatchString(req.InfraEnvUID) {
		return fmt.Errorf("infraEnvUID %q is not a UUID", req.InfraEnvUID)
	}
	if len(req.Identity.MACAddresses) > 256 {
		return fmt.Errorf("%d MAC addresses: at most 256", len(req.Identity.MACAddresses))
	}
	for _, m := range req.Identity.MACAddresses {
		if !macPattern.MatchString(m) {
			return fmt.Errorf("MAC address %q is not six lower-case hex pairs", m)
		}
	}
	if len(req.AgentVersion) > 128 || len(req.Identity.SerialNumber) > 256 || len(req.Identity.SystemUUID) > 64 {
		return fmt.Errorf("identity fields too long")
	}
	return nil
}

// infraEnvFor resolves the InfraEnv a registration names: 200 when it
// exists and the token is its; 410 when the token is valid for a UID that no
// longer exists (deleted, or deleted and recreated); 404 when it never
// existed as far as the token tells; 401 otherwise.
func (s *Server) infraEnvFor(ctx context.Context, key signing.Key, ns, name, uid, token string) (*v1beta1.InfraEnv, int) {
	validForUID := key.Verify(token, signing.PurposeRegister, uid, "")
	var ie v1beta1.InfraEnv
	err := s.o.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ie)
	switch {
	case apierrors.IsNotFound(err):
		if validForUID {
			return nil, http.StatusGone
		}
		return nil, http.StatusNotFound
	case err != nil:
		return nil, http.StatusInternalServerError
	case string(ie.UID) != uid || !ie.DeletionTimestamp.IsZero():
		if validForUID {
			return nil, http.StatusGone
		}
		return nil, http.StatusUnauthorized
	case !validForUID:
		return nil, http.StatusUnauthorized
	}
	return &ie, http.StatusOK
}

func (s *Server) minDisk(ie *v1beta1.InfraEnv) int64 {
	if r := ie.Spec.HostRequirements; r != nil && r.MinDiskSizeGB > 0 {
		return r.MinDiskSizeGB * 1_000_000_000
	}
	return s.o.MinDiskSizeBytes
}

var errConflict = fmt.Errorf("host ID registered to another host")

// ensureAgent returns the host's Agent, creating it on first registration.
// An Agent of the same name whose MAC addresses share none with this host's
// belongs to another host: errConflict.
func (s *Server) ensureAgent(ctx context.Context, ie *v1beta1.InfraEnv, req agentapi.RegisterRequest) (*v1beta1.Agent, bool, error) {
	macs := hosts.MACs(req.Identity.MACAddresses)
	key := client.ObjectKey{Namespace: ie.Namespace, Name: req.HostID}
	var existing v1beta1.Agent
	// The cache only: a miss goes straight to Create, which tells apart a
	// new host (created) from one the cache has not seen yet (exists).
	err := s.o.Client.Get(ctx, key, &existing)
	if err == nil {
		if !hosts.SameHost(existing.Annotations[hosts.MACsAnnotation], macs) {
			return nil, false, errConflict
		}
		return &existing, false, s.adopt(ctx, &existing, ie, macs)
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	if err := s.underCap(ctx, ie); err != nil {
		return nil, false, err
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
			Annotations:     map[string]string{hosts.MACsAnnotation: macs},
			OwnerReferences: []metav1.OwnerReference{infraEnvOwner(ie)},
		},
		Spec: v1beta1.AgentSpec{
			Role:     v1beta1.AgentRoleAutoAssign,
			Approved: ie.Spec.AgentApproval != nil && ie.Spec.AgentApproval.AutoApprove,
		},
	}
	if err := s.o.Client.Create(ctx, agent); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Registered a moment ago (another replica, a retry): same host?
			if err := s.o.APIReader.Get(ctx, key, &existing); err != nil {
				return nil, false, err
			}
			if !hosts.SameHost(existing.Annotations[hosts.MACsAnnotation], macs) {
				return nil, false, errConflict
			}
			return &existing, false, nil
		}
		return nil, false, err
	}
	writes.WithLabelValues("agent").Inc()
	return agent, true, nil
}

// adopt moves a re-registering host to the InfraEnv it booted from now and
// records its current MAC addresses.
func (s *Server) adopt(ctx context.Context, a *v1beta1.Agent, ie *v1beta1.InfraEnv, macs string) error {
	if a.Labels[v1beta1.InfraEnvNameLabel] == ie.Name && hosts.InfraEnvUID(a) == string(ie.UID) && a.Annotations[hosts.MACsAnnotation] == macs {
		return nil
	}
	patch := client.MergeFrom(a.DeepCopy())
	if a.Labels == nil {
		a.Labels = map[string]string{}
	}
	a.Labels[v1beta1.InfraEnvNameLabel] = ie.Name
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Annotations[hosts.MACsAnnotation] = macs
	a.OwnerReferences = []metav1.OwnerReference{infraEnvOwner(ie)}
	writes.WithLabelValues("agent").Inc()
	return s.o.Client.Patch(ctx, a, patch)
}

// rebooted settles an installation when its host registers again, which it
// does only after booting the discovery image: an unbound host released from
// its cluster is back in the pool with its installation forgotten; a bound
// host in the middle of installing has lost that installation.
func (s *Server) rebooted(ctx context.Context, cached *v1beta1.Agent) error {
	// Read fresh: the cache may not have an installation claimed a moment ago.
	a := &v1beta1.Agent{}
	if err := s.o.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), a); err != nil {
		return err
	}
	p := &a.Status.Progress
	if !lifecycle.Started(a) || lifecycle.Bound(a) && installprogress.Finished(p) {
		return nil
	}
	before := a.DeepCopy()
	if !lifecycle.Bound(a) {
		installprogress.Reset(p)
		a.Status.InstallationDiskID = ""
		s.o.Events.Eventf(a, nil, corev1.EventTypeNormal, "BackInDiscovery", "Register", "the host booted the discovery image again and is back in the free pool")
	} else {
		why := "the host restarted into the discovery image during the installation, at " + string(p.CurrentStage)
		if installprogress.Index(p.CurrentStage) >= installprogress.Index(v1beta1.StageRebooting) {
			why = "the host booted the discovery image again instead of its installed disk; check its boot order"
		}
		_ = installprogress.Fail(p, why, s.o.Now())
		s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, v1beta1.InstallationFailedReason, "Register", "%s", why)
	}
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
