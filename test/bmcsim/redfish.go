package bmcsim

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Faults make the Redfish service misbehave like BMCs do in the field.
type Faults struct {
	// Unreachable closes every connection without an answer (a BMC that
	// rebooted or dropped off the network).
	Unreachable bool
	// Delay holds every answer this long (a BMC that times out).
	Delay time.Duration
	// ServerErrors answers every request with 500.
	ServerErrors bool
	// DropBootOverride accepts boot override PATCHes and forgets them.
	DropBootOverride bool
	// IgnorePower accepts every ComputerSystem.Reset (204) and does
	// nothing.
	IgnorePower bool
}

// Redfish is a Redfish service with one System and one Manager whose
// VirtualMedia CD can be mounted: what bmclib's gofish provider uses for
// power, one-time boot and virtual media. It accepts HTTP basic auth and
// sessions (X-Auth-Token).
type Redfish struct {
	User, Password string
	// SystemID names the System (and is its Name, which bmclib matches).
	SystemID string
	Machine  Machine
	// MediaDir, when set, is where inserted images are downloaded, as a
	// BMC fetches them before the host can boot them, with Client
	// (http.DefaultClient when nil).
	MediaDir string
	Client   *http.Client
	// Hook, when set, is called with every event after the request that
	// caused it is handled and before its answer is sent, so that a test
	// can inject a fault at a precise moment. It must not block for long.
	Hook func(event string)
	// Clock is the time the hardware keeps: how long its transitions,
	// sessions and refusal windows last (the real clock when nil; a test
	// of the simulator's own timing steps a testenv.ManualClock).
	Clock Clock

	chassisOnce sync.Once
	ch          *chassis

	mu          sync.Mutex
	faults      Faults
	quirks      Quirks
	override    string // Redfish BootSourceOverrideTarget
	enabled     string // BootSourceOverrideEnabled
	mode        string // BootSourceOverrideMode
	image       string
	imagePath   string
	inserted    bool
	sessions    map[string]time.Time // token → last use
	offAt       time.Time            // when the platform last powered off
	events      []string
	downloadSeq int
}

// Quirks are behaviours of real BMCs that are not faults: a controller
// must work with them.
type Quirks struct {
	// OnceAsContinuous keeps a one-time boot override and reports it as
	// Continuous (BMCs without Once support).
	OnceAsContinuous bool
	// SessionTimeout expires sessions idle this long (real BMCs: 30 min by
	// default, some 5 min); a request with an expired token is 401.
	SessionTimeout time.Duration

	// Vendor quirks users report most (docs/bmc.md names the sources).

	// IDRACPowerOnConflict refuses a power-on for this long after the host
	// powered off: 409 with MessageId ActionParameterValueConflict (iDRAC;
	// Ironic retries it for a minute, [redfish]power_on_conflict_retry_*).
	IDRACPowerOnConflict time.Duration
	// SupermicroBootPatch keeps only the target of a Boot PATCH that does
	// not also send BootSourceOverrideEnabled and BootSourceOverrideMode:
	// the override is left Disabled and the mode Legacy (bmclib PR 459,
	// Ironic story 2008547).
	SupermicroBootPatch bool
	// ILOMedia answers 415 to an EjectMedia without a JSON body ({}) and
	// 400 to one with nothing inserted (sushy; bmclib issue 410).
	ILOMedia bool
	// NoGracefulShutdown offers no GracefulShutdown reset type (iLO 4):
	// gofish refuses to send it, and the BMC answers 400 if it comes.
	NoGracefulShutdown bool
}

// HoldTransitions keeps power transitions that take time from ending until
// it is called with false: a test acts inside one whatever the load.
func (r *Redfish) HoldTransitions(on bool) { r.power().hold(on) }

// SetTiming makes power transitions take time (see Timing).
func (r *Redfish) SetTiming(t Timing) { r.power().setTiming(t) }

// SetQuirks replaces the active quirks.
func (r *Redfish) SetQuirks(q Quirks) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quirks = q
}

