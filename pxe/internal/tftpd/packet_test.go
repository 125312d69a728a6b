package tftpd

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseRequest(t *testing.T) {
	for name, tc := range map[string]struct {
		packet string
		want   request
		err    string
	}{
		"plain read": {packet: "\x00\x01undionly.kpxe\x00octet\x00",
			want: request{filename: "undionly.kpxe", mode: "octet"}},
		"write, mode in capitals": {packet: "\x00\x02up.bin\x00NETASCII\x00",
			want: request{write: true, filename: "up.bin", mode: "netascii"}},
		"options, names in any case": {packet: "\x00\x01ipxe.efi\x00octet\x00BlkSize\x001468\x00tsize\x000\x00windowsize\x004\x00",
			want: request{filename: "ipxe.efi", mode: "octet", options: []option{{"blksize", "1468"}, {"tsize", "0"}, {"windowsize", "4"}}}},
		"padding between and after options": {packet: "\x00\x01ipxe.efi\x00octet\x00\x00\x00blksize\x001468\x00\x00\x00",
			want: request{filename: "ipxe.efi", mode: "octet", options: []option{{"blksize", "1468"}}}},
		"one padding byte before an option": {packet: "\x00\x01f\x00octet\x00\x00blksize\x001468\x00",
			want: request{filename: "f", mode: "octet", options: []option{{"blksize", "1468"}}}},
		"a repeated option keeps its first value": {packet: "\x00\x01f\x00octet\x00blksize\x00512\x00blksize\x009000\x00",
			want: request{filename: "f", mode: "octet", options: []option{{"blksize", "512"}}}},
		"an option name without value is ignored": {packet: "\x00\x01f\x00octet\x00tsize\x00",
			want: request{filename: "f", mode: "octet"}},
		"empty file name parses (and is not found later)": {packet: "\x00\x01\x00octet\x00",
			want: request{filename: "", mode: "octet"}},
		"too short":          {packet: "\x00", err: "1 bytes"},
		"not a request":      {packet: "\x00\x04\x00\x01", err: "opcode 4"},
		"unknown opcode":     {packet: "\x12\x34abc\x00octet\x00", err: "opcode 4660"},
		"no mode":            {packet: "\x00\x01file\x00", err: "must each end with a NUL"},
		"empty mode":         {packet: "\x00\x01file\x00\x00", err: "no transfer mode"},
		"no final NUL":       {packet: "\x00\x01file\x00octet", err: "must each end with a NUL"},
		"nothing after code": {packet: "\x00\x01", err: "must each end with a NUL"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseRequest([]byte(tc.packet))
			if tc.err != "" {
				require.ErrorIs(t, err, errMalformed)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestNegotiate(t *testing.T) {
	opts := func(kv ...string) request {
		r := request{filename: "f", mode: "octet"}
		for i := 0; i < len(kv); i += 2 {
			r.options = append(r.options, option{kv[i], kv[i+1]})
		}
		return r
	}
	for name, tc := range map[string]struct {
		req  request
		want negotiated
		oack string
	}{
		"no options":                   {req: opts(), want: negotiated{blksize: 512, windowsize: 1}},
		"blksize under the cap":        {req: opts("blksize", "1024"), want: negotiated{blksize: 1024, windowsize: 1}, oack: "blksize\x001024\x00"},
		"blksize capped":               {req: opts("blksize", "65464"), want: negotiated{blksize: 1468, windowsize: 1}, oack: "blksize\x001468\x00"},
		"blksize below 8 is ignored":   {req: opts("blksize", "7"), want: negotiated{blksize: 512, windowsize: 1}},
		"blksize above range ignored":  {req: opts("blksize", "65465"), want: negotiated{blksize: 512, windowsize: 1}},
		"blksize not a number":         {req: opts("blksize", "1e3"), want: negotiated{blksize: 512, windowsize: 1}},
		"small blksize acknowledged":   {req: opts("blksize", "8"), want: negotiated{blksize: 8, windowsize: 1}, oack: "blksize\x008\x00"},
		"tsize":                        {req: opts("tsize", "0"), want: negotiated{blksize: 512, windowsize: 1, tsize: true}, oack: "tsize\x0074213\x00"},
		"tsize with a size is ignored": {req: opts("tsize", "5"), want: negotiated{blksize: 512, windowsize: 1}},
		"windowsize capped":            {req: opts("windowsize", "1000"), want: negotiated{blksize: 512, windowsize: 64}, oack: "windowsize\x0064\x00"},
		"windowsize 0 is ignored":      {req: opts("windowsize", "0"), want: negotiated{blksize: 512, windowsize: 1}},
		"timeout":                      {req: opts("timeout", "3"), want: negotiated{blksize: 512, windowsize: 1, timeoutSeconds: 3}, oack: "timeout\x003\x00"},
		"timeout out of range":         {req: opts("timeout", "256"), want: negotiated{blksize: 512, windowsize: 1}},
		"unknown options are left out": {req: opts("multicast", "", "rollover", "0"), want: negotiated{blksize: 512, windowsize: 1}},
		"acknowledged in request order": {req: opts("tsize", "0", "windowsize", "8", "blksize", "1468"),
			want: negotiated{blksize: 1468, windowsize: 8, tsize: true}, oack: "tsize\x0074213\x00windowsize\x008\x00blksize\x001468\x00"},
	} {
		t.Run(name, func(t *testing.T) {
			n := negotiate(tc.req, 1468, maxWindow)
			require.Equal(t, tc.want, n)
			got := appendOACK(nil, tc.req, n, 74213)
			if tc.oack == "" {
				require.Empty(t, got, "nothing accepted: no OACK")
				return
			}
			require.Equal(t, "\x00\x06"+tc.oack, string(got))
		})
	}
}

func TestAppendError(t *testing.T) {
	require.Equal(t, "\x00\x05\x00\x01file not found\x00", string(appendError(nil, errNotFound, "file not found")))
}

func TestClientAddress(t *testing.T) {
	for addr, want := range map[string]bool{
		"198.18.0.7:2070": true, "127.0.0.1:40000": true, "10.1.2.3:1": true,
		"198.18.0.7:0": false, "0.0.0.0:2070": false, "255.255.255.255:2070": false, "224.0.0.1:2070": false,
		"169.254.1.1:2070": false, // link-local: no DHCP answer yet, no TFTP either
	} {
		require.Equal(t, want, clientAddress(netip.MustParseAddrPort(addr)), addr)
	}
}

func TestToNetascii(t *testing.T) {
	require.Equal(t, "a\r\nb\r\x00c\r\n\r\n", string(toNetascii([]byte("a\nb\rc\n\n"))))
	require.Empty(t, toNetascii(nil))
}

// FuzzParseRequest feeds arbitrary datagrams to the request parser: it
// never panics, and what it accepts is a request it can describe.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range seeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := parseRequest(p)
		if err != nil {
			return
		}
		if strings.Contains(r.filename, "\x00") || strings.Contains(r.mode, "\x00") || r.mode == "" {
			t.Fatalf("parsed %q into %+v", p, r)
		}
		n := negotiate(r, 1468, maxWindow)
		if n.blksize < 8 || n.blksize > 1468 || n.windowsize < 1 || n.windowsize > maxWindow {
			t.Fatalf("negotiated %+v from %q", n, p)
		}
		if o := appendOACK(nil, r, n, 1<<20); len(o) > 0 && !bytes.HasPrefix(o, []byte{0, opOACK}) {
			t.Fatalf("OACK %q", o)
		}
	})
}

// seeds are the request packets in testdata/requests, shared by the fuzz
// tests.
func seeds(tb testing.TB) [][]byte {
	paths, err := filepath.Glob("testdata/requests/*.bin")
	require.NoError(tb, err)
	require.NotEmpty(tb, paths, "seed requests in testdata/requests")
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(tb, err)
		out = append(out, b)
	}
	return out
}
