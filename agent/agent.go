package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/agent/client"
	"github.com/agentboot/agentboot/agent/internal/erase"
	"github.com/agentboot/agentboot/agent/internal/identity"
	"github.com/agentboot/agentboot/agent/internal/install"
	"github.com/agentboot/agentboot/agent/internal/inventory"
	"github.com/agentboot/agentboot/agent/internal/ntp"
	"github.com/agentboot/agentboot/agent/internal/staticnet"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// Config configures the on-host agent.
type Config struct {
	// ConfigPath is the agent config the discovery Ignition wrote.
	ConfigPath string
	// Version of this binary, sent at registration.
	Version string
	// Root is "/" except in tests.
	Root string
	// InventoryInterval is how often the inventory is collected again (it
	// is uploaded only when it changed).
	InventoryInterval time.Duration
	// SessionPath keeps the registration for a restart of the agent in
	// the same boot: on tmpfs (/run), so that a reboot forgets it. Empty:
	// every start registers.
	SessionPath string
	// RetryMin and RetryMax bound the backoff after failures.
	RetryMin, RetryMax time.Duration
	Log                *slog.Logger
}

// ErrInfraEnvGone is returned by Run when the InfraEnv was deleted.
var ErrInfraEnvGone = errors.New("the InfraEnv this host booted from was deleted")

// Agent is the on-host agent.
type Agent struct {
	cfg    Config
	conf   agentwire.Config
	client *client.Client
	log    *slog.Logger

	ns, id       string
	poll         time.Duration
	minDisk      int64
	lastUploaded [32]byte
	nextInv      time.Time
	backoff      client.Backoff
	// noWait: the agent API refused waitSeconds (it predates held
	// heartbeats); heartbeats are plain polls.
	noWait bool
	// reboot is set by a step that needs the host restarted once its
	// result is reported (a finished installation).
	reboot bool
}

// New reads the agent config.
func New(cfg Config) (*Agent, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.InventoryInterval == 0 {
		cfg.InventoryInterval = time.Minute
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	raw, err := os.ReadFile(cfg.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	var conf agentwire.Config
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("agent config %s: %w", cfg.ConfigPath, err)
	}
	if conf.APIURL == "" || conf.InfraEnv.UID == "" || conf.RegistrationToken == "" {
		return nil, fmt.Errorf("agent config %s lacks apiURL, infraEnv or registrationToken", cfg.ConfigPath)
	}
	c, err := client.New(conf)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, conf: conf, client: c, log: cfg.Log, backoff: client.Backoff{Min: cfg.RetryMin, Max: cfg.RetryMax}}, nil
}

// Run registers and then heartbeats until ctx ends or the InfraEnv is
// deleted (ErrInfraEnvGone). Failures of the service are retried forever.
func (a *Agent) Run(ctx context.Context) error {
	ntp.AddSources(ctx, a.conf.NTPSources, a.log)
	// Registered, the agent keeps its session through every failure but a
	// refused token: registering again while its session is alive would
	// be held off, and refused for good once its host is bound.
	registered := a.resumeSession()
	for {
		var err error
		if !registered {
			err = a.register(ctx)
			registered = err == nil
		}
		if registered {
			err = a.heartbeat(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrInfraEnvGone):
			a.log.Info("stopping: the InfraEnv was deleted", "infraEnv", a.conf.InfraEnv.Namespace+"/"+a.conf.InfraEnv.Name)
			return err
		case errors.Is(err, errReregister):
			registered = false
			a.forgetSession()
			a.log.Info("registering again", "reason", err)
		case client.IsCode(err, agentwire.CodeHostActive), client.IsCode(err, agentwire.CodeIdentityInDoubt):
			wait := a.backoff.After(err)
			a.log.Warn("registration refused; retrying", "err", err, "retryIn", wait.Round(time.Millisecond).String())
			if client.Sleep(ctx, wait) != nil {
				return nil
			}
		default:
			wait := a.backoff.After(err)
			a.log.Warn("agent API unavailable; retrying", "err", err, "retryIn", wait.Round(time.Millisecond).String())
			if client.Sleep(ctx, wait) != nil {
				return nil
			}
		}
	}
}

