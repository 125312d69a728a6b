// Package eventnote keeps events with different notes apart. The events
// API (events.k8s.io, client-go's tools/events) folds events with the same
// regarding object, reason and action into one series and keeps the first
// note: a later, different explanation ("3 more Agents wanted" after "2
// more"; a CSR refused for another reason) would never be seen. Action
// names the note, so each distinct note is an event of its own and only
// repeats of the same note count up a series.
package eventnote

import (
	"crypto/sha256"
	"encoding/hex"
)

// Action is verb followed by a short digest of note, for the action field
// of an event whose note varies.
func Action(verb, note string) string {
	sum := sha256.Sum256([]byte(note))
	return verb + "-" + hex.EncodeToString(sum[:4])
}