// PowerState is what the BMC reports: On, Off, PoweringOn or PoweringOff.
func (r *Redfish) PowerState() string { return r.power().state() }

// Close stops a power transition in progress.
func (r *Redfish) Close() { r.power().close() }

func (r *Redfish) clock() Clock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

func (r *Redfish) power() *chassis {
	r.chassisOnce.Do(func() {
		r.ch = &chassis{m: r.Machine, clock: r.clock(), note: func(ev string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if ev == "power off" {
				r.offAt = r.clock().Now()
			}
			r.event("%s", ev)
		}}
	})
	return r.ch
}

// SetFaults replaces the active faults.
func (r *Redfish) SetFaults(f Faults) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = f
}

// Events lists what the BMC did, in order: "boot-override Pxe Once",
// "insert <url>", "eject", "power on <device>", "power off", and what it
// was asked: "request <ResetType>", "refused <ResetType>".
func (r *Redfish) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// Image is the inserted virtual media URL ("" when ejected).
func (r *Redfish) Image() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.inserted {
		return ""
	}
	return r.image
}

func (r *Redfish) event(format string, a ...any) {
	r.events = append(r.events, fmt.Sprintf(format, a...))
}

func (r *Redfish) id() string {
	if r.SystemID == "" {
		return "1"
	}
	return r.SystemID
}

// ServeHTTP implements http.Handler.
func (r *Redfish) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	seen := len(r.events)
	r.mu.Unlock()
	r.serve(w, req)
	if r.Hook == nil {
		return
	}
	r.mu.Lock()
	evs := append([]string(nil), r.events[seen:]...)
	r.mu.Unlock()
	for _, ev := range evs {
		r.Hook(ev)
	}
}

func (r *Redfish) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	f := r.faults
	r.mu.Unlock()
	if f.Unreachable {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if d := f.Delay + r.power().latency(); d > 0 {
		select {
		case <-time.After(d):
		case <-req.Context().Done():
			return
		}
	}
	if f.ServerErrors {
		redfishError(w, http.StatusInternalServerError, "simulated internal error")
		return
	}
	path := strings.TrimSuffix(req.URL.Path, "/")
	if path == "/redfish/v1" || path == "/redfish" {
		r.serviceRoot(w)
		return
	}
	if path == "/redfish/v1/SessionService/Sessions" && req.Method == http.MethodPost {
		r.login(w, req)
		return
	}
	if !r.authorized(req) {
		w.Header().Set("WWW-Authenticate", `Basic realm="redfish"`)
		redfishError(w, http.StatusUnauthorized, "authentication required")
		return
	}
	sys := "/redfish/v1/Systems/" + r.id()
	mgr := "/redfish/v1/Managers/1"
	cd := mgr + "/VirtualMedia/Cd"
	switch {
	case path == "/redfish/v1/SessionService" && req.Method == http.MethodGet:
		writeJSON(w, map[string]any{"@odata.id": path, "Id": "SessionService", "ServiceEnabled": true,
			"Sessions": link("/redfish/v1/SessionService/Sessions")})
	case strings.HasPrefix(path, "/redfish/v1/SessionService/Sessions/") && req.Method == http.MethodDelete:
		r.mu.Lock()
		delete(r.sessions, strings.TrimPrefix(path, "/redfish/v1/SessionService/Sessions/"))
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case path == "/redfish/v1/Systems" && req.Method == http.MethodGet:
		writeJSON(w, collection(path, sys))
	case path == sys && req.Method == http.MethodGet:
		r.system(w, sys, mgr)
	case path == sys && req.Method == http.MethodPatch:
		r.patchSystem(w, req)
	case path == sys+"/Actions/ComputerSystem.Reset" && req.Method == http.MethodPost:
		r.reset(w, req)
	case path == "/redfish/v1/Managers" && req.Method == http.MethodGet:
		writeJSON(w, collection(path, mgr))
	case path == mgr && req.Method == http.MethodGet:
		writeJSON(w, map[string]any{"@odata.id": mgr, "@odata.type": "#Manager.v1_10_0.Manager", "Id": "1", "Name": "Manager",
			"ManagerType": "BMC", "VirtualMedia": link(mgr + "/VirtualMedia"),
			"Links": map[string]any{"ManagerForServers": []any{link(sys)}}})
	case path == mgr+"/VirtualMedia" && req.Method == http.MethodGet:
		writeJSON(w, collection(path, cd))
	case path == cd && req.Method == http.MethodGet:
		r.virtualMedia(w, cd)
	case path == cd+"/Actions/VirtualMedia.InsertMedia" && req.Method == http.MethodPost:
		r.insert(w, req)
	case path == cd+"/Actions/VirtualMedia.EjectMedia" && req.Method == http.MethodPost:
		r.eject(w, req)
	default:
		redfishError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not a resource of this service", req.Method, path))
	}
}