// bootProof reads the proof an ISO inserted through a BareMetalHost's BMC
// carries; nil when this boot is not from such an ISO.
func (a *Agent) bootProof() *agentwire.BootProof {
	raw, err := os.ReadFile(filepath.Join(a.cfg.Root, agentwire.BootProofPath))
	if err != nil {
		return nil
	}
	var p agentwire.BootProof
	if err := json.Unmarshal(raw, &p); err != nil || p.BareMetalHost == "" || p.Proof == "" {
		a.log.Warn("ignoring an unreadable boot proof", "path", agentwire.BootProofPath, "err", err)
		return nil
	}
	return &p
}

// session is what the agent keeps of its registration, in tmpfs: a
// restarted agent continues its session instead of registering again
// (which the service holds off while the session is alive), and a reboot
// forgets it.
type session struct {
	InfraEnvUID string                     `json:"infraEnvUID"`
	Response    agentwire.RegisterResponse `json:"response"`
}

// resumeSession continues the session a previous run of the agent in this
// boot began, if any.
func (a *Agent) resumeSession() bool {
	if a.cfg.SessionPath == "" {
		return false
	}
	raw, err := os.ReadFile(a.cfg.SessionPath)
	if err != nil {
		return false
	}
	var s session
	if json.Unmarshal(raw, &s) != nil || s.InfraEnvUID != a.conf.InfraEnv.UID || s.Response.AgentToken == "" {
		a.forgetSession()
		return false
	}
	r := s.Response
	a.ns, a.id = r.Namespace, r.HostID
	a.setToken(r.AgentToken)
	a.poll = time.Duration(r.PollSeconds) * time.Second
	a.minDisk = r.MinDiskSizeBytes
	a.log.Info("continuing the session of an earlier run", "agent", a.ns+"/"+a.id)
	return true
}

// setToken uses an agent token. A refused token is never shown again: a
// registration begins a new session once the service has seen this boot's
// session fall silent.
func (a *Agent) setToken(token string) { a.client.SetToken(token) }

func (a *Agent) saveSession(r agentwire.RegisterResponse) {
	if a.cfg.SessionPath == "" {
		return
	}
	raw, _ := json.Marshal(session{InfraEnvUID: a.conf.InfraEnv.UID, Response: r})
	p := a.cfg.SessionPath
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		a.log.Warn("keep the session for a restart", "err", err)
		return
	}
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		a.log.Warn("keep the session for a restart", "err", err)
	}
}

func (a *Agent) forgetSession() {
	if a.cfg.SessionPath != "" {
		_ = os.Remove(a.cfg.SessionPath)
	}
}

// errReregister means the Agent or its token is gone: register again.
var errReregister = errors.New("the Agent is gone or the token was refused")

func (a *Agent) register(ctx context.Context) error {
	ident := identity.Read(a.cfg.Root)
	hostID := identity.Primary(ident)
	for attempt := 0; ; attempt++ {
		resp, err := a.client.Register(ctx, a.conf.InfraEnv, a.conf.RegistrationToken, agentwire.RegisterRequest{
			InfraEnvUID: a.conf.InfraEnv.UID, HostID: hostID, Identity: ident, AgentVersion: a.cfg.Version,
			BootProof: a.bootProof(),
		})
		switch {
		case err == nil:
			a.ns, a.id = resp.Namespace, resp.HostID
			a.setToken(resp.AgentToken)
			a.poll = time.Duration(resp.PollSeconds) * time.Second
			a.minDisk = resp.MinDiskSizeBytes
			a.lastUploaded = [32]byte{}
			a.nextInv = time.Time{}
			a.backoff.Reset()
			a.log.Info("registered", "agent", a.ns+"/"+a.id)
			a.saveSession(resp)
			return nil
		case client.IsCode(err, agentwire.CodeHostIDConflict) && hostID != identity.Derived(ident):
			// Another host has this UUID (cloned VMs, lazy firmware).
			hostID = identity.Derived(ident)
			a.log.Info("host ID taken by another host; using the ID derived from MAC addresses", "hostID", hostID)
		case client.IsStatus(err, http.StatusGone):
			return ErrInfraEnvGone
		default:
			return fmt.Errorf("register: %w", err)
		}
	}
}

