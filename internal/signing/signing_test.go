package signing

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTokens(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	tok := k.Token(PurposeImage, "uid-1", "v1")
	require.True(t, k.Verify(tok, PurposeImage, "uid-1", "v1"))
	for name, check := range map[string]bool{
		"other uid (recreated object)": k.Verify(tok, PurposeImage, "uid-2", "v1"),
		"other version (stale)":        k.Verify(tok, PurposeImage, "uid-1", "v2"),
		"other purpose":                k.Verify(tok, PurposeRegister, "uid-1", "v1"),
		"tampered":                     k.Verify(tok[:len(tok)-1]+"A", PurposeImage, "uid-1", "v1"),
		"empty":                        k.Verify("", PurposeImage, "uid-1", "v1"),
	} {
		require.False(t, check, name)
	}
	other, _ := NewKey([]byte("fedcba9876543210fedcba9876543210"))
	require.False(t, other.Verify(tok, PurposeImage, "uid-1", "v1"), "another key")
	// Separators keep fields apart: ("ab","c") differs from ("a","bc").
	require.NotEqual(t, k.Token("p", "ab", "c"), k.Token("p", "a", "bc"))
	_, err = NewKey([]byte("short"))
	require.Error(t, err)
	require.False(t, Key{}.Verify(tok, PurposeImage, "uid-1", "v1"))
}