func (r *Redfish) serviceRoot(w http.ResponseWriter) {
	writeJSON(w, map[string]any{
		"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
		"Id": "RootService", "Name": "agentboot Redfish simulator", "RedfishVersion": "1.11.0",
		"UUID":           "6a6e7c52-1b1c-4f0e-9d55-5d2a5c1e0001",
		"Systems":        link("/redfish/v1/Systems"),
		"Managers":       link("/redfish/v1/Managers"),
		"SessionService": link("/redfish/v1/SessionService"),
		"Links":          map[string]any{"Sessions": link("/redfish/v1/SessionService/Sessions")},
	})
}

func (r *Redfish) authorized(req *http.Request) bool {
	if tok := req.Header.Get("X-Auth-Token"); tok != "" {
		r.mu.Lock()
		defer r.mu.Unlock()
		last, ok := r.sessions[tok]
		if ok && r.quirks.SessionTimeout > 0 && r.clock().Now().Sub(last) > r.quirks.SessionTimeout {
			delete(r.sessions, tok)
			r.event("session expired")
			return false
		}
		if ok {
			r.sessions[tok] = r.clock().Now()
		}
		return ok
	}
	u, p, ok := req.BasicAuth()
	return ok && r.credentialsMatch(u, p)
}

func (r *Redfish) credentialsMatch(u, p string) bool {
	return subtle.ConstantTimeCompare([]byte(u), []byte(r.User)) == 1 &&
		subtle.ConstantTimeCompare([]byte(p), []byte(r.Password)) == 1
}

func (r *Redfish) login(w http.ResponseWriter, req *http.Request) {
	var body struct{ UserName, Password string }
	if err := json.NewDecoder(io.LimitReader(req.Body, 4096)).Decode(&body); err != nil {
		redfishError(w, http.StatusBadRequest, "malformed session request: "+err.Error())
		return
	}
	if !r.credentialsMatch(body.UserName, body.Password) {
		redfishError(w, http.StatusUnauthorized, "invalid credentials")
		return
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	r.mu.Lock()
	if r.sessions == nil {
		r.sessions = map[string]time.Time{}
	}
	r.sessions[tok] = r.clock().Now()
	r.mu.Unlock()
	loc := "/redfish/v1/SessionService/Sessions/" + tok
	w.Header().Set("X-Auth-Token", tok)
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"@odata.id": loc, "Id": tok, "UserName": body.UserName})
}

func (r *Redfish) system(w http.ResponseWriter, sys, mgr string) {
	r.mu.Lock()
	override, enabled, mode := r.override, r.enabled, r.mode
	resetTypes := []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"}
	if r.quirks.NoGracefulShutdown {
		resetTypes = []string{"On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"}
	}
	r.mu.Unlock()
	power := r.power().state()
	writeJSON(w, map[string]any{
		"@odata.id": sys, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": r.id(), "Name": r.id(), "SystemType": "Physical", "PowerState": power,
		"Manufacturer": "agentboot", "Model": "simulated server",
		"Boot": map[string]any{
			"BootSourceOverrideTarget":                         orDefault(override, "None"),
			"BootSourceOverrideEnabled":                        orDefault(enabled, "Disabled"),
			"BootSourceOverrideMode":                           orDefault(mode, "UEFI"),
			"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Cd", "Hdd", "BiosSetup"},
		},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            sys + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": resetTypes,
		}},
		"Links": map[string]any{"ManagedBy": []any{link(mgr)}},
	})
}

