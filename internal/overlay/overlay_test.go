package overlay

import (
	"bytes"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPatchesAndConcat(t *testing.T) {
	base := []byte(strings.Repeat("abcdefghij", 10))
	s, err := New(Bytes(base),
		BytesAt(90, []byte("XYZ")),
		BytesAt(0, []byte("12")),
		ZerosAt(50, 5),
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
	base := Bytes(make([]byte, 10))
	_, err := New(base, BytesAt(8, []byte("abc")))
	require.ErrorContains(t, err, "ends past the base")
	_, err = New(base, BytesAt(2, []byte("abc")), BytesAt(4, []byte("x")))
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
		s, err := New(Bytes(base), BytesAt(4096, patch))
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

// recordingWriter is an io.ReaderFrom, like an HTTP response on TCP.
type recordingWriter struct {
	bytes.Buffer
	fromFile int
}

func (r *recordingWriter) ReadFrom(src io.Reader) (int64, error) {
	if lr, ok := src.(*io.LimitedReader); ok {
		if _, isFile := lr.R.(*os.File); isFile {
			r.fromFile++
		}
	}
	return io.Copy(&r.Buffer, src)
}

func TestWriteRangeSendsFileParts(t *testing.T) {
	base := make([]byte, 1<<20)
	rand.New(rand.NewSource(3)).Read(base)
	path := filepath.Join(t.TempDir(), "base")
	require.NoError(t, os.WriteFile(path, base, 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	s, err := New(FileSection(path, f, 0, int64(len(base))), BytesAt(300000, []byte("patched")), ZerosAt(700000, 5000))
	require.NoError(t, err)
	flat, err := io.ReadAll(s.Clone())
	require.NoError(t, err)
	r := rand.New(rand.NewSource(4))
	for range 50 {
		off := r.Int63n(int64(len(flat)))
		n := r.Int63n(int64(len(flat)) - off)
		var w recordingWriter
		got, err := s.WriteRange(&w, off, n)
		require.NoError(t, err)
		require.Equal(t, n, got)
		require.Equal(t, flat[off:off+n], w.Bytes())
	}
	var w recordingWriter
	_, err = s.WriteRange(&w, 0, int64(len(flat)))
	require.NoError(t, err)
	require.Equal(t, 3, w.fromFile, "the three unpatched stretches of the file go through ReadFrom")
	var plain bytes.Buffer
	_, err = s.WriteRange(&plain, 0, int64(len(flat)))
	require.NoError(t, err)
	require.Equal(t, flat, plain.Bytes())
	_, err = s.WriteRange(&plain, 10, int64(len(flat)))
	require.Error(t, err)
}
