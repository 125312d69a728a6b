package server

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The per-client limit counts the client behind a trusted proxy by the
// proxy's X-Forwarded-For, and anyone else by the connection: a client
// connecting directly cannot choose its address with the header.
func TestClientAddr(t *testing.T) {
	h := &Handler{opts: Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::1/128")}}}
	for name, c := range map[string]struct {
		remote string
		xff    []string
		want   string
	}{
		"direct, no header":                 {"192.0.2.7:4000", nil, "192.0.2.7"},
		"direct, a header is ignored":       {"192.0.2.7:4000", []string{"198.51.100.1"}, "192.0.2.7"},
		"through the proxy":                 {"10.0.0.5:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		"two proxies of ours":               {"10.0.0.5:4000", []string{"198.51.100.1, 10.0.0.9"}, "198.51.100.1"},
		"a client's own entries come first": {"10.0.0.5:4000", []string{"1.2.3.4, 198.51.100.1"}, "198.51.100.1"},
		"several header lines":              {"10.0.0.5:4000", []string{"1.2.3.4", "198.51.100.1"}, "198.51.100.1"},
		"the proxy without a header":        {"10.0.0.5:4000", nil, "10.0.0.5"},
		"a malformed header":                {"10.0.0.5:4000", []string{"not-an-address"}, "10.0.0.5"},
		"IPv6 proxy":                        {"[fd00::1]:4000", []string{"2001:db8::5"}, "2001:db8::5"},
		"IPv4 in IPv6 form":                 {"10.0.0.5:4000", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		"with the client's port":            {"10.0.0.5:4000", []string{"198.51.100.1:5678"}, "198.51.100.1"},
		"IPv6 with the client's port":       {"10.0.0.5:4000", []string{"[2001:db8::5]:5678"}, "2001:db8::5"},
	} {
		r := &http.Request{RemoteAddr: c.remote, Header: http.Header{}}
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		require.Equal(t, c.want, h.clientAddr(r), name)
	}
	none := &Handler{}
	r := &http.Request{RemoteAddr: "10.0.0.5:4000", Header: http.Header{"X-Forwarded-For": {"198.51.100.1"}}}
	require.Equal(t, "10.0.0.5", none.clientAddr(r), "no trusted proxies: the header is never read")
}

// The floor a download must keep to keep its slot rises with its age.
func TestFloorChunk(t *testing.T) {
	for elapsed, want := range map[time.Duration]int64{
		0:                4 << 20,
		9 * time.Minute:  4 << 20,
		10 * time.Minute: 8 << 20,
		25 * time.Minute: 16 << 20,
		5 * time.Hour:    16 << 20,
		-time.Minute:     4 << 20,
	} {
		require.Equal(t, want, floorChunk(elapsed), elapsed.String())
	}
}