func (r *Redfish) patchSystem(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Boot *struct {
			BootSourceOverrideTarget  string
			BootSourceOverrideEnabled string
			BootSourceOverrideMode    string
		}
	}
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
		redfishError(w, http.StatusBadRequest, "malformed PATCH body: "+err.Error())
		return
	}
	if body.Boot != nil && r.quirkSupermicro() && (body.Boot.BootSourceOverrideEnabled == "" || body.Boot.BootSourceOverrideMode == "") {
		body.Boot.BootSourceOverrideEnabled, body.Boot.BootSourceOverrideMode = "Disabled", "Legacy"
	}
	if body.Boot != nil {
		switch body.Boot.BootSourceOverrideTarget {
		case "", "None", "Pxe", "Cd", "Hdd", "BiosSetup":
		default:
			redfishError(w, http.StatusBadRequest, fmt.Sprintf("unsupported BootSourceOverrideTarget %q", body.Boot.BootSourceOverrideTarget))
			return
		}
		r.mu.Lock()
		if r.faults.DropBootOverride {
			r.event("boot-override dropped")
		} else {
			if t := body.Boot.BootSourceOverrideTarget; t != "" {
				r.override = t
			}
			if e := body.Boot.BootSourceOverrideEnabled; e != "" {
				r.enabled = e
				if e == "Once" && r.quirks.OnceAsContinuous {
					r.enabled = "Continuous"
				}
			}
			if m := body.Boot.BootSourceOverrideMode; m != "" {
				r.mode = m
			}
			r.event("boot-override %s %s", r.override, r.enabled)
		}
		r.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) reset(w http.ResponseWriter, req *http.Request) {
	var body struct{ ResetType string }
	if err := json.NewDecoder(io.LimitReader(req.Body, 4096)).Decode(&body); err != nil {
		redfishError(w, http.StatusBadRequest, "malformed reset request: "+err.Error())
		return
	}
	r.mu.Lock()
	r.event("request %s", body.ResetType)
	r.mu.Unlock()
	ch := r.power()
	var err error
	r.mu.Lock()
	if r.quirks.NoGracefulShutdown && strings.HasPrefix(body.ResetType, "Graceful") {
		r.event("refused %s", body.ResetType)
		r.mu.Unlock()
		redfishErrorID(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "The value "+body.ResetType+" for ResetType is not supported")
		return
	}
	if r.faults.IgnorePower {
		r.event("ignored %s", body.ResetType)
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	conflict := r.quirks.IDRACPowerOnConflict > 0 && !r.offAt.IsZero() && r.clock().Now().Sub(r.offAt) < r.quirks.IDRACPowerOnConflict
	r.mu.Unlock()
	switch body.ResetType {
	case "On":
		if conflict && ch.state() == Off {
			r.mu.Lock()
			r.event("refused On")
			r.mu.Unlock()
			redfishErrorID(w, http.StatusConflict, "Base.1.12.ActionParameterValueConflict",
				"The parameter value On for the action ComputerSystem.Reset conflicts with the current state of the system.")
			return
		}
		_, err = ch.powerOn(r.bootDevice)
	case "ForceOff":
		err = ch.powerOff(false)
	case "GracefulShutdown":
		err = ch.powerOff(true)
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		err = ch.restart(r.bootDevice)
	default:
		redfishError(w, http.StatusBadRequest, fmt.Sprintf("unsupported ResetType %q", body.ResetType))
		return
	}
	switch {
	case errors.Is(err, ErrBusy):
		r.mu.Lock()
		r.event("refused %s", body.ResetType)
		r.mu.Unlock()
		redfishError(w, http.StatusConflict, "The requested operation cannot be performed: "+err.Error())
	case err != nil && strings.HasPrefix(err.Error(), "Command not supported"):
		// Like many BMCs: a restart needs a running host.
		redfishError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		redfishError(w, http.StatusInternalServerError, err.Error())
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// bootDevice is read when the platform powers on: it consumes a one-time
// boot override (a Continuous one stays).
func (r *Redfish) bootDevice() (dev, cdrom string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	dev = BootDefault
	if r.enabled == "Once" || r.enabled == "Continuous" {
		switch r.override {
		case "Pxe":
			dev = BootPXE
		case "Cd":
			dev = BootCDROM
		}
	}
	if r.enabled == "Once" {
		r.override, r.enabled = "None", "Disabled"
	}
	if r.inserted {
		cdrom = r.imagePath
	}
	r.event("power on %s", orDefault(dev, "default"))
	return dev, cdrom
}

func (r *Redfish) virtualMedia(w http.ResponseWriter, cd string) {
	r.mu.Lock()
	inserted, image := r.inserted, r.image
	r.mu.Unlock()
	writeJSON(w, map[string]any{
		"@odata.id": cd, "@odata.type": "#VirtualMedia.v1_3_0.VirtualMedia", "Id": "Cd", "Name": "Virtual CD",
		"MediaTypes": []string{"CD", "DVD"}, "Inserted": inserted, "Image": image, "WriteProtected": true,
		"ConnectedVia": "URI",
		"Actions": map[string]any{
			"#VirtualMedia.InsertMedia": map[string]any{"target": cd + "/Actions/VirtualMedia.InsertMedia"},
			"#VirtualMedia.EjectMedia":  map[string]any{"target": cd + "/Actions/VirtualMedia.EjectMedia"},
		},
	})
}

func (r *Redfish) quirkSupermicro() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.quirks.SupermicroBootPatch
}

func (r *Redfish) eject(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quirks.ILOMedia {
		var body map[string]any
		if err := json.NewDecoder(io.LimitReader(req.Body, 4096)).Decode(&body); err != nil {
			redfishErrorID(w, http.StatusUnsupportedMediaType, "Base.1.4.UnsupportedMediaType", "EjectMedia needs a JSON body")
			return
		}
		if !r.inserted {
			redfishErrorID(w, http.StatusBadRequest, "iLO.2.14.UnableToEjectMedia", "No media is inserted")
			return
		}
	}
	r.inserted, r.image, r.imagePath = false, "", ""
	r.event("eject")
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) insert(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Image    string
		Inserted *bool
	}
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil || body.Image == "" {
		redfishError(w, http.StatusBadRequest, "InsertMedia needs an Image")
		return
	}
	r.mu.Lock()
	inserted := r.inserted
	r.mu.Unlock()
	if inserted {
		// As iDRAC and iLO do: the CD must be ejected first.
		redfishError(w, http.StatusConflict, "Virtual media is already inserted; eject it first")
		return
	}
	path := ""
	if r.MediaDir != "" {
		var err error
		if path, err = r.download(req.Context(), body.Image); err != nil {
			redfishError(w, http.StatusBadRequest, "cannot fetch the image: "+err.Error())
			return
		}
	}
	r.mu.Lock()
	r.inserted, r.image, r.imagePath = true, body.Image, path
	r.event("insert %s", body.Image)
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) download(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	c := r.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	r.mu.Lock()
	r.downloadSeq++
	path := filepath.Join(r.MediaDir, fmt.Sprintf("virtual-cd-%d.iso", r.downloadSeq))
	r.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

func link(id string) map[string]string { return map[string]string{"@odata.id": id} }

func collection(id string, members ...string) map[string]any {
	var m []any
	for _, x := range members {
		m = append(m, link(x))
	}
	return map[string]any{"@odata.id": id, "Members": m, "Members@odata.count": len(m)}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func redfishError(w http.ResponseWriter, code int, msg string) {
	redfishErrorID(w, code, "Base.1.8.GeneralError", msg)
}

func redfishErrorID(w http.ResponseWriter, code int, id, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": id, "message": msg,
		"@Message.ExtendedInfo": []any{map[string]string{"MessageId": id, "Message": msg}},
	}})
}
