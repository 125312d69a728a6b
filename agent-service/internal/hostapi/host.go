package hostapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/agent-service/internal/debts"
	"github.com/agentboot/agentboot/agent-service/internal/hosts"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/sanitize"
	"github.com/agentboot/agentboot/internal/signing"
)

// AgentRef is an authenticated host.
type AgentRef struct {
	Agent    *v1beta1.Agent
	InfraEnv *v1beta1.InfraEnv
	// secret is the host's session, to read the Agent again (a held
	// heartbeat) and still be sure it is this session's; arrived is when
	// the request came.
	secret  string
	arrived time.Time
}

// refusal is a per-host call refused after its token was checked.
type refusal struct {
	status    int
	code, msg string
}

// host authenticates a per-host call: the token must be the one issued to
// this Agent, so a host can act on its own Agent only.
func (s *Server) host(h func(http.ResponseWriter, *http.Request, *AgentRef)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		ns, id := r.PathValue("namespace"), r.PathValue("id")
		if !agentwire.UUIDForm.MatchString(id) {
			writeError(w, http.StatusBadRequest, "BadRequest", "agent ID %q is not a UUID", id)
			return
		}
		key, ok := s.key(w)
		if !ok {
			return
		}
		// The token first: nothing is read for a request that is not from
		// a host we registered.
		secret, ok := verifyAgentToken(key, bearer(r), ns, id)
		if !ok {
			writeError(w, http.StatusUnauthorized, "Unauthorized", "unauthorized")
			return
		}
		if !s.allow("host/"+ns+"/"+id, hostRate, hostBurst) {
			tooMany(w)
			return
		}
		ref, no := s.resolve(r.Context(), ns, id, secret, true, remoteIP(r))
		if no != nil {
			writeError(w, no.status, no.code, "%s", no.msg)
			return
		}
		ref.arrived = arrived
		h(w, r, ref)
	})
}

// resolve reads the Agent of session secret and the InfraEnv it registered
// through. first: the call has just come, from address from (recorded), not
// a held heartbeat reading again.
func (s *Server) resolve(ctx context.Context, ns, id, secret string, first bool, from string) (*AgentRef, *refusal) {
	var a v1beta1.Agent
	if err := s.get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &refusal{http.StatusNotFound, "NotFound", fmt.Sprintf("no Agent %s/%s: register again", ns, id)}
		}
		return nil, &refusal{http.StatusInternalServerError, "Internal", "internal error"}
	}
	if !hosts.InSession(&a, secret) {
		// A session begun a moment ago may not be in the cache yet.
		if err := s.o.APIReader.Get(ctx, client.ObjectKeyFromObject(&a), &a); err != nil || !hosts.InSession(&a, secret) {
			return nil, &refusal{http.StatusUnauthorized, "Unauthorized", "unauthorized: this host's session ended (another registration began a new one)"}
		}
	}
	// The InfraEnv the host registered through, from the record: the
	// Agent's label and owner are for users, and tenant-writable.
	rec := lifecycle.Registration(&a)
	if first {
		if rec.Contested != "" {
			if err := s.dispute(ctx, &a); err != nil {
				s.o.Log.Error(err, "mark Agent disputed", "agent", ns+"/"+id)
			}
		}
		if err := s.noteSource(ctx, &a, from); err != nil {
			s.o.Log.Error(err, "record the host's source address", "agent", ns+"/"+id)
		}
	}
	var ie v1beta1.InfraEnv
	err := s.get(ctx, client.ObjectKey{Namespace: ns, Name: rec.InfraEnv}, &ie)
	if apierrors.IsNotFound(err) || (err == nil && string(ie.UID) != rec.InfraEnvUID) {
		return nil, &refusal{http.StatusGone, agentwire.CodeInfraEnvGone, fmt.Sprintf("the InfraEnv of Agent %s/%s was deleted", ns, id)}
	}
	if err != nil {
		return nil, &refusal{http.StatusInternalServerError, "Internal", "internal error"}
	}
	return &AgentRef{Agent: &a, InfraEnv: &ie, secret: secret}, nil
}

// allowWrite limits the status writes one host causes.
func (s *Server) allowWrite(a *v1beta1.Agent) bool {
	return s.allow("write/"+a.Namespace+"/"+a.Name, writeRate, writeBurst)
}

// mayWrite reports, taking nothing, whether allowWrite could allow a write
// of a's now.
func (s *Server) mayWrite(a *v1beta1.Agent) bool {
	v, ok := s.limiters.Load("write/" + a.Namespace + "/" + a.Name)
	return !ok || v.(*limiter).TokensAt(s.o.Now()) >= 1
}

