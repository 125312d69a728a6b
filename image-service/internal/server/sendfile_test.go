package server

import (
	"bytes"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/overlay"
)

// fileCopies is a response writer that, like an HTTP/1 response on TCP, is
// an io.ReaderFrom, and counts the copies handed to it straight from a file
// (what net/http turns into sendfile).
type fileCopies struct {
	*httptest.ResponseRecorder
	fromFile int
}

func (f *fileCopies) ReadFrom(src io.Reader) (int64, error) {
	if lr, ok := src.(*io.LimitedReader); ok {
		if _, isFile := lr.R.(*os.File); isFile {
			f.fromFile++
		}
	}
	return io.Copy(f.ResponseRecorder, src)
}

// serveStream relies on http.ServeContent handing its ReadFrom the stream
// as an *io.LimitedReader; if a Go release changed that, downloads would
// still be right but every byte would go through user space. This notices.
func TestServeStreamSendsTheBaseImageFromTheFile(t *testing.T) {
	base := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(base)
	path := filepath.Join(t.TempDir(), "base.iso")
	require.NoError(t, os.WriteFile(path, base, 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	patch := []byte("an embedded config")
	stream, err := overlay.New(overlay.FileSection(path, f, 0, int64(len(base))), overlay.BytesAt(600000, patch))
	require.NoError(t, err)
	want := append(append(append([]byte{}, base[:600000]...), patch...), base[600000+len(patch):]...)

	for _, tc := range []struct {
		rng       string
		from, to  int
		fileParts int
	}{
		{"", 0, len(want), 2},
		{"bytes=1000-599999", 1000, 600000, 1},
		{"bytes=500000-", 500000, len(want), 2},
	} {
		r := httptest.NewRequest(http.MethodGet, "/x.iso", nil)
		if tc.rng != "" {
			r.Header.Set("Range", tc.rng)
		}
		w := &fileCopies{ResponseRecorder: httptest.NewRecorder()}
		serveStream(w, r, time.Unix(0, 0), stream.Clone(), time.Minute)
		require.True(t, bytes.Equal(want[tc.from:tc.to], w.Body.Bytes()), "range %q: wrong bytes", tc.rng)
		require.Equal(t, tc.fileParts, w.fromFile, "range %q: the file's parts did not go out through ReadFrom from the file (no sendfile)", tc.rng)
	}
}