// heartbeat polls for instructions and keeps the inventory current.
func (a *Agent) heartbeat(ctx context.Context) error {
	for {
		if err := a.uploadInventory(ctx); err != nil {
			return err
		}
		// The service may hold the heartbeat until there is work: a host
		// bound to a cluster starts installing at once. A service from
		// before held heartbeats refuses the field (400): it is dropped.
		req := agentwire.InstructionsRequest{Time: time.Now().UTC(), NTPSources: ntp.Sources(ctx)}
		if !a.noWait {
			req.WaitSeconds = agentwire.MaxWaitSeconds
		}
		instr, err := a.client.Instructions(ctx, a.ns, a.id, req)
		if req.WaitSeconds > 0 && client.IsStatus(err, http.StatusBadRequest) && strings.Contains(err.Error(), "waitSeconds") {
			a.log.Info("the agent API does not hold heartbeats; polling without waitSeconds", "error", err.Error())
			a.noWait = true
			continue
		}
		if err := a.classify(err); err != nil {
			return err
		}
		for _, step := range instr.Steps {
			a.runStep(ctx, step)
		}
		a.backoff.Reset()
		wait := time.Duration(instr.PollSeconds) * time.Second
		if wait <= 0 {
			wait = a.poll
		}
		if wait <= 0 {
			wait = agentwire.DefaultPollInterval
		}
		// ±10% so that hosts booted together do not stay in step.
		wait = wait*9/10 + time.Duration(float64(wait)/5*randFloat())
		if client.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// classify turns API answers into what the loop does next.
func (a *Agent) classify(err error) error {
	switch {
	case err == nil:
		return nil
	case client.IsStatus(err, http.StatusGone):
		return ErrInfraEnvGone
	case client.IsStatus(err, http.StatusNotFound), client.IsStatus(err, http.StatusUnauthorized):
		return fmt.Errorf("%w: %v", errReregister, err)
	}
	return err
}

func (a *Agent) uploadInventory(ctx context.Context) error {
	if time.Now().Before(a.nextInv) {
		return nil
	}
	inv, err := inventory.Collect(ctx, inventory.Options{Root: a.cfg.Root, MinDiskSizeBytes: a.minDisk})
	if err != nil {
		return err
	}
	// The report time changes every time; what matters is the hardware.
	stamp := inv.ReportTime
	inv.ReportTime = nil
	raw, _ := json.Marshal(inv)
	sum := sha256.Sum256(raw)
	inv.ReportTime = stamp
	if sum == a.lastUploaded {
		a.nextInv = time.Now().Add(a.cfg.InventoryInterval)
		return nil
	}
	if err := a.classify(a.client.PutInventory(ctx, a.ns, a.id, inv)); err != nil {
		if client.IsStatus(err, http.StatusBadRequest) {
			// The service refused this inventory; it says why and the
			// next collection tries again.
			a.log.Error("inventory refused", "err", err)
			a.nextInv = time.Now().Add(a.backoff.Next())
			return nil
		}
		return err
	}
	a.lastUploaded = sum
	a.nextInv = time.Now().Add(a.cfg.InventoryInterval)
	a.log.Info("inventory uploaded", "cpus", inv.CPU.Count, "memoryBytes", inv.Memory.PhysicalBytes, "disks", len(inv.Disks), "interfaces", len(inv.Interfaces), "virtualization", inv.Virtualization.Verdict)
	return nil
}

func (a *Agent) runStep(ctx context.Context, s agentwire.Step) {
	res := agentwire.StepResult{ExitCode: 1, Error: fmt.Sprintf("step kind %q is not supported by this agent (version %s)", s.Kind, a.cfg.Version)}
	if run, ok := a.steps()[s.Kind]; ok {
		res = run(ctx, s)
	}
	err := a.client.StepResult(ctx, a.ns, a.id, s.ID, res)
	// A sanitization's evidence is what frees the host: an answer lost to
	// a network blip is sent again (the service refuses a second one).
	for try := 1; err != nil && s.Kind == agentwire.StepSanitize && !isRefusal(err) && try < 10 && ctx.Err() == nil; try++ {
		a.log.Error("report step result; retrying", "step", s.ID, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Duration(try)*5*time.Second, time.Minute)):
		}
		err = a.client.StepResult(ctx, a.ns, a.id, s.ID, res)
	}
	if err != nil {
		a.log.Error("report step result", "step", s.ID, "err", err)
		if client.IsCode(err, agentwire.CodeReleased) && s.Install != nil {
			// Unbound while installing: what was written must not boot.
			a.reboot = false
			if err := install.Void(s.Install.DiskPath); err != nil {
				a.log.Error("wipe the void installation", "disk", s.Install.DiskPath, "err", err)
			}
			a.log.Info("released from its cluster while installing; staying in discovery", "disk", s.Install.DiskPath)
		}
	}
	if a.reboot {
		a.log.Info("rebooting into the installed system")
		unix.Sync()
		if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
			a.log.Error("reboot", "err", err)
		}
	}
}