// noteSource records an address the host connected from, when it is new:
// kubelet serving certificates are approved only for addresses the host
// was seen using (see the nodepool worker).
func (s *Server) noteSource(ctx context.Context, a *v1beta1.Agent, ip string) error {
	if ip = sourceIP(ip); ip == "" {
		return nil
	}
	seen := lifecycle.Registration(a).SourceAddresses
	if a.Status.Registration == nil || slices.Contains(seen, ip) || !s.allowWrite(a) ||
		s.budget.spend(a.Status.Registration.InfraEnvUID, size(a), s.o.Now()) > 0 {
		return nil // known, a host changing address on every request, or no budget now (a later request records it)
	}
	patch := client.MergeFrom(a.DeepCopy())
	lifecycle.SeenFrom(a, ip)
	writes.WithLabelValues("agent-status").Inc()
	return s.o.Client.Status().Patch(ctx, a, patch)
}

// sourceIP is a request's source address as the record keeps it, or "".
func sourceIP(ip string) string {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}
	return addr.Unmap().String()
}

// dispute marks an Agent whose current session was heard from after a
// registration with its identity was refused for it: two hosts are alive
// under one identity, and nothing tells which is the real one. The session
// goes on (a bound host keeps installing), but the Agent fails its identity
// validation, so it is not bound again, until an administrator decides.
func (s *Server) dispute(ctx context.Context, a *v1beta1.Agent) error {
	patch := client.MergeFrom(a.DeepCopy())
	rec := a.Status.Registration
	msg := fmt.Sprintf("a second host registered as this Agent (at %s) while this Agent's host was still connected, and both were heard from afterwards: two hosts claim to be %s. Check which is real (its BMC, its console); delete the Agent if neither is, or clear the dispute as an administrator: kubectl patch agent %s -n %s --subresource=status --type merge -p '{\"status\":{\"registration\":{\"disputed\":null}}}'",
		rec.Contested, a.Name, a.Name, a.Namespace)
	if wait := s.budget.spend(rec.InfraEnvUID, 2*size(a), s.o.Now()); wait > 0 {
		return fmt.Errorf("the write budget is spent for %s; the next heartbeat marks the dispute", wait.Round(time.Second))
	}
	if lifecycle.Dispute(a, msg) {
		s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, "IdentityConflict", "Register", "%s", msg)
	}
	writes.WithLabelValues("agent-status").Inc()
	return s.o.Client.Status().Patch(ctx, a, patch)
}

