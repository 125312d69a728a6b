package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/clip"
	"github.com/agentboot/agentboot/internal/sanitize"
)

// A host that leaves a cluster owes a sanitization of its disks
// (status.diskSanitization) before it can be bound again. Its states:
//
//	(nothing owed) --Owe--> Pending --Claim--> Sanitizing --Finish--> Done (nothing owed)
//	                           ^                  |    \--Finish with problems--> Failed
//	                           |                  |                                 |
//	                           +------Hold--------+    (the next boot) <--Claim----+
//
// Owe in any state makes it Pending at the stronger of the levels owed.
// Claim hands it to the host's current boot (session); only a report for
// that boot's attempt finishes it. A host asking for instructions while
// shown Sanitizing in its boot is not running it any more (the agent runs
// steps between heartbeats): it is handed again, or held. A Failed attempt
// is not tried again in the same boot.

// ErrNotSanitizing is returned for a report of a sanitization that is not
// running in the host's current boot.
var ErrNotSanitizing = errors.New("no sanitize step is running for this host")

// SanitizationOwed reports whether the host must sanitize its disks before
// it can be bound again: it left a cluster, and the evidence of its erase
// is not in yet. Only the host's own report of a sanitization handed to it
// clears it (docs/security.md).
func SanitizationOwed(a *v1beta1.Agent) bool {
	return a.Status.DiskSanitization != nil && a.Status.DiskSanitization.Required != ""
}

// OweSanitization makes the host owe a sanitization at level (none and ""
// owe nothing) before it can be bound again, and says whether it does. A
// level already owed (an administrator's request, an earlier release) is
// never weakened.
func OweSanitization(st *v1beta1.AgentStatus, level, why string) bool {
	if level == "" || level == string(sanitize.None) {
		return false
	}
	if st.DiskSanitization == nil {
		st.DiskSanitization = &v1beta1.AgentDiskSanitization{}
	}
	ds := st.DiskSanitization
	ds.Required, ds.Reason, ds.State, ds.Message, ds.Session = sanitize.Stronger(ds.Required, level), why, v1beta1.SanitizationPending, "", ""
	ds.StartTime, ds.CompletionTime = nil, nil
	return true
}

// SanitizationRunning reports whether a sanitization was handed to the
// host in its current boot and has not ended.
func SanitizationRunning(a *v1beta1.Agent) bool {
	ds := a.Status.DiskSanitization
	return SanitizationOwed(a) && ds.State == v1beta1.SanitizationRunning && ds.Session == Registration(a).SessionStarted
}

// SanitizationToHand reports whether the host should be handed its
// sanitization in its current boot: it owes one, and no attempt failed in
// this boot.
func SanitizationToHand(a *v1beta1.Agent) bool {
	ds := a.Status.DiskSanitization
	return SanitizationOwed(a) && !(ds.State == v1beta1.SanitizationFailed && ds.Session == Registration(a).SessionStarted)
}

// KeepDisks records the disks never to erase, as the host's BareMetalHost
// lists them, and says whether that changed anything. While a sanitization
// runs in the host's current boot the list it was given stays (its
// evidence is judged against it): ErrSanitizing.
func KeepDisks(a *v1beta1.Agent, keep []string) (bool, error) {
	ds := a.Status.DiskSanitization
	if ds != nil && slices.Equal(ds.Keep, keep) || ds == nil && len(keep) == 0 {
		return false, nil
	}
	if SanitizationRunning(a) {
		return false, ErrSanitizing
	}
	if ds == nil {
		ds = &v1beta1.AgentDiskSanitization{}
		a.Status.DiskSanitization = ds
	}
	ds.Keep = keep
	return true, nil
}

// ErrSanitizing is returned for a change that must wait for the
// sanitization running in the host's current boot.
var ErrSanitizing = errors.New("the host is erasing its disks")

// HoldSanitization records why the sanitization owed cannot be handed
// out now, and says whether that is news. An attempt shown running in this
// boot is over (the host asks for instructions): Pending again.
func HoldSanitization(a *v1beta1.Agent, why string) bool {
	ds := a.Status.DiskSanitization
	if !SanitizationOwed(a) || ds.Message == why && ds.State != v1beta1.SanitizationRunning {
		return false
	}
	ds.Message = why
	if ds.State == v1beta1.SanitizationRunning {
		ds.State, ds.Session = v1beta1.SanitizationPending, ""
	}
	return true
}

// ClaimSanitization hands the sanitization owed to the host's current
// boot: it erases disks (by the names its inventory gives them), sparing
// those in keep. Its report must cover exactly these.
func ClaimSanitization(a *v1beta1.Agent, disks, keep []string, now time.Time) error {
	if !SanitizationToHand(a) {
		return errors.New("no sanitization is owed, or it failed in this boot")
	}
	if len(disks) == 0 {
		return errors.New("a sanitization needs the host's disks")
	}
	ds := a.Status.DiskSanitization
	t := metav1.NewTime(now)
	ds.State, ds.Session, ds.StartTime, ds.CompletionTime = v1beta1.SanitizationRunning, Registration(a).SessionStarted, &t, nil
	ds.Message = fmt.Sprintf("erasing %d disks (%s)", len(disks), strings.Join(disks, ", "))
	ds.Level, ds.Disks = "", nil
	for _, d := range disks {
		ds.Disks = append(ds.Disks, v1beta1.DiskSanitizationRecord{Disk: d, Kept: slices.Contains(keep, d)})
	}
	return nil
}

// MaxSanitizationMessage is the longest status.diskSanitization.message.
const MaxSanitizationMessage = 2048

// SanitizationProgress records what the sanitizing host reports, and says
// whether it changed.
func SanitizationProgress(a *v1beta1.Agent, msg string) (bool, error) {
	if !SanitizationRunning(a) {
		return false, ErrNotSanitizing
	}
	ds := a.Status.DiskSanitization
	msg = clip.Text(msg, MaxSanitizationMessage)
	if ds.Message == msg {
		return false, nil
	}
	ds.Message = msg
	return true, nil
}

// Evidence is the host's report of its sanitization as judged: a record
// per disk handed to it, and what falls short of the level owed.
type Evidence struct {
	Records  []v1beta1.DiskSanitizationRecord
	Problems []string
	// Summary says what was done, for a report without problems.
	Summary string
}

// FinishSanitization ends the attempt running in the host's current boot
// with its evidence: without problems nothing is owed any more (Done, at
// the level that was owed); with any it Failed, to be tried again at the
// host's next boot.
func FinishSanitization(a *v1beta1.Agent, e Evidence, now time.Time) error {
	if !SanitizationRunning(a) {
		return ErrNotSanitizing
	}
	ds := a.Status.DiskSanitization
	t := metav1.NewTime(now)
	ds.CompletionTime, ds.Disks = &t, e.Records
	if len(e.Problems) > 0 {
		ds.State = v1beta1.SanitizationFailed
		ds.Message = clip.Text(strings.Join(e.Problems, "; ")+". The host tries again the next time it boots the discovery image (power-cycle it; its BareMetalHost's BMC can)", MaxSanitizationMessage)
		return nil
	}
	ds.Required, ds.State, ds.Level = "", v1beta1.SanitizationDone, ds.Required
	ds.Message = clip.Text(e.Summary, MaxSanitizationMessage)
	return nil
}