// timeLeft estimates what is left of a job going at a steady rate ("about
// 3m12s left"), "" until a second's worth of it says anything.
func timeLeft(elapsed time.Duration, done, total int64) string {
	if done <= 0 || total <= done || elapsed < time.Second {
		return ""
	}
	left := time.Duration(float64(elapsed) * float64(total-done) / float64(done))
	return "about " + left.Round(time.Second).String() + " left"
}

// isRefusal reports an answer from the service that sending the same again
// would get again: a 4xx but 429 (too many requests).
func isRefusal(err error) bool {
	var se *client.StatusError
	return errors.As(err, &se) && se.Status >= 400 && se.Status < 500 && se.Status != http.StatusTooManyRequests
}

// steps maps step kinds to their implementations.
func (a *Agent) steps() map[string]func(context.Context, agentwire.Step) agentwire.StepResult {
	return map[string]func(context.Context, agentwire.Step) agentwire.StepResult{
		agentwire.StepInstall:  a.install,
		agentwire.StepSanitize: a.sanitize,
	}
}

// sanitize erases the host's disks before it can be bound again, reporting
// its progress (which also keeps the host connected: it does not heartbeat
// meanwhile) and returning the evidence.
func (a *Agent) sanitize(ctx context.Context, s agentwire.Step) agentwire.StepResult {
	if s.Sanitize == nil {
		return agentwire.StepResult{ExitCode: 1, Error: "sanitize step without its parameters"}
	}
	level, err := sanitize.ParseLevel(s.Sanitize.Level)
	if err != nil || level == sanitize.None {
		return agentwire.StepResult{ExitCode: 1, Error: fmt.Sprintf("sanitize step with level %q: want metadata or erase", s.Sanitize.Level)}
	}
	n := len(s.Sanitize.Disks)
	last := time.Time{}
	current, diskStart := -1, time.Now()
	progress := func(i int, disk string, done, total int64, overall float64) {
		if i != current {
			current, diskStart = i, time.Now()
		}
		// Every 10 s at most: an erase of a large disk takes hours.
		if time.Since(last) < 10*time.Second && done < total {
			return
		}
		last = time.Now()
		pct := int(100 * overall)
		info := fmt.Sprintf("disk %d of %d, %s: %d of %d MiB", i+1, n, disk, done>>20, total>>20)
		if left := timeLeft(time.Since(diskStart), done, total); left != "" {
			info += ", " + left + " on it"
		}
		if err := a.client.Progress(ctx, a.ns, a.id, agentwire.Progress{Stage: agentwire.StageSanitizing, Percentage: pct, Info: info}); err != nil {
			a.log.Error("report progress", "stage", agentwire.StageSanitizing, "err", err)
		}
	}
	evidence, err := sanitizeDisks(ctx, level, "", s.Sanitize.Disks, s.Sanitize.Keep, a.log, progress)
	res := agentwire.StepResult{Sanitization: evidence, Output: fmt.Sprintf("sanitized %d disks at level %s", n, level)}
	if err != nil {
		res.ExitCode, res.Error, res.Output = 1, err.Error(), ""
	}
	return res
}

