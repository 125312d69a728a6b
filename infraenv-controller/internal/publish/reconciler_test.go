package publish

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// An image's notes are spelled out up to maxNotes: one per NMStateConfig
// could be hundreds.
func TestCreatedMessage(t *testing.T) {
	require.Equal(t, "Image has been created", createdMessage(nil))
	require.Equal(t, "Image has been created; a; b", createdMessage([]string{"a", "b"}))
	var many []string
	for i := range 200 {
		many = append(many, fmt.Sprintf("NMStateConfig host-%d applies after boot only", i))
	}
	require.Equal(t, "Image has been created; NMStateConfig host-0 applies after boot only; NMStateConfig host-1 applies after boot only; "+
		"NMStateConfig host-2 applies after boot only; and 197 more like them", createdMessage(many))
}
