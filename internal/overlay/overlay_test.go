package overlay

import (
	"bytes"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPatchesAndConcat(t *testing.T) {
	base := []byte(strings.Repeat("abcdefghij", 10))
	s, err := New(bytes.NewReader(base), int64(len(base)),
		Patch{Offset: 90, Data: []byte("XYZ")},
		Patch{Offset: 0, Data: []byte("12")},
		Patch{Offset: 50, Data: make([]byte, 5)},
	)
	require.NoError(t, err)
	want := append([]byte(nil), base...)
	copy(want[0:], "12")
	copy(want[50:], make([]byte, 5))
	copy(want[90:], "XYZ")
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Every offset and length through ReadAt agrees with the flat bytes.
	r := rand.New(rand.NewSource(1))
	for range 2000 {
		off := r.Int63n(int64(len(want)) + 5)
		n := r.Intn(40)
		buf := make([]byte, n)
		k, err := s.ReadAt(buf, off)
		end := min(off+int64(n), int64(len(want)))
		if off >= int64(len(want)) {
			require.ErrorIs(t, err, io.EOF)
			continue
		}
		require.Equal(t, want[off:end], buf[:k])
		if end-off < int64(n) {
			require.ErrorIs(t, err, io.EOF)
		} else {
			require.NoError(t, err)
		}
	}

	c := Concat(Bytes([]byte("head")), Zeros(3), Part{R: bytes.NewReader([]byte("tail")), Size: 4}, Bytes(nil))
	all, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, []byte("head\x00\x00\x00tail"), all)
	require.Equal(t, int64(11), c.Size())
}

func TestInvalidPatches(t *testing.T) {
	base := bytes.NewReader(make([]byte, 10))
	_, err := New(base, 10, Patch{Offset: 8, Data: []byte("abc")})
	require.ErrorContains(t, err, "ends past the base")
	_, err = New(base, 10, Patch{Offset: 2, Data: []byte("abc")}, Patch{Offset: 4, Data: []byte("x")})
	require.ErrorContains(t, err, "overlaps")
}

func TestShortPartIsAnError(t *testing.T) {
	s := Concat(Part{R: bytes.NewReader([]byte("ab")), Size: 5})
	_, err := io.ReadAll(s)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// Ranges, resumption and conditional requests through http.ServeContent.
func TestServeContentRanges(t *testing.T) {
	base := make([]byte, 1<<20)
	rand.New(rand.NewSource(2)).Read(base)
	patch := []byte("patched region")
	want := append([]byte(nil), base...)
	copy(want[4096:], patch)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := New(bytes.NewReader(base), int64(len(base)), Patch{Offset: 4096, Data: patch})
		require.NoError(t, err)
		w.Header().Set("ETag", `"v1"`)
		http.ServeContent(w, r, "x.iso", time.Unix(0, 0), s)
	}))
	defer srv.Close()

	get := func(h map[string]string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, body
	}
	resp, body := get(map[string]string{"Range": "bytes=4000-4200"})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, want[4000:4201], body)
	resp, body = get(map[string]string{"Range": "bytes=500000-", "If-Range": `"v1"`})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, want[500000:], body)
	resp, body = get(map[string]string{"Range": "bytes=500000-", "If-Range": `"v0"`})
	require.Equal(t, http.StatusOK, resp.StatusCode, "a changed ETag restarts the download")
	require.Equal(t, want, body)
	resp, _ = get(map[string]string{"If-None-Match": `"v1"`})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)
}
