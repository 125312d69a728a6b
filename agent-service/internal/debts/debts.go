// Package debts keeps the disk sanitizations hosts owe by their hardware,
// not by their Agent: a host installed into a cluster leaves a record in
// agentboot's own namespace (which tenants neither read nor write) listing
// marks of everything that identifies the machine — SMBIOS UUID and serial
// number, every MAC address, every fixed disk's serial number and WWN. An
// inventory sharing any one mark with a record is that machine, whatever
// Agent, host ID or namespace it comes back under, and owes the record's
// erase first. Only a completed sanitization at least as strong settles it,
// and for a record that names disks, only one that erased one of them. The
// package reads and writes those records only; it never writes an Agent.
package debts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// Label marks the ConfigMaps that hold debts; the manager caches only
// those, in its own namespace.
const Label = "agentboot.io/erase-debt"

// MarkIndex is the cache index of debts by mark.
const MarkIndex = "agentboot.eraseDebtMark"

// Keys of a debt's ConfigMap.
const (
	keyMarks  = "marks"
	keyLevel  = "level"
	keyReason = "reason"
	keyAgent  = "agent"
	keySince  = "since"
)

// Mark is one identifying fact of a machine, as recorded: its kind and a
// SHA-256 digest of its value. Not keyed: a debt must outlive a change of
// the service's signing key, and the records are in a namespace only
// agentboot and cluster administrators read.
func Mark(kind, value string) string {
	sum := sha256.Sum256([]byte("agentboot.io/hardware\x00" + kind + "\x00" + value))
	return kind + ":" + hex.EncodeToString(sum[:16])
}

// AgentMarks are the marks of an Agent's host: its name when that is its
// SMBIOS UUID, and its inventory's serial number, MAC addresses and disks.
func AgentMarks(a *v1beta1.Agent) []string {
	var marks []string
	if agentwire.ValidUUID(a.Name) {
		marks = append(marks, Mark("uuid", strings.ToLower(a.Name)))
	}
	inv := a.Status.Inventory
	if agentwire.ValidSerial(inv.SystemVendor.SerialNumber) {
		marks = append(marks, Mark("serial", strings.TrimSpace(inv.SystemVendor.SerialNumber)))
	}
	for _, i := range inv.Interfaces {
		marks = appendMAC(marks, i.MacAddress)
	}
	return append(marks, DiskMarks(inv.Disks)...)
}

// DiskMarks are the marks of fixed disks: serial numbers and WWNs (a
// replaced NIC or motherboard does not take the data elsewhere; the disks
// are the data). Optical and removable drives are left out (a BMC's
// virtual CD and an operator's USB stick go from machine to machine), and
// so are placeholder serials.
func DiskMarks(disks []v1beta1.HostDisk) []string {
	var marks []string
	for _, d := range disks {
		reasons := d.InstallationEligibility.NotEligibleReasons
		if d.DriveType == "ODD" || d.DriveType == "FDD" || slices.Contains(reasons, agentwire.DiskOptical) || slices.Contains(reasons, agentwire.DiskRemovable) {
			continue
		}
		// Short values and QEMU's emulated IDE/AHCI serials (QM00001) are
		// placeholders.
		if s := strings.TrimSpace(d.Serial); len(s) >= 4 && !qemuSerial.MatchString(s) {
			marks = append(marks, Mark("disk", s))
		}
		if w := strings.ToLower(strings.TrimSpace(d.Wwn)); len(w) >= 8 {
			marks = append(marks, Mark("disk", w))
		}
	}
	return marks
}

func appendMAC(marks []string, mac string) []string {
	mac = strings.ToLower(strings.TrimSpace(mac))
	if mac == "" || mac == "00:00:00:00:00:00" || mac == "ff:ff:ff:ff:ff:ff" {
		return marks
	}
	return append(marks, Mark("mac", mac))
}

// Debt is an erase a machine owes.
type Debt struct {
	// Name of its record.
	Name string
	// Level to erase at.
	Level string
	// Reason it is owed.
	Reason string
	// Agent (namespace/name) whose installation left it.
	Agent string
	// Since it is owed.
	Since string
	// Matched is the kind of the first mark that matched ("mac", "disk", …).
	Matched string
}

// Store reads and writes the records.
type Store struct {
	// Client reads through the manager's cache (with Index) and writes.
	Client client.Client
	// Namespace is agentboot's own.
	Namespace string
	Now       func() time.Time
}

