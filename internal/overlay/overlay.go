// Package overlay composes byte streams without copying them: a base image
// with small patches laid over it (a customised ISO), or several parts one
// after another (an initrd with an archive appended). The result is an
// io.ReadSeeker and io.ReaderAt, which is what http.ServeContent needs for
// Range requests. Bases are read with ReadAt only, so one open file can serve
// any number of concurrent readers.
package overlay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
)

// Part is one piece of a concatenation.
type Part struct {
	R    io.ReaderAt
	Size int64
	// path and off locate a part that lies in a file, so WriteRange can
	// let the kernel send it (sendfile).
	path string
	off  int64
}

// FileSection makes a Part of size bytes at off in the file at path, read
// through f (an open handle of that file, safe for concurrent ReadAt).
func FileSection(path string, f io.ReaderAt, off, size int64) Part {
	return Part{R: io.NewSectionReader(f, off, size), Size: size, path: path, off: off}
}

// slice returns the part's bytes [from, from+n).
func (p Part) slice(from, n int64) Part {
	q := Part{R: io.NewSectionReader(p.R, from, n), Size: n}
	if p.path != "" {
		q.path, q.off = p.path, p.off+from
	}
	return q
}

// Bytes makes a Part of an in-memory slice.
func Bytes(b []byte) Part { return Part{R: byteReaderAt(b), Size: int64(len(b))} }

// Zeros makes a Part of n zero bytes.
func Zeros(n int64) Part { return Part{R: zeroReaderAt{}, Size: n} }

type byteReaderAt []byte

func (b byteReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("overlay: negative offset")
	}
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

type zeroReaderAt struct{}

func (zeroReaderAt) ReadAt(p []byte, _ int64) (int, error) {
	clear(p)
	return len(p), nil
}

// Patch replaces bytes of a base at Offset with a Part.
type Patch struct {
	Offset int64
	Part   Part
}

// BytesAt makes a Patch of b at off.
func BytesAt(off int64, b []byte) Patch { return Patch{Offset: off, Part: Bytes(b)} }

// ZerosAt makes a Patch of n zero bytes at off.
func ZerosAt(off, n int64) Patch { return Patch{Offset: off, Part: Zeros(n)} }

// Stream is a composed, seekable view. Each reader has its own position;
// share the Stream's parts, not a Stream, between goroutines.
type Stream struct {
	parts  []Part
	starts []int64 // start offset of each part
	size   int64
	pos    int64
}

// Concat lays parts end to end.
func Concat(parts ...Part) *Stream {
	s := &Stream{}
	for _, p := range parts {
		if p.Size <= 0 {
			continue
		}
		s.parts = append(s.parts, p)
		s.starts = append(s.starts, s.size)
		s.size += p.Size
	}
	return s
}

// New lays patches over base. Patches must lie inside the base and must not
// overlap.
func New(base Part, patches ...Patch) (*Stream, error) {
	sorted := append([]Patch(nil), patches...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Offset < sorted[j].Offset })
	var parts []Part
	at := int64(0)
	for _, p := range sorted {
		end := p.Offset + p.Part.Size
		if p.Offset < at {
			return nil, fmt.Errorf("overlay: patch at %d overlaps the previous one", p.Offset)
		}
		if end > base.Size {
			return nil, fmt.Errorf("overlay: patch at %d+%d ends past the base (%d bytes)", p.Offset, p.Part.Size, base.Size)
		}
		parts = append(parts, base.slice(at, p.Offset-at), p.Part)
		at = end
	}
	parts = append(parts, base.slice(at, base.Size-at))
	return Concat(parts...), nil
}

// Size is the total length.
func (s *Stream) Size() int64 { return s.size }

// Clone returns a Stream over the same parts with its own position.
func (s *Stream) Clone() *Stream {
	c := *s
	c.pos = 0
	return &c
}

// ReadAt reads len(p) bytes at off from whichever parts hold them.
func (s *Stream) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("overlay: negative offset")
	}
	if off >= s.size {
		return 0, io.EOF
	}
	// The last part starting at or before off.
	i := sort.Search(len(s.starts), func(i int) bool { return s.starts[i] > off }) - 1
	n := 0
	for ; i < len(s.parts) && n < len(p); i++ {
		part, rel := s.parts[i], off+int64(n)-s.starts[i]
		want := min(int64(len(p)-n), part.Size-rel)
		got, err := part.R.ReadAt(p[n:n+int(want)], rel)
		n += got
		if int64(got) < want {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // a part shorter than it claimed
			}
			return n, err
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// sendfileMin is the smallest file segment worth a file handle of its own.
const sendfileMin = 64 << 10

// WriteRange writes n bytes starting at off to w. When w can read from a
// file (an HTTP response on a plain TCP connection), large file-backed parts
// go through w.ReadFrom on a handle of their own, so the kernel copies them
// without passing through user space; everything else is copied.
func (s *Stream) WriteRange(w io.Writer, off, n int64) (int64, error) {
	if off < 0 || n < 0 || off+n > s.size {
		return 0, errors.New("overlay: range out of bounds")
	}
	rf, canSendfile := w.(io.ReaderFrom)
	written := int64(0)
	i := sort.Search(len(s.starts), func(i int) bool { return s.starts[i] > off }) - 1
	for ; i < len(s.parts) && written < n; i++ {
		part := s.parts[i]
		rel := off + written - s.starts[i]
		want := min(n-written, part.Size-rel)
		var got int64
		var err error
		if canSendfile && part.path != "" && want >= sendfileMin {
			got, err = sendFile(rf, part.path, part.off+rel, want)
		} else {
			got, err = copyPart(w, part.R, rel, want)
		}
		written += got
		if err != nil {
			return written, err
		}
		if got < want {
			return written, io.ErrUnexpectedEOF
		}
	}
	return written, nil
}

func sendFile(rf io.ReaderFrom, path string, off, n int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	return rf.ReadFrom(&io.LimitedReader{R: f, N: n})
}

func copyPart(w io.Writer, r io.ReaderAt, off, n int64) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	written := int64(0)
	for written < n {
		chunk := buf[:min(int64(len(buf)), n-written)]
		k, err := r.ReadAt(chunk, off+written)
		if k > 0 {
			m, werr := w.Write(chunk[:k])
			written += int64(m)
			if werr != nil {
				return written, werr
			}
		}
		if err != nil && !(errors.Is(err, io.EOF) && int64(k) == int64(len(chunk))) {
			if errors.Is(err, io.EOF) {
				return written, nil
			}
			return written, err
		}
	}
	return written, nil
}

// Read implements io.Reader.
func (s *Stream) Read(p []byte) (int, error) {
	if s.pos >= s.size {
		return 0, io.EOF
	}
	if int64(len(p)) > s.size-s.pos {
		p = p[:s.size-s.pos]
	}
	n, err := s.ReadAt(p, s.pos)
	s.pos += int64(n)
	if errors.Is(err, io.EOF) && n > 0 {
		err = nil
	}
	return n, err
}

// Seek implements io.Seeker.
func (s *Stream) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = s.pos + offset
	case io.SeekEnd:
		abs = s.size + offset
	default:
		return 0, errors.New("overlay: invalid whence")
	}
	if abs < 0 {
		return 0, errors.New("overlay: negative position")
	}
	s.pos = abs
	return abs, nil
}
