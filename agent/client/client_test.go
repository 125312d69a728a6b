package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

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

// An answer with Retry-After (a 429, a 503, a 409 HostActive) is retried
// when the service said, with up to a second of jitter, and leaves the
// backoff where it was; any other failure waits the backoff. Retry-After that is no number of seconds, or
// absurdly long, is not followed blindly.
func TestRetryAfterIsFollowed(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", r.URL.Query().Get("after"))
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"code":"Busy","message":"busy"}`))
	}))
	defer srv.Close()
	c := &Client{base: srv.URL, http: srv.Client()}
	call := func(code int, after string) error {
		return c.do(context.Background(), http.MethodPost, "/?code="+strconv.Itoa(code)+"&after="+url.QueryEscape(after), "t", nil, nil)
	}
	b := &Backoff{Min: time.Minute, Max: time.Hour}
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusConflict} {
		err := call(code, "7")
		require.True(t, IsCode(err, "Busy"))
		for range 20 {
			d := b.After(err)
			require.GreaterOrEqual(t, d, 7*time.Second)
			require.Less(t, d, 8*time.Second)
		}
	}
	require.LessOrEqual(t, b.Next(), time.Minute, "turns given by the service leave the backoff at its start")
	b.Reset()
	for _, tc := range []struct {
		code  int
		after string
		want  time.Duration // 0: the backoff
	}{
		{http.StatusInternalServerError, "", 0},
		{http.StatusInternalServerError, "7", 7 * time.Second},
		{http.StatusTooManyRequests, "", 0},
		{http.StatusTooManyRequests, "Fri, 31 Dec 1999 23:59:59 GMT", 0},
		{http.StatusTooManyRequests, "-3", 0},
		{http.StatusTooManyRequests, "86400", maxRetryAfter},
		{http.StatusTooManyRequests, "9223372036854775807", maxRetryAfter},
	} {
		err := call(tc.code, tc.after)
		d := b.After(err)
		b.Reset()
		if tc.want == 0 {
			require.GreaterOrEqual(t, d, 30*time.Second, "%d %q: the backoff", tc.code, tc.after)
			require.LessOrEqual(t, d, time.Minute, "%d %q: the backoff", tc.code, tc.after)
			continue
		}
		require.GreaterOrEqual(t, d, tc.want, "%d %q", tc.code, tc.after)
		require.Less(t, d, tc.want+time.Second, "%d %q", tc.code, tc.after)
	}
}