// install writes the OS to disk, reporting each stage, then asks for a
// reboot into it.
func (a *Agent) install(ctx context.Context, s agentwire.Step) agentwire.StepResult {
	if s.Install == nil {
		return agentwire.StepResult{ExitCode: 1, Error: "install step without its parameters"}
	}
	report := func(stage string, pct int, info string) {
		info = clip.Text(info, 1000)
		if err := a.client.Progress(ctx, a.ns, a.id, agentwire.Progress{Stage: stage, Percentage: pct, Info: info}); err != nil {
			a.log.Error("report progress", "stage", stage, "err", err)
		}
	}
	err := install.Run(ctx, *s.Install, install.Options{HTTP: a.client.HTTP(), Progress: report})
	if err != nil {
		report(install.StageFailed, 0, err.Error())
		return agentwire.StepResult{ExitCode: 1, Error: err.Error()}
	}
	a.reboot = true
	return agentwire.StepResult{Output: "installed to " + s.Install.DiskPath}
}

// Install writes an OS image to a disk, for `agent install`.
func Install(ctx context.Context, step agentwire.InstallStep, progress func(stage string, pct int, info string)) error {
	return install.Run(ctx, step, install.Options{Progress: progress})
}

// SentMethods are the methods of the erase level this agent sends, from
// the fastest, for `agent sanitize --method`.
func SentMethods() []string {
	var out []string
	for _, m := range erase.Sent() {
		out = append(out, string(m))
	}
	return out
}

// Sanitize erases disks at level, for `agent sanitize`: each disk is
// probed, the method chosen (internal/sanitize) among those this agent
// carries out, erased and read back. A method, when not empty, is used on
// every disk that the level erases and that offers it (sanitize.Force);
// a disk that does not offer it fails. Disks in keep are left alone. Every
// disk gets its evidence, a failed one with its Error; the error joins the
// failures.
func Sanitize(ctx context.Context, level sanitize.Level, method sanitize.Method, disks, keep []string, log *slog.Logger) ([]agentwire.DiskSanitization, error) {
	sent := SentMethods()
	switch {
	case method == "":
	case level != sanitize.Erase || !method.ErasesEveryBlock():
		return nil, fmt.Errorf("method %q: want a method of the erase level (%s), at level erase", method, strings.Join(sent, ", "))
	case !slices.Contains(sent, string(method)):
		return nil, fmt.Errorf("method %s: decided but not sent by this agent (docs/security.md); it sends %s", method, strings.Join(sent, ", "))
	}
	return sanitizeDisks(ctx, level, method, disks, keep, log, nil)
}

// diskProgress receives the progress of the i-th disk, and of the whole
// sanitization (0 to 1), in which each disk weighs its bytes to erase.
type diskProgress func(i int, disk string, done, total int64, overall float64)