// inventory stores the host's hardware in the Agent's status when it changed.
func (s *Server) inventory(w http.ResponseWriter, r *http.Request, ref *AgentRef) {
	// Refused before the body is read when nothing could be stored now:
	// a host sending inventories as fast as it may costs little.
	if !s.mayWrite(ref.Agent) {
		tooMany(w)
		return
	}
	if wait := s.budget.exhausted(string(ref.InfraEnv.UID), s.o.Now()); wait > 0 {
		overBudget(w, wait)
		return
	}
	var inv v1beta1.HostInventory
	if err := decode(w, r, agentwire.MaxInventoryBytes, &inv); err != nil {
		writeError(w, http.StatusBadRequest, "BadInventory", "inventory: %v", err)
		return
	}
	if err := validInventory(&inv); err != nil {
		writeError(w, http.StatusBadRequest, "BadInventory", "inventory: %v", err)
		return
	}
	if raw, _ := json.Marshal(&inv); len(raw) > agentwire.MaxStoredInventoryBytes {
		writeError(w, http.StatusBadRequest, "BadInventory", "inventory: %d bytes as stored, more than the %d kept per Agent (a large 2-socket server's is about 18 KiB)",
			len(raw), agentwire.MaxStoredInventoryBytes)
		return
	}
	// The report time is the service's: the host's clock may be off, and
	// whether an inventory is of the host's current session (which a
	// sanitization needs) is judged against the service's session start.
	now := metav1.NewTime(s.o.Now())
	inv.ReportTime = &now
	a := ref.Agent
	if lifecycle.Bound(a) && a.Status.Inventory.Hostname != "" && inv.Hostname != a.Status.Inventory.Hostname {
		// Once bound, the host's name is what it joins its cluster as and
		// what its kubelet certificates are approved for: a host renaming
		// itself must not become another node.
		s.o.Log.Info("kept the hostname of a bound host", "agent", a.Namespace+"/"+a.Name, "reported", inv.Hostname, "kept", a.Status.Inventory.Hostname)
		inv.Hostname = a.Status.Inventory.Hostname
	}
	if sameInventory(a.Status.Inventory, inv) && lifecycle.InventoryOfThisSession(a) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// The host's own write limit first: a host over it takes no slot.
	if !s.allowWrite(a) {
		tooMany(w)
		return
	}
	leave, refused := s.gate.Enter(r.Context(), string(ref.InfraEnv.UID))
	if refused != nil {
		busy(w, refused)
		return
	}
	defer leave()
	patch := client.MergeFrom(a.DeepCopy())
	lifecycle.RecordInventory(a, inv)
	// Stored, then the Agent controller's validations of it: two writes.
	if wait := s.budget.spend(string(ref.InfraEnv.UID), 2*size(a), s.o.Now()); wait > 0 {
		overBudget(w, wait)
		return
	}
	owed, err := s.oweByHardware(r.Context(), a)
	if err != nil {
		s.o.Log.Error(err, "look up erase debts", "agent", a.Namespace+"/"+a.Name)
		writeError(w, http.StatusInternalServerError, "Internal", "could not store the inventory")
		return
	}
	if err := s.o.Client.Status().Patch(r.Context(), a, patch); err != nil {
		if apierrors.IsInvalid(err) {
			writeError(w, http.StatusBadRequest, "BadInventory", "inventory: %v", err)
			return
		}
		s.o.Log.Error(err, "store inventory", "agent", a.Namespace+"/"+a.Name)
		writeError(w, http.StatusInternalServerError, "Internal", "could not store the inventory")
		return
	}
	writes.WithLabelValues("agent-status").Inc()
	if owed != nil {
		s.o.Events.Eventf(a, nil, corev1.EventTypeWarning, "SanitizationOwedByHardware", "Inventory", "%s", a.Status.DiskSanitization.Reason)
	}
	bootpath.Count(bootpath.Inventory)
	w.WriteHeader(http.StatusNoContent)
}

// oweByHardware makes a free Agent that owes nothing yet owe the erase its
// machine owes (debts: a record an installation of the same hardware left,
// under any Agent, host ID or namespace), in a's status as about to be
// written with its new inventory: the host is never bindable with the last
// tenant's data on its disks, however it came back. A bound Agent is left
// alone (its own cluster's data is no leak to that cluster).
func (s *Server) oweByHardware(ctx context.Context, a *v1beta1.Agent) (*debts.Debt, error) {
	if s.o.Debts == nil || lifecycle.Bound(a) {
		return nil, nil
	}
	d, err := s.o.Debts.Find(ctx, debts.AgentMarks(a))
	if err != nil || d == nil {
		return nil, err
	}
	ds := a.Status.DiskSanitization
	switch {
	case lifecycle.SanitizationOwed(a):
		// Already owing: only a stronger level than owed changes that.
		if sanitize.Stronger(ds.Required, d.Level) == ds.Required {
			return nil, nil
		}
	case ds != nil && ds.State == v1beta1.SanitizationDone && ds.CompletionTime != nil && sanitize.Stronger(ds.Level, d.Level) == ds.Level:
		// This Agent erased its disks since the debt arose and the debt
		// stayed (it names disks this host did not erase: disks replaced,
		// or another machine's marks claimed): once per Agent, not at
		// every boot.
		if since, err := time.Parse(time.RFC3339, d.Since); err == nil && ds.CompletionTime.Time.After(since) {
			return nil, nil
		}
	}
	why := fmt.Sprintf("this machine (matched by %s) was installed into a cluster as Agent %s on %s and has not erased its disks since (%s)", matchedWhat(d.Matched), d.Agent, d.Since, d.Reason)
	if !lifecycle.OweSanitization(&a.Status, d.Level, why) {
		return nil, nil
	}
	return d, nil
}

func matchedWhat(kind string) string {
	switch kind {
	case "uuid":
		return "its SMBIOS UUID"
	case "serial":
		return "its serial number"
	case "mac":
		return "a MAC address"
	case "disk":
		return "a disk's serial number or WWN"
	}
	return kind
}

// sameInventory compares all but the report time.
func sameInventory(x, y v1beta1.HostInventory) bool {
	x.ReportTime, y.ReportTime = nil, nil
	return equality.Semantic.DeepEqual(x, y)
}

