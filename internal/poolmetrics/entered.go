package poolmetrics

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/conditions"
	"github.com/agentboot/agentboot/internal/lifecycle"
)

// Entered is when the Agent entered state (its State), read from the
// times its status records for that state, so that it survives a restart
// of the manager: the session's start for discovering, the condition
// that turned for insufficient, unapproved, free, disconnected, bound and
// unbinding, the stage's start for installing, installed and error, the
// sanitization's for quarantined and sanitizing. None of them is earlier
// than the session's start, when the state belongs to the session. Where
// the status records no time, the Agent's creation is used.
func Entered(a *v1beta1.Agent, state string) time.Time {
	cond := func(t v1beta1.ConditionType, status corev1.ConditionStatus) time.Time {
		c := conditions.Find(a.Status.Conditions, t)
		if c == nil || c.Status != status {
			return time.Time{}
		}
		return c.LastTransitionTime.Time
	}
	at := func(t *metav1.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return t.Time
	}
	session, _ := time.Parse(time.RFC3339Nano, lifecycle.Registration(a).SessionStarted)
	var when time.Time
	inSession := true
	switch state {
	case Discovering:
		when = session
	case Insufficient:
		when = cond(v1beta1.ValidatedCondition, corev1.ConditionFalse)
	case Unapproved:
		when = cond(v1beta1.ValidatedCondition, corev1.ConditionTrue)
	case Free:
		when = cond(v1beta1.RequirementsMetCondition, corev1.ConditionTrue)
	case Disconnected:
		when = cond(v1beta1.ConnectedCondition, corev1.ConditionFalse)
	case Bound:
		when, inSession = cond(v1beta1.BoundCondition, corev1.ConditionTrue), false
	case Unbinding:
		when, inSession = cond(v1beta1.BoundCondition, corev1.ConditionFalse), false
	case Installing, Installed, Error:
		when, inSession = at(a.Status.Progress.StageStartTime), false
	case Sanitizing:
		if ds := a.Status.DiskSanitization; ds != nil {
			when = at(ds.StartTime)
		}
	case Quarantined:
		// Owed since the release, or since the last attempt failed.
		when, inSession = cond(v1beta1.BoundCondition, corev1.ConditionFalse), false
		if ds := a.Status.DiskSanitization; ds != nil && ds.State == v1beta1.SanitizationFailed {
			when = latest(when, at(ds.CompletionTime))
		}
	}
	if inSession {
		when = latest(when, session)
	}
	if when.IsZero() {
		return a.CreationTimestamp.Time
	}
	return when
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
