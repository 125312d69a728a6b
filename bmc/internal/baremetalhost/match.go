package baremetalhost

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/bmc/internal/address"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"github.com/agentboot/agentboot/internal/macindex"
	"github.com/agentboot/agentboot/internal/poolmetrics"
)

// matchAgent finds the Agent that registered from the host's boot MAC,
// labels it, and, when the host enrolled it into the Agent's InfraEnv,
// approves it with the host's hostname, role and installation disk. It
// fills the host's hardware summary from the Agent's inventory.
func (r *Reconciler) matchAgent(ctx context.Context, host *metal3.BareMetalHost) (*v1beta1.Agent, error) {
	mac := strings.ToLower(host.Spec.BootMACAddress)
	if mac == "" {
		return nil, nil
	}
	var agents v1beta1.AgentList
	if err := r.Client.List(ctx, &agents, client.InNamespace(host.Namespace), client.MatchingFields{macindex.AgentMAC: mac}); err != nil {
		return nil, err
	}
	if len(agents.Items) > 1 {
		// Anyone can report a MAC; only this host's BMC's boot proof
		// tells which of them booted the ISO it inserted.
		var proven []v1beta1.Agent
		for _, a := range agents.Items {
			if lifecycle.Registration(&a).BootedBy == string(host.UID) {
				proven = append(proven, a)
			}
		}
		if len(proven) != 1 {
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "AmbiguousAgent", "MatchAgent",
				"%d Agents report boot MAC %s and %d carry this host's boot proof; none is matched until only one does", len(agents.Items), mac, len(proven))
			return nil, nil
		}
		agents.Items = proven
	}
	if len(agents.Items) != 1 {
		return nil, nil
	}
	agent := &agents.Items[0]
	r.countBootToRegistered(host, agent)
	if err := r.unlabelOthers(ctx, host, agent.Name); err != nil {
		return nil, err
	}
	want := agent.DeepCopy()
	if want.Labels == nil {
		want.Labels = map[string]string{}
	}
	want.Labels[v1beta1.BMHLabel] = host.Name
	// The InfraEnv the Agent's host registered through, from its record:
	// the Agent's label is tenant-writable.
	enrolled := host.Labels[v1beta1.InfraEnvNameLabel] != "" && host.Labels[v1beta1.InfraEnvNameLabel] == lifecycle.Registration(agent).InfraEnv
	if enrolled && !agent.Spec.Approved {
		if err := bootEvidence(host, agent); err != nil {
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "AgentNotApproved", "MatchAgent", "Agent %s reports boot MAC %s but is not approved: %v", agent.Name, mac, err)
		} else if err := r.approve(host, want); err != nil {
			r.Events.Eventf(host, nil, corev1.EventTypeWarning, "AgentNotApproved", "MatchAgent", "Agent %s: %v", agent.Name, err)
		}
	}
	if !equalAgent(agent, want) {
		if err := r.Client.Update(ctx, want); err != nil {
			return nil, fmt.Errorf("update Agent %s matched to BareMetalHost %s: %w", agent.Name, host.Name, err)
		}
		if want.Spec.Approved && !agent.Spec.Approved {
			r.Events.Eventf(host, nil, corev1.EventTypeNormal, "AgentApproved", "MatchAgent", "Agent %s registered from %s and was approved", agent.Name, mac)
		}
	}
	if hw := hardware(want); hw != nil {
		host.Status.HardwareDetails = hw
	}
	return want, nil
}

// bootEvidence says why an Agent reporting the host's boot MAC is not known
// to be the host, or nil. A MAC is no evidence: any host on the boot network
// can report any. What the host cannot forge: for virtual media, the proof
// in the ISO this host's BMC inserted (the BMC fetched it, hosts never see
// it); for network boot, only that its session began after the controller
// booted the host into discovery.
func bootEvidence(host *metal3.BareMetalHost, a *v1beta1.Agent) error {
	rec := lifecycle.Registration(a)
	if why := rec.Disputed; why != "" {
		return fmt.Errorf("its identity is disputed: %s", why)
	}
	addr, err := address.Parse(host.Spec.BMC.Address)
	if err != nil {
		return err
	}
	if addr.VirtualMedia {
		if rec.BootedBy != string(host.UID) {
			return fmt.Errorf("its registration carried no proof that it booted the ISO this host's BMC inserted (a host that registered before that boot, or another host claiming the MAC); it is approved when it registers from that ISO, or approve it by hand")
		}
		return nil
	}
	booted, err := time.Parse(time.RFC3339, host.Annotations[DiscoveryBootAnnotation])
	if err != nil {
		return fmt.Errorf("the controller has not booted this host into discovery yet")
	}
	started, err := time.Parse(time.RFC3339, rec.SessionStarted)
	if err != nil || started.Before(booted) {
		return fmt.Errorf("it registered (%s) before the controller booted this host into discovery (%s); it is approved when it registers after such a boot, or approve it by hand", rec.SessionStarted, booted.Format(time.RFC3339))
	}
	return nil
}