// validInventory bounds what a host may claim, so a broken or hostile agent
// cannot fill the Agent with nonsense.
func validInventory(inv *v1beta1.HostInventory) error {
	switch {
	case inv.ReportTime == nil:
		return fmt.Errorf("reportTime is required")
	case inv.CPU.Count < 0 || inv.CPU.Count > 1<<16:
		return fmt.Errorf("cpu.count %d out of range", inv.CPU.Count)
	case inv.Memory.PhysicalBytes < 0 || inv.Memory.UsableBytes < 0:
		return fmt.Errorf("memory sizes must not be negative")
	case len(inv.Disks) > 4096 || len(inv.Interfaces) > 4096 || len(inv.GPUs) > 1024 || len(inv.CPU.Flags) > 1024:
		return fmt.Errorf("too many disks, interfaces, GPUs or CPU flags")
	case len(inv.Hostname) > 253:
		return fmt.Errorf("hostname longer than 253 characters")
	}
	for i, d := range inv.Disks {
		if d.ID == "" {
			return fmt.Errorf("disks[%d].id is required", i)
		}
		if d.SizeBytes < 0 {
			return fmt.Errorf("disks[%d].sizeBytes must not be negative", i)
		}
	}
	for i, n := range inv.Interfaces {
		if n.MacAddress != "" && !agentwire.MACForm.MatchString(n.MacAddress) {
			return fmt.Errorf("interfaces[%d].macAddress %q is not six lower-case hex pairs", i, n.MacAddress)
		}
	}
	if v := inv.Virtualization; v != nil {
		switch v.Verdict {
		case "", v1beta1.VirtSupported, v1beta1.VirtDisabledInFirmware, v1beta1.VirtNotSupportedByCPU, v1beta1.VirtVirtualMachineWithoutNested:
		default:
			return fmt.Errorf("virtualization.verdict %q is not one of supported, disabled-in-firmware, not-supported-by-cpu, virtual-machine-without-nesting", v.Verdict)
		}
	}
	return nil
}

