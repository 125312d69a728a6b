package boottrace

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Step is one hop of a host's whole boot path, from its trace or its
// Agent, as people read it.
type Step struct {
	Hop    string
	At     time.Time
	OK     bool
	Source string
	// What was asked, and what the service did.
	Detail, Outcome string
	Count           int64
}

// The hops after the boot path proper, read from the Agent.
const (
	Registered = "registered"
	Inventory  = "inventory"
	Heartbeat  = "heartbeat"
)

// Path is a host's boot path: the trace's hops (nil for none), then its
// Agent's registration, inventory and latest heartbeat (nil for none).
func Path(t *v1alpha1.BootTrace, a *v1beta1.Agent) []Step {
	var out []Step
	if t != nil {
		for _, h := range t.Status.Hops {
			out = append(out, Step{Hop: h.Hop, At: h.Last.Time, OK: h.OK, Source: h.Source, Detail: h.Detail, Outcome: h.Outcome, Count: h.Count})
		}
	}
	if a == nil {
		return out
	}
	rec := lifecycle.Registration(a)
	if started, err := time.Parse(time.RFC3339Nano, rec.SessionStarted); err == nil {
		// To the second, as the rest: a tie goes to the later hop.
		out = append(out, Step{Hop: Registered, At: started.Truncate(time.Second), OK: true, Source: "agent-api",
			Detail: "Agent " + a.Namespace + "/" + a.Name, Outcome: "registered through InfraEnv " + rec.InfraEnv, Count: 1})
	}
	if inv := a.Status.Inventory; inv.ReportTime != nil {
		out = append(out, Step{Hop: Inventory, At: inv.ReportTime.Time, OK: true, Source: "agent-api",
			Outcome: fmt.Sprintf("%d CPUs, %d disks, %d interfaces", inv.CPU.Count, len(inv.Disks), len(inv.Interfaces)), Count: 1})
	}
	if c := conditions.Find(a.Status.Conditions, v1beta1.ConnectedCondition); c != nil {
		at := c.LastHeartbeatTime.Time
		if at.IsZero() {
			at = c.LastTransitionTime.Time
		}
		out = append(out, Step{Hop: Heartbeat, At: at, OK: c.Status == corev1.ConditionTrue, Source: "agent-api", Outcome: c.Message, Count: 1})
	}
	return out
}

// Diagnosis is where a host stopped on its boot path and the likely
// reason.
type Diagnosis struct {
	// Stopped is the last hop reached ("" for none).
	Stopped string
	// Since is when it was reached.
	Since time.Time
	// Reason is the likely reason it went no further, or what it is
	// doing now when nothing is wrong.
	Reason string
	// Done is true when the host reached its agent's heartbeats.
	Done bool
}

// Diagnose reads a host's path: where it stopped, and why that is likely.
// unclaimed says whether nothing claims the MAC (a trace in agentboot's
// namespace).
func Diagnose(t *v1alpha1.BootTrace, a *v1beta1.Agent) Diagnosis {
	path := Path(t, a)
	if len(path) == 0 {
		return Diagnosis{Reason: "agentboot's services never saw this host: check that it powers on and boots from the network on the boot network (or that its BMC inserted the discovery ISO)"}
	}
	// The latest step is where the host is (a host that booted again
	// after it registered is in its new boot).
	last := path[0]
	for _, s := range path[1:] {
		if !s.At.Before(last.At) {
			last = s
		}
	}
	d := Diagnosis{Stopped: last.Hop, Since: last.At}
	if !last.OK {
		d.Reason = last.Outcome
		if d.Reason == "" {
			d.Reason = "the " + last.Hop + " hop failed"
		}
		return d
	}
	switch last.Hop {
	case DHCP:
		d.Reason = "it was offered a boot file (" + last.Detail + ") and never fetched it: TFTP (udp 69) or the boot file's HTTP URL is blocked between the host and the PXE service, or its firmware could not load it"
	case BootFile:
		d.Reason = "it loaded its boot loader and never asked the image service for its boot script: the boot loader cannot reach the image service's HTTP URL (routing, firewall, or a site DHCP server that does not chainload it)"
	case BootScript:
		d.Reason = "it got its boot script and never fetched the kernel: the image service's HTTP URL is unreachable from iPXE, or the host rebooted"
	case Kernel:
		d.Reason = "it fetched the kernel and never the initrd: the download was cut, or the host ran out of memory"
	case Initrd:
		d.Reason = "the kernel and initrd loaded; the live system never fetched its root file system: the host's network did not come up in the initrd (wrong interface, VLAN or static configuration), or it cannot reach the image service"
	case RootFS, ISO:
		d.Reason = "the live system booted and its agent never registered: it cannot reach the agent API, or the registration was refused (the InfraEnv's events say why)"
	case Registered:
		d.Reason = "it registered and never sent its inventory: the agent failed on the host (its journal says why)"
	case Inventory:
		d.Reason = "it sent its inventory; no heartbeat is recorded yet"
	case Heartbeat:
		d.Done = true
		d.Reason = "its agent is connected: " + last.Outcome
	default:
		d.Reason = strings.TrimSpace(last.Outcome)
	}
	return d
}
