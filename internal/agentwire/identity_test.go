package agentwire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The forms every component checks identifiers against.
func TestForms(t *testing.T) {
	for s, want := range map[string]bool{
		"d9a4d1e0-0000-4000-8000-000000000001":   true,
		"00000000-0000-0000-0000-000000000000":   true, // a form; ValidUUID says it is no machine's
		"D9A4D1E0-0000-4000-8000-000000000001":   false,
		"d9a4d1e0000040008000000000000001":       false,
		"d9a4d1e0-0000-4000-8000-00000000001":    false,
		"d9a4d1e0-0000-4000-8000-000000000001\n": false,
	} {
		require.Equal(t, want, UUIDForm.MatchString(s), s)
	}
	require.False(t, ValidUUID("00000000-0000-0000-0000-000000000000"))
	for s, want := range map[string]bool{
		"52:54:00:12:34:56":   true,
		"52:54:00:12:34:5G":   false,
		"52:54:00:12:34:5A":   false, // lowercase what a client sends first
		"52-54-00-12-34-56":   false,
		"52:54:00:12:34:56:7": false,
		"52:54:00:12:34":      false,
	} {
		require.Equal(t, want, MACForm.MatchString(s), s)
	}
}
