// Package eventnote keeps events with different notes apart. The events
// API (events.k8s.io, client-go's tools/events) folds events with the same
// regarding object, reason and action into one series and keeps the first
// note: a later, different explanation ("3 more Agents wanted" after "2
// more"; a BMC error after another) would never be seen. Recorder names
// the note in the action, so each distinct note is an event of its own and
// only repeats of the same note count up a series. Every component's
// recorder is wrapped in it.
package eventnote

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// Action is verb followed by a short digest of note, still UpperCamelCase.
func Action(verb, note string) string {
	sum := sha256.Sum256([]byte(note))
	return verb + strings.ToUpper(hex.EncodeToString(sum[:4]))
}

// Recorder wraps r so that every event's action names its note.
func Recorder(r events.EventRecorder) events.EventRecorder { return recorder{r} }

type recorder struct{ r events.EventRecorder }

func (w recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	msg := fmt.Sprintf(note, args...)
	w.r.Eventf(regarding, related, eventtype, reason, Action(action, msg), "%s", msg)
}