// countBootToRegistered counts, once per registration session, how long
// the host took from the controller's boot into discovery to the session
// that boot led to (one with the boot's evidence).
func (r *Reconciler) countBootToRegistered(host *metal3.BareMetalHost, a *v1beta1.Agent) {
	rec := lifecycle.Registration(a)
	mem := r.memoryOf(host)
	if rec.SessionStarted == "" || mem.counted == rec.SessionStarted || bootEvidence(host, a) != nil {
		return
	}
	booted, err := time.Parse(time.RFC3339, host.Annotations[DiscoveryBootAnnotation])
	if err != nil {
		return // booted by someone else (a person, its own firmware)
	}
	started, err := time.Parse(time.RFC3339, rec.SessionStarted)
	if err != nil {
		return
	}
	mem.counted = rec.SessionStarted
	poolmetrics.ObservePhase(poolmetrics.PhaseBootToRegistered, booted, started)
}

// unlabelOthers takes the host's label off Agents it matched before but
// not now (one that reported its MAC first, before the one with its boot
// proof registered).
func (r *Reconciler) unlabelOthers(ctx context.Context, host *metal3.BareMetalHost, keep string) error {
	var labelled v1beta1.AgentList
	if err := r.Client.List(ctx, &labelled, client.InNamespace(host.Namespace), client.MatchingLabels{v1beta1.BMHLabel: host.Name}); err != nil {
		return err
	}
	for i := range labelled.Items {
		a := &labelled.Items[i]
		if a.Name == keep {
			continue
		}
		patch := client.MergeFrom(a.DeepCopy())
		delete(a.Labels, v1beta1.BMHLabel)
		if err := r.Client.Patch(ctx, a, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("unlabel Agent %s, no longer BareMetalHost %s's: %w", a.Name, host.Name, err)
		}
	}
	return nil
}

func equalAgent(a, b *v1beta1.Agent) bool {
	return a.Labels[v1beta1.BMHLabel] == b.Labels[v1beta1.BMHLabel] && a.Spec.Approved == b.Spec.Approved &&
		a.Spec.Hostname == b.Spec.Hostname && a.Spec.Role == b.Spec.Role && a.Spec.InstallationDiskID == b.Spec.InstallationDiskID
}

// approve copies the host's hostname, role and root device hints onto the
// Agent and approves it. With hints it waits for an inventory, and a host
// whose hints match no disk stays unapproved: installing to a disk the
// administrator did not choose would be worse.
func (r *Reconciler) approve(host *metal3.BareMetalHost, a *v1beta1.Agent) error {
	if hints := host.Spec.RootDeviceHints; hints != nil && *hints != (metal3.RootDeviceHints{}) {
		if len(a.Status.Inventory.Disks) == 0 {
			return fmt.Errorf("waiting for the inventory to choose a disk by rootDeviceHints")
		}
		id := chooseDisk(a.Status.Inventory.Disks, hints)
		if id == "" {
			return fmt.Errorf("no eligible disk matches rootDeviceHints %s", describeHints(hints))
		}
		a.Spec.InstallationDiskID = id
	}
	if name := host.Annotations[metal3.HostnameAnnotation]; name != "" {
		a.Spec.Hostname = name
	}
	switch role := v1beta1.AgentRole(host.Annotations[metal3.RoleAnnotation]); role {
	case "":
	case v1beta1.AgentRoleMaster, v1beta1.AgentRoleWorker, v1beta1.AgentRoleAutoAssign:
		a.Spec.Role = role
	default:
		r.Events.Eventf(host, nil, corev1.EventTypeWarning, "InvalidRole", "MatchAgent",
			"annotation %s=%q is not master, worker or auto-assign; the role is left alone", metal3.RoleAnnotation, role)
	}
	a.Spec.Approved = true
	return nil
}

