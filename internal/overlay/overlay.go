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
	"sort"
)

// Part is one piece of a concatenation.
type Part struct {
	R    io.ReaderAt
	Size int64
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

// Patch replaces bytes of a base at Offset.
type Patch struct {
	Offset int64
	Data   []byte
}

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

// New lays patches over base (size bytes long). Patches must lie inside the
// base and must not overlap.
func New(base io.ReaderAt, size int64, patches ...Patch) (*Stream, error) {
	sorted := append([]Patch(nil), patches...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Offset < sorted[j].Offset })
	var parts []Part
	at := int64(0)
	for _, p := range sorted {
		end := p.Offset + int64(len(p.Data))
		if p.Offset < at {
			return nil, fmt.Errorf("overlay: patch at %d overlaps the previous one", p.Offset)
		}
		if end > size {
			return nil, fmt.Errorf("overlay: patch at %d+%d ends past the base (%d bytes)", p.Offset, len(p.Data), size)
		}
		parts = append(parts, Part{R: io.NewSectionReader(base, at, p.Offset-at), Size: p.Offset - at}, Bytes(p.Data))
		at = end
	}
	parts = append(parts, Part{R: io.NewSectionReader(base, at, size-at), Size: size - at})
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