// instructions is the heartbeat: it renews the host's Lease (at most every
// LeaseRenewInterval) and returns the work for the host.
func (s *Server) instructions(w http.ResponseWriter, r *http.Request, ref *AgentRef) {
	// A held heartbeat is answered within MaxWaitSeconds of its arrival,
	// whatever the writes took.
	arrived := ref.arrived
	if arrived.IsZero() {
		arrived = time.Now()
	}
	var req agentwire.InstructionsRequest
	if err := decode(w, r, maxBodyBytes, &req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	offset := int64(0)
	if !req.Time.IsZero() {
		offset = int64(math.Round(req.Time.Sub(s.o.Now()).Seconds()))
	}
	if err := s.renewLease(r.Context(), ref.Agent, offset, false); err != nil {
		s.o.Log.Error(err, "renew lease", "agent", ref.Agent.Namespace+"/"+ref.Agent.Name)
	}
	if err := s.storeNTP(r.Context(), ref.Agent, req.NTPSources); err != nil {
		s.o.Log.Error(err, "store NTP sources", "agent", ref.Agent.Namespace+"/"+ref.Agent.Name)
	}
	poll := s.o.PollInterval
	wait := min(time.Duration(min(req.WaitSeconds, agentwire.MaxWaitSeconds))*time.Second, poll) - time.Since(arrived)
	if wait <= 0 || s.o.Waker == nil || !awaitsInstallation(ref.Agent) {
		writeJSON(w, http.StatusOK, agentwire.Instructions{Steps: s.next(r.Context(), ref), PollSeconds: int(poll / time.Second)})
		return
	}
	release, ok := s.o.Waker.Hold(string(ref.Agent.UID))
	if !ok {
		// Another heartbeat of this host is held, the replica holds as
		// many as it may, or it is shutting down: answered at once.
		writeJSON(w, http.StatusOK, agentwire.Instructions{Steps: s.next(r.Context(), ref), PollSeconds: int(poll / time.Second)})
		return
	}
	defer release()
	steps, no := s.hold(r.Context(), ref, wait)
	if no != nil {
		writeError(w, no.status, no.code, "%s", no.msg)
		return
	}
	if len(steps) == 0 {
		// Held for nothing: the rest of the poll interval, so that a host
		// makes as many requests as without holding.
		poll = max((poll - time.Since(arrived)).Round(time.Second), time.Second)
	}
	writeJSON(w, http.StatusOK, agentwire.Instructions{Steps: steps, PollSeconds: int(poll / time.Second)})
}

// awaitsInstallation: the host may be given its installation any moment,
// so its heartbeat is worth holding: approved, and unbound or bound
// without having started. A host waiting for a person's approval, or
// installed, has its heartbeats answered at once: each held one costs the
// replica a connection and a goroutine (some tens of KiB) for 15 s.
func awaitsInstallation(a *v1beta1.Agent) bool {
	return a.Spec.Approved && !lifecycle.Started(a) && !lifecycle.SanitizationOwed(a)
}

// next is the host's work now (none on an error, which is logged).
func (s *Server) next(ctx context.Context, ref *AgentRef) []agentwire.Step {
	if s.o.Steps == nil {
		return []agentwire.Step{}
	}
	steps, err := s.o.Steps.Next(ctx, ref)
	if err != nil {
		s.o.Log.Error(err, "next steps", "agent", ref.Agent.Namespace+"/"+ref.Agent.Name)
		return []agentwire.Step{}
	}
	if steps == nil {
		steps = []agentwire.Step{}
	}
	return steps
}

// hold answers a heartbeat that lets the service wait: as soon as the
// host has work, or after wait with none. Each change of its Agent or of
// its installation's handover (Waker) has it looked at again, as read
// afresh from the cache and still in this session.
func (s *Server) hold(ctx context.Context, ref *AgentRef, wait time.Duration) ([]agentwire.Step, *refusal) {
	t := time.NewTimer(wait)
	defer t.Stop()
	// Every look reads the Agent again, the first too: it was read before
	// the lease was renewed, and a change since then woke no one. Nothing
	// of the Agent is referenced while the heartbeat waits.
	id := agentID{ns: ref.Agent.Namespace, name: ref.Agent.Name, uid: string(ref.Agent.UID), secret: ref.secret}
	for {
		steps, no, woken := s.look(ctx, id, t.C)
		if no != nil || len(steps) > 0 {
			return steps, no
		}
		if !woken || s.o.Waker.ShuttingDown() {
			return []agentwire.Step{}, nil
		}
	}
}

// agentID is what a held heartbeat keeps of its host while it waits.
type agentID struct{ ns, name, uid, secret string }

// look watches the host's Agent, reads it afresh, and returns its work if
// it has some; otherwise it waits for a wake (woken), the timer or the
// request's end. Watched before it reads, a change made while it reads
// wakes the wait.
func (s *Server) look(ctx context.Context, id agentID, timer <-chan time.Time) (steps []agentwire.Step, no *refusal, woken bool) {
	wake, stop := s.o.Waker.Watch(id.uid)
	defer stop()
	ref, no := s.resolve(ctx, id.ns, id.name, id.secret, false, "")
	if no != nil {
		return nil, no, false
	}
	if steps := s.next(ctx, ref); len(steps) > 0 {
		return steps, nil, false
	}
	select {
	case <-wake:
		return nil, nil, true
	case <-timer:
	case <-ctx.Done():
	}
	return []agentwire.Step{}, nil, false
}

func (s *Server) storeNTP(ctx context.Context, a *v1beta1.Agent, srcs []agentwire.NTPSource) error {
	if len(srcs) > 64 {
		srcs = srcs[:64]
	}
	want := make([]v1beta1.HostNTPSource, 0, len(srcs))
	for _, n := range srcs {
		// A host name or address, and chrony's one-word state: anything
		// longer is not chrony's, and not stored.
		if len(n.SourceName) > 255 || len(n.SourceState) > 32 {
			continue
		}
		want = append(want, v1beta1.HostNTPSource{SourceName: n.SourceName, SourceState: n.SourceState})
	}
	// Compared before anything is copied: this is every heartbeat.
	if lifecycle.SameNTPSources(a, want) || !s.allowWrite(a) {
		return nil // unchanged, or informational: a later heartbeat stores it
	}
	// Stored, then the Agent controller's validations of it (ntp-synced):
	// informational, so over budget it waits for a later heartbeat.
	if s.budget.spend(lifecycle.Registration(a).InfraEnvUID, 2*size(a), s.o.Now()) > 0 {
		return nil
	}
	patch := client.MergeFrom(a.DeepCopy())
	lifecycle.RecordNTPSources(a, want)
	writes.WithLabelValues("agent-status").Inc()
	return s.o.Client.Status().Patch(ctx, a, patch)
}

// renewLease creates the Agent's Lease or renews it when it is older than
// LeaseRenewInterval (or the host's clock moved). Replicas racing to renew
// the same Lease lose on a conflict, which is fine: one of them renewed it.
func (s *Server) renewLease(ctx context.Context, a *v1beta1.Agent, offset int64, registering bool) error {
	key := client.ObjectKey{Namespace: s.o.LeaseNamespace, Name: hosts.LeaseName(a.Namespace, a.Name)}
	now := metav1.NewMicroTime(s.o.Now())
	var l coordinationv1.Lease
	err := s.o.Client.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: key.Namespace, Name: key.Name,
				Labels:      map[string]string{hosts.LeaseLabel: "true", hosts.LeaseNamespaceLabel: a.Namespace, hosts.LeaseNameLabel: a.Name},
				Annotations: map[string]string{hosts.ClockOffsetAnnotation: strconv.FormatInt(offset, 10)},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(a.Namespace + "/" + a.Name),
				LeaseDurationSeconds: ptr.To[int32](180),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		err := s.o.Client.Create(ctx, &l)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		writes.WithLabelValues("lease").Inc()
		return err
	}
	if err != nil {
		return err
	}
	old, _ := strconv.ParseInt(l.Annotations[hosts.ClockOffsetAnnotation], 10, 64)
	fresh := l.Spec.RenewTime != nil && now.Sub(l.Spec.RenewTime.Time) < s.o.LeaseRenewInterval
	// A changed clock is recorded early, within the host's own write
	// limit: a host alternating its clock does not turn its heartbeats
	// into Lease writes.
	if fresh && (registering || abs(offset-old) < 30 || !s.allowWrite(a)) {
		return nil
	}
	l.Spec.RenewTime = &now
	if !registering {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[hosts.ClockOffsetAnnotation] = strconv.FormatInt(offset, 10)
	}
	err = s.o.Client.Update(ctx, &l)
	if apierrors.IsConflict(err) {
		return nil
	}
	writes.WithLabelValues("lease").Inc()
	return err
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func (s *Server) stepResult(w http.ResponseWriter, r *http.Request, ref *AgentRef) {
	var res agentwire.StepResult
	if err := decode(w, r, maxStepResultBytes, &res); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	if s.o.Steps == nil {
		writeError(w, http.StatusNotFound, "UnknownStep", "no step %q was given to this host", r.PathValue("step"))
		return
	}
	if err := s.o.Steps.Result(r.Context(), ref, r.PathValue("step"), res); err != nil {
		var refused *RefusedError
		switch {
		case errors.Is(err, ErrReleased):
			writeError(w, http.StatusConflict, agentwire.CodeReleased, "%v", err)
		case errors.As(err, &refused):
			writeError(w, http.StatusBadRequest, "BadStepResult", "%v", err)
		default:
			// The apiserver's trouble, not the report's: the host sends it
			// again (a sanitization's evidence is what frees it).
			s.o.Log.Error(err, "take a step result", "agent", ref.Agent.Namespace+"/"+ref.Agent.Name, "step", r.PathValue("step"))
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, "Unavailable", "could not record the step result; send it again")
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) progress(w http.ResponseWriter, r *http.Request, ref *AgentRef) {
	var p agentwire.Progress
	if err := decode(w, r, maxBodyBytes, &p); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "%v", err)
		return
	}
	// Any stage by name here; which of them a host may report is the
	// steps' to say (lifecycle.HostStages).
	st := v1beta1.HostStage(p.Stage)
	known := p.Stage == agentwire.StageSanitizing || st == v1beta1.StageFailed || lifecycle.StageIndex(st) >= 0
	if !known || p.Percentage < 0 || p.Percentage > 100 || len(p.Info) > 1024 {
		writeError(w, http.StatusBadRequest, "BadProgress", "stage %q, percentage %d: want a known stage and 0-100", p.Stage, p.Percentage)
		return
	}
	// A host writing its disk does not heartbeat; its reports are contact.
	if err := s.renewLease(r.Context(), ref.Agent, 0, true); err != nil {
		s.o.Log.Error(err, "renew lease", "agent", ref.Agent.Namespace+"/"+ref.Agent.Name)
	}
	if !s.allowWrite(ref.Agent) {
		tooMany(w)
		return
	}
	if s.o.Steps != nil {
		if err := s.o.Steps.Progress(r.Context(), ref, p); err != nil {
			writeError(w, http.StatusConflict, "BadProgress", "%v", err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// key is the signing key, or false after answering 503 while the service
// has none yet (starting).
func (s *Server) key(w http.ResponseWriter) (signing.Key, bool) {
	key, err := s.o.Keys.Key()
	if err != nil {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "Starting", "the service is starting")
		return signing.Key{}, false
	}
	return key, true
}
