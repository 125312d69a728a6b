package client

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// API calls are bounded as a whole; image downloads are not (install ends
// them when they stall), but they go through the same CAs and proxy.
func TestDownloadsHaveNoOverallTimeout(t *testing.T) {
	c, err := New(agentwire.Config{APIURL: "https://agentboot.example:8090"})
	require.NoError(t, err)
	require.NotZero(t, c.http.Timeout, "API calls have a deadline")
	d := c.HTTP()
	require.Zero(t, d.Timeout, "a disk image download of several GiB must not be cut by a deadline")
	require.Same(t, c.http.Transport, d.Transport)
	require.NotZero(t, d.Transport.(*http.Transport).ResponseHeaderTimeout, "a server that never answers is still given up on")
}