// Index adds MarkIndex to mgr's cache.
func Index(ctx context.Context, mgr manager.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &corev1.ConfigMap{}, MarkIndex, func(o client.Object) []string {
		cm := o.(*corev1.ConfigMap)
		if cm.Labels[Label] != "true" {
			return nil
		}
		return strings.Fields(cm.Data[keyMarks])
	})
}

// Record notes that a's machine owes an erase at level for why (a host
// handed an installation: from then on its disks may hold a tenant's
// data). A record of the same Agent is replaced; an erase already owed at
// a stronger level is kept.
func (s *Store) Record(ctx context.Context, a *v1beta1.Agent, level, why string) error {
	marks := AgentMarks(a)
	if len(marks) == 0 || level == "" || level == string(sanitize.None) {
		return nil
	}
	name := recordName(a)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: name, Labels: map[string]string{Label: "true"}}}
	err := s.Client.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	switch {
	case apierrors.IsNotFound(err):
		cm.Data = s.data(a, marks, level, why)
		if err := s.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("record the erase owed by Agent %s/%s: %w", a.Namespace, a.Name, err)
		}
		return nil
	case err != nil:
		return err
	}
	before := cm.DeepCopy()
	cm.Data = s.data(a, union(marks, strings.Fields(cm.Data[keyMarks])), sanitize.Stronger(level, cm.Data[keyLevel]), why)
	if err := s.Client.Patch(ctx, cm, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("record the erase owed by Agent %s/%s: %w", a.Namespace, a.Name, err)
	}
	return nil
}

func (s *Store) data(a *v1beta1.Agent, marks []string, level, why string) map[string]string {
	return map[string]string{
		keyMarks:  strings.Join(marks, "\n"),
		keyLevel:  level,
		keyReason: why,
		keyAgent:  a.Namespace + "/" + a.Name,
		keySince:  s.Now().UTC().Format(time.RFC3339),
	}
}

// recordName names the record of an Agent's installation: one per Agent
// object (a recreated Agent is another), stable across its installations.
func recordName(a *v1beta1.Agent) string {
	sum := sha256.Sum256([]byte(a.UID))
	return "erase-debt-" + hex.EncodeToString(sum[:10])
}

// Find returns the strongest debt any of marks names, or nil.
func (s *Store) Find(ctx context.Context, marks []string) (*Debt, error) {
	var found *Debt
	for _, m := range marks {
		var list corev1.ConfigMapList
		if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingFields{MarkIndex: m}); err != nil {
			return nil, fmt.Errorf("look up erase debts: %w", err)
		}
		for _, cm := range list.Items {
			d := &Debt{Name: cm.Name, Level: cm.Data[keyLevel], Reason: cm.Data[keyReason], Agent: cm.Data[keyAgent], Since: cm.Data[keySince], Matched: strings.SplitN(m, ":", 2)[0]}
			if found == nil || sanitize.Stronger(found.Level, d.Level) != found.Level {
				found = d
			}
		}
	}
	return found, nil
}

// Settle deletes the debts a completed sanitization at level pays: those
// that marks (the machine's) or erased (the marks of the disks it erased)
// name, owed at level or weaker, and — where a debt names disks — only if
// one of them was erased: marks a host reports of itself can be another
// machine's (a MAC is seen in DHCP), the disks it erased are its own. A
// debt that names no disk (disks without serial or WWN, as a VM's) is
// settled by any shared mark: the weaker case.
func (s *Store) Settle(ctx context.Context, marks, erased []string, level string) error {
	seen := map[string]bool{}
	for _, m := range union(marks, erased) {
		var list corev1.ConfigMapList
		if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingFields{MarkIndex: m}); err != nil {
			return fmt.Errorf("look up erase debts: %w", err)
		}
		for i := range list.Items {
			cm := &list.Items[i]
			if seen[cm.Name] {
				continue
			}
			seen[cm.Name] = true
			if sanitize.Stronger(cm.Data[keyLevel], level) != level {
				continue // owed at a stronger level than was done
			}
			var disks []string
			for _, dm := range strings.Fields(cm.Data[keyMarks]) {
				if strings.HasPrefix(dm, "disk:") {
					disks = append(disks, dm)
				}
			}
			if len(disks) > 0 && !slices.ContainsFunc(disks, func(dm string) bool { return slices.Contains(erased, dm) }) {
				continue // none of its disks was erased
			}
			if err := s.Client.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("settle erase debt %s: %w", cm.Name, err)
			}
		}
	}
	return nil
}

// qemuSerial is the serial QEMU gives every emulated IDE/AHCI disk.
var qemuSerial = regexp.MustCompile(`^QM\d{5}$`)

func union(a, b []string) []string {
	out := append(append([]string(nil), a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