// chooseDisk returns the id of the first eligible disk matching every hint.
func chooseDisk(disks []v1beta1.HostDisk, h *metal3.RootDeviceHints) string {
	for _, d := range disks {
		if d.InstallationEligibility.Eligible && diskMatches(d, h) {
			return d.ID
		}
	}
	return ""
}

func diskMatches(d v1beta1.HostDisk, h *metal3.RootDeviceHints) bool {
	if h.DeviceName != "" && h.DeviceName != d.Path && h.DeviceName != d.ByPath && h.DeviceName != d.ByID && h.DeviceName != "/dev/"+d.Name {
		return false
	}
	if h.HCTL != "" && h.HCTL != d.Hctl {
		return false
	}
	if h.Model != "" && !strings.Contains(d.Model, h.Model) {
		return false
	}
	if h.Vendor != "" && !strings.Contains(d.Vendor, h.Vendor) {
		return false
	}
	if h.SerialNumber != "" && h.SerialNumber != d.Serial {
		return false
	}
	if h.MinSizeGigabytes > 0 && d.SizeBytes < int64(h.MinSizeGigabytes)*1_000_000_000 {
		return false
	}
	for _, w := range []string{h.WWN, h.WWNWithExtension, h.WWNVendorExtension} {
		if w != "" && w != d.Wwn {
			return false
		}
	}
	if h.Rotational != nil && *h.Rotational != (d.DriveType == "HDD") {
		return false
	}
	return true
}

func describeHints(h *metal3.RootDeviceHints) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("deviceName", h.DeviceName)
	add("hctl", h.HCTL)
	add("model", h.Model)
	add("vendor", h.Vendor)
	add("serialNumber", h.SerialNumber)
	if h.MinSizeGigabytes > 0 {
		add("minSizeGigabytes", fmt.Sprint(h.MinSizeGigabytes))
	}
	add("wwn", h.WWN)
	add("wwnWithExtension", h.WWNWithExtension)
	add("wwnVendorExtension", h.WWNVendorExtension)
	if h.Rotational != nil {
		add("rotational", fmt.Sprint(*h.Rotational))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// hardware summarises an Agent's inventory as metal3 does for a host.
func hardware(a *v1beta1.Agent) *metal3.HardwareDetails {
	inv := a.Status.Inventory
	if inv.ReportTime == nil && len(inv.Interfaces) == 0 {
		return nil
	}
	hw := &metal3.HardwareDetails{
		SystemVendor: metal3.HardwareSystemVendor{Manufacturer: inv.SystemVendor.Manufacturer, ProductName: inv.SystemVendor.ProductName, SerialNumber: inv.SystemVendor.SerialNumber},
		RAMMebibytes: int(inv.Memory.PhysicalBytes >> 20),
		CPU:          metal3.CPU{Arch: inv.CPU.Architecture, Model: inv.CPU.ModelName, ClockMegahertz: inv.CPU.ClockMegahertz, Count: int(inv.CPU.Count)},
		Hostname:     inv.Hostname,
	}
	for _, i := range inv.Interfaces {
		n := metal3.NIC{Name: i.Name, Model: strings.TrimSpace(i.Vendor + " " + i.Product), MAC: i.MacAddress, SpeedGbps: int(i.SpeedMbps / 1000)}
		if len(i.IPV4Addresses) > 0 {
			n.IP = strings.SplitN(i.IPV4Addresses[0], "/", 2)[0]
		} else if len(i.IPV6Addresses) > 0 {
			n.IP = strings.SplitN(i.IPV6Addresses[0], "/", 2)[0]
		}
		n.PXE = i.Name != "" && i.Name == inv.Boot.PxeInterface
		hw.NIC = append(hw.NIC, n)
	}
	for _, d := range inv.Disks {
		hw.Storage = append(hw.Storage, metal3.Storage{Name: d.Path, Rotational: d.DriveType == "HDD", SizeBytes: d.SizeBytes,
			Vendor: d.Vendor, Model: d.Model, SerialNumber: d.Serial, WWN: d.Wwn, HCTL: d.Hctl})
	}
	return hw
}
