package discovery

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Text from objects echoed by a boot script cannot leave its word or line.
func TestScriptText(t *testing.T) {
	in := "a'b\\c${x}\"d\ne\x00é"
	require.Equal(t, "a_b_c${x}\"d e  ", GRUBText(in), "inside single quotes GRUB expands nothing")
	require.Equal(t, "a_b_c__x__d e  ", IPXEText(in), "iPXE expands ${...} anywhere")
	require.Equal(t, "a _ b _ c __ d __ e", IPXEText("a ; b # c || d && e"), "nor do separators, comments or conditionals pass into an iPXE echo")
	require.Equal(t, strings.Repeat("x", 300)+"...", GRUBText(strings.Repeat("x", 1000)))
}
