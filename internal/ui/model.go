// Package ui serves a read-only page of the pool's hosts (docs/ui.md):
// hosts by InfraEnv with their state, inventory, validations, progress, BMC
// state, disk sanitization and boot trace, kept live by watches made with
// the viewer's own Kubernetes credentials.
package ui

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/poolmetrics"
)

// Snapshot is what the page shows, sent whole on every change.
type Snapshot struct {
	Generated time.Time `json:"generated"`
	// Scope says what is watched: every namespace, or one.
	Scope string `json:"scope"`
	// Errors are what the viewer may not read, as the apiserver said it.
	Errors []string `json:"errors,omitempty"`
	Groups []Group  `json:"groups"`
}

// Group is an InfraEnv's hosts, or the hosts no InfraEnv claims.
type Group struct {
	Namespace string         `json:"namespace"`
	InfraEnv  string         `json:"infraEnv"`
	Note      string         `json:"note,omitempty"`
	Counts    map[string]int `json:"counts"`
	Hosts     []Host         `json:"hosts"`
}

// Host is one row: an Agent, or a MAC seen booting that has none yet.
type Host struct {
	Key      string `json:"key"`
	Agent    string `json:"agent,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	State    string `json:"state"`
	// AgentState is the Agent's own state (status.debugInfo.state).
	AgentState string   `json:"agentState,omitempty"`
	Approved   bool     `json:"approved"`
	Cluster    string   `json:"cluster,omitempty"`
	Inventory  string   `json:"inventory,omitempty"`
	MACs       []string `json:"macs,omitempty"`
	Failing    []string `json:"failing,omitempty"`
	Progress   string   `json:"progress,omitempty"`
	BMC        string   `json:"bmc,omitempty"`
	// Sanitization is the disk sanitization's state and evidence.
	Sanitization []string `json:"sanitization,omitempty"`
	Trace        *Trace   `json:"trace,omitempty"`
}

// Trace is a host's boot path as the page shows it.
type Trace struct {
	Stopped string           `json:"stopped,omitempty"`
	Since   time.Time        `json:"since,omitempty"`
	Reason  string           `json:"reason"`
	Done    bool             `json:"done"`
	Steps   []boottrace.Step `json:"steps,omitempty"`
}

// Booting is the state of a MAC seen booting whose host has not
// registered.
const Booting = "booting"

// objects is what the watches hold.
type objects struct {
	infraEnvs map[string]*v1beta1.InfraEnv
	agents    map[string]*v1beta1.Agent
	hosts     map[string]*metal3.BareMetalHost
	traces    map[string]*v1alpha1.BootTrace
}

// build makes the snapshot from the objects; home is agentboot's
// namespace (traces of unclaimed MACs).
func build(o objects, home string) []Group {
	groups := map[[2]string]*Group{}
	group := func(ns, ie string) *Group {
		k := [2]string{ns, ie}
		if g := groups[k]; g != nil {
			return g
		}
		g := &Group{Namespace: ns, InfraEnv: ie, Counts: map[string]int{}}
		groups[k] = g
		return g
	}
	for _, ie := range o.infraEnvs {
		group(ie.Namespace, ie.Name)
	}
	// The BareMetalHost labelled onto an Agent, by namespace/name.
	bmhOf := func(a *v1beta1.Agent) *metal3.BareMetalHost {
		if n := a.Labels[v1beta1.BMHLabel]; n != "" {
			return o.hosts[a.Namespace+"/"+n]
		}
		return nil
	}
	// A host's MACs are what it reports: its trace is looked for in its
	// own namespace only, never taken from another team's.
	tracesByMAC := map[[2]string]*v1alpha1.BootTrace{}
	for _, t := range o.traces {
		k := [2]string{t.Namespace, t.Status.MACAddress}
		if cur := tracesByMAC[k]; cur == nil || seen(t).After(seen(cur)) {
			tracesByMAC[k] = t
		}
	}
	withAgent := map[[2]string]bool{}
	for _, a := range o.agents {
		rec := lifecycle.Registration(a)
		ie := rec.InfraEnv
		if ie == "" {
			ie = a.Labels[v1beta1.InfraEnvNameLabel]
		}
		h := agentRow(a, bmhOf(a))
		var trace *v1alpha1.BootTrace
		for _, mac := range h.MACs {
			k := [2]string{a.Namespace, mac}
			withAgent[k] = true
			if t := tracesByMAC[k]; t != nil && (trace == nil || seen(t).After(seen(trace))) {
				trace = t
			}
		}
		h.Trace = traceView(trace, a)
		g := group(a.Namespace, ie)
		g.Hosts = append(g.Hosts, h)
		g.Counts[h.State]++
	}
	for k, t := range tracesByMAC {
		if withAgent[k] {
			continue
		}
		mac := k[1]
		ns, ie := t.Namespace, ""
		if _, name, ok := strings.Cut(t.Status.InfraEnv, "/"); ok {
			ie = name
		}
		if boottrace.Unclaimed(t, home) {
			ns, ie = "", ""
		}
		g := group(ns, ie)
		if ns == "" {
			g.Note = "MACs nothing claims: no BareMetalHost names them and no InfraEnv is the PXE default"
		}
		h := Host{Key: "mac/" + mac, State: Booting, MACs: []string{mac}, Trace: traceView(t, nil)}
		for _, bmh := range o.hosts {
			if strings.EqualFold(bmh.Spec.BootMACAddress, mac) && bmh.Namespace == t.Namespace {
				h.BMC = bmcState(bmh)
			}
		}
		g.Hosts = append(g.Hosts, h)
		g.Counts[Booting]++
	}
	out := make([]Group, 0, len(groups))
	for _, g := range groups {
		sort.Slice(g.Hosts, func(i, j int) bool { return g.Hosts[i].Key < g.Hosts[j].Key })
		out = append(out, *g)
	}
	// The unclaimed last; then by namespace and InfraEnv.
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Namespace == "") != (out[j].Namespace == "") {
			return out[j].Namespace == ""
		}
		return out[i].Namespace+"/"+out[i].InfraEnv < out[j].Namespace+"/"+out[j].InfraEnv
	})
	return out
}

func seen(t *v1alpha1.BootTrace) time.Time {
	if t.Status.LastSeen != nil {
		return t.Status.LastSeen.Time
	}
	return t.CreationTimestamp.Time
}

func agentRow(a *v1beta1.Agent, bmh *metal3.BareMetalHost) Host {
	h := Host{Key: "agent/" + a.Namespace + "/" + a.Name, Agent: a.Name, Hostname: a.Hostname(), State: poolmetrics.State(a),
		AgentState: a.Status.DebugInfo.State, Approved: a.Spec.Approved}
	if cd := a.Spec.ClusterDeploymentName; cd != nil {
		h.Cluster = cd.Namespace + "/" + cd.Name
	}
	inv := a.Status.Inventory
	for _, i := range inv.Interfaces {
		if m := strings.ToLower(i.MacAddress); m != "" && !slices.Contains(h.MACs, m) {
			h.MACs = append(h.MACs, m)
		}
	}
	if inv.ReportTime != nil {
		var disk int64
		for _, d := range inv.Disks {
			disk += d.SizeBytes
		}
		h.Inventory = fmt.Sprintf("%d CPUs, %s RAM, %d disks (%s), %d NICs", inv.CPU.Count, size(inv.Memory.PhysicalBytes), len(inv.Disks), size(disk), len(inv.Interfaces))
		if v := inv.SystemVendor; v.Manufacturer != "" || v.ProductName != "" {
			h.Inventory += ", " + strings.TrimSpace(v.Manufacturer+" "+v.ProductName)
		}
	}
	for _, category := range sortedKeys(a.Status.ValidationsInfo) {
		for _, v := range a.Status.ValidationsInfo[category] {
			if v.Status == v1beta1.ValidationFailure || v.Status == v1beta1.ValidationError {
				h.Failing = append(h.Failing, v.ID+": "+v.Message)
			}
		}
	}
	if p := a.Status.Progress; p.CurrentStage != "" {
		h.Progress = fmt.Sprintf("%s, %d%%", p.CurrentStage, p.InstallationPercentage)
		if p.ProgressInfo != "" {
			h.Progress += ": " + p.ProgressInfo
		}
	}
	if bmh != nil {
		h.BMC = bmcState(bmh)
	}
	if ds := a.Status.DiskSanitization; ds != nil && (ds.State != "" || ds.Required != "") {
		line := "state " + string(ds.State)
		if ds.Required != "" {
			line += ", owes " + ds.Required
		}
		if ds.Level != "" {
			line += ", level " + ds.Level
		}
		if ds.CompletionTime != nil {
			line += ", finished " + ds.CompletionTime.UTC().Format(time.RFC3339)
		}
		if ds.Message != "" {
			line += ": " + ds.Message
		}
		h.Sanitization = append(h.Sanitization, line)
		for _, d := range ds.Disks {
			rec := d.Disk + ": " + d.Method
			if d.Kept {
				rec += " (kept)"
			}
			if d.Bytes > 0 {
				rec += fmt.Sprintf(", %s in %s", size(d.Bytes), d.Duration.Duration)
			}
			if d.Verification != "" {
				rec += ", checked by " + d.Verification
			}
			if d.Error != "" {
				rec += ", error: " + d.Error
			}
			h.Sanitization = append(h.Sanitization, rec)
		}
	}
	return h
}

func bmcState(bmh *metal3.BareMetalHost) string {
	power := "off"
	if bmh.Status.PoweredOn {
		power = "on"
	}
	s := fmt.Sprintf("%s: %s, power %s", bmh.Name, bmh.Status.Provisioning.State, power)
	if st := bmh.Status.OperationalStatus; st != "" {
		s += ", " + string(st)
	}
	if bmh.Status.ErrorMessage != "" {
		s += ": " + bmh.Status.ErrorMessage
	}
	return s
}

func traceView(t *v1alpha1.BootTrace, a *v1beta1.Agent) *Trace {
	if t == nil && a == nil {
		return nil
	}
	d := boottrace.Diagnose(t, a)
	return &Trace{Stopped: d.Stopped, Since: d.Since, Reason: d.Reason, Done: d.Done, Steps: boottrace.Path(t, a)}
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func size(b int64) string {
	const unit = 1 << 10
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	f, u := float64(b), 0
	for f >= unit && u < 5 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %siB", f, string("KMGTP"[u-1]))
}
