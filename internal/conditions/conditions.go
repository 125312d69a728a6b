// Package conditions computes agent-install.openshift.io conditions (the
// shape with a heartbeat time) from what a reconciler observed, keeping
// transition times when nothing changed so that status is only written when
// it differs.
package conditions

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

// Find returns the condition of type t, or nil.
func Find(conds []v1beta1.Condition, t v1beta1.ConditionType) *v1beta1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// IsTrue reports whether condition t is True.
func IsTrue(conds []v1beta1.Condition, t v1beta1.ConditionType) bool {
	c := Find(conds, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// Set puts c into conds. The times change only when something else does:
// LastTransitionTime when the status changes, LastHeartbeatTime when the
// status, reason or message changes.
func Set(conds []v1beta1.Condition, c v1beta1.Condition, now metav1.Time) []v1beta1.Condition {
	old := Find(conds, c.Type)
	if old == nil {
		c.LastTransitionTime, c.LastHeartbeatTime = now, now
		return append(conds, c)
	}
	if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
		return conds
	}
	if old.Status != c.Status {
		old.LastTransitionTime = now
	}
	old.Status, old.Reason, old.Message, old.LastHeartbeatTime = c.Status, c.Reason, c.Message, now
	return conds
}

// New builds a condition.
func New(t v1beta1.ConditionType, ok bool, reason, message string) v1beta1.Condition {
	s := corev1.ConditionFalse
	if ok {
		s = corev1.ConditionTrue
	}
	return v1beta1.Condition{Type: t, Status: s, Reason: reason, Message: message}
}