func sanitizeDisks(ctx context.Context, level sanitize.Level, method sanitize.Method, disks, keep []string, log *slog.Logger, progress diskProgress) ([]agentwire.DiskSanitization, error) {
	// A disk may be named by a link (/dev/disk/by-id/…) on one list and by
	// its device on the other.
	device := func(p string) string {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return real
		}
		return p
	}
	kept := map[string]bool{}
	for _, k := range keep {
		kept[device(k)] = true
	}
	// Every disk is probed and its method chosen first; then the
	// signatures and partition tables of every disk a long erase is
	// planned for are wiped (erase.Disarm), so that a host that loses
	// power during the long part has no partition table or boot code left
	// to boot; then each is erased and checked.
	type planned struct {
		t    erase.Target
		plan sanitize.Plan
		err  error
	}
	plans := make([]planned, len(disks))
	for i, d := range disks {
		p := &plans[i]
		if kept[device(d)] {
			// Never opened, never asked anything: what it holds or what
			// holds it is the administrator's business.
			p.t = erase.Target{Path: d, Device: sanitize.Device{Kept: true}}
			p.plan = sanitize.Choose(level, p.t.Device)
			continue
		}
		p.t, p.err = erase.Probe(erase.Options{}, d, false)
		if p.err != nil {
			continue
		}
		if method != "" {
			p.plan = sanitize.Force(level, erase.Supported(p.t.Device), method)
			continue
		}
		p.plan = sanitize.Choose(level, erase.Supported(p.t.Device))
		if offered := sanitize.Choose(level, p.t.Device); offered.Method != p.plan.Method {
			p.plan.Why += "; the device also offers " + string(offered.Method) + ", which this agent does not send"
		}
	}
	// The whole erase's progress counts bytes: a skipped disk or a
	// metadata wipe weighs nothing next to an erase of every block (by
	// disks when there is none).
	weights := make([]int64, len(plans))
	var all int64
	for i := range plans {
		if p := &plans[i]; p.err == nil {
			p.err = erase.Disarm(ctx, p.t, p.plan)
			if p.err == nil && p.plan.Method.ErasesEveryBlock() {
				weights[i] = p.t.Size
				all += p.t.Size
			}
		}
	}
	var before int64
	var out []agentwire.DiskSanitization
	var errs []error
	for i, d := range disks {
		start := before // the bytes of the disks before this one
		before += weights[i]
		report := func(done, total int64) {
			if progress == nil {
				return
			}
			part := float64(done) / float64(max(total, 1))
			overall := (float64(i) + part) / float64(len(disks))
			if all > 0 {
				overall = (float64(start) + part*float64(weights[i])) / float64(all)
			}
			progress(i, d, done, total, overall)
		}
		ev := agentwire.DiskSanitization{Disk: d}
		err := plans[i].err
		if err == nil {
			ev, err = sanitizeDisk(ctx, plans[i].t, plans[i].plan, log, report)
		}
		if err != nil {
			ev.Error = err.Error()
			errs = append(errs, err)
		}
		out = append(out, ev)
	}
	return out, errors.Join(errs...)
}

func sanitizeDisk(ctx context.Context, t erase.Target, plan sanitize.Plan, log *slog.Logger, report erase.Progress) (agentwire.DiskSanitization, error) {
	disk := t.Path
	log.Info("sanitizing", "disk", disk, "bytes", t.Size, "method", plan.Method, "why", plan.Why, "notes", strings.Join(t.Notes, "; "))
	last := -1
	return erase.Run(ctx, t, plan, func(done, total int64) {
		if pct := int(100 * done / max(total, 1)); pct/5 != last/5 {
			last = pct
			log.Info("sanitizing", "disk", disk, "percentage", pct)
		}
		report(done, total)
	})
}

// Inventory collects and returns the inventory, for `agent inventory`.
func Inventory(ctx context.Context, root string) (*agentwire.Inventory, error) {
	return inventory.Collect(ctx, inventory.Options{Root: root})
}

func randFloat() float64 { return rand.Float64() }

// ApplyStaticNetwork writes this host's NMStateConfig for NetworkManager,
// for `agent static-network`.
func ApplyStaticNetwork(root, configPath, outDir string) (string, error) {
	return staticnet.Apply(root, configPath, outDir)
}
