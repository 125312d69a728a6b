package main

import (
	"archive/tar"
	"bytes"
	"io"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// file is one entry of a layer.
type file struct {
	mode     int64
	typeflag byte
	link     string
	data     []byte
	uid, gid int
}

// layer is a file system layer built the same way every time: entries in
// path order, every parent directory present, every time the epoch, no
// user or group names.
type layer map[string]file

func (l layer) dir(p string, mode int64) { l[p] = file{mode: mode, typeflag: tar.TypeDir} }

func (l layer) symlink(p, target string) {
	l[p] = file{mode: 0o777, typeflag: tar.TypeSymlink, link: target}
}

func (l layer) file(p string, mode int64, data []byte) {
	l[p] = file{mode: mode, typeflag: tar.TypeReg, data: data}
}

func (l layer) tar(epoch time.Time) ([]byte, error) {
	for p := range l {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := l[d]; !ok {
				l.dir(d, 0o755)
			}
		}
	}
	paths := make([]string, 0, len(l))
	for p := range l {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, p := range paths {
		f := l[p]
		h := &tar.Header{
			Name: p[1:], Mode: f.mode, Typeflag: f.typeflag, Linkname: f.link, Size: int64(len(f.data)),
			ModTime: epoch, Uid: f.uid, Gid: f.gid, Format: tar.FormatPAX,
		}
		if f.typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if f.typeflag == tar.TypeLink {
			h.Linkname = f.link[1:]
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// v1Layer compresses the layer's tar (gzip with no name or time in its
// header: the same bytes give the same digest).
func (l layer) v1Layer(epoch time.Time) (v1.Layer, error) {
	raw, err := l.tar(epoch)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(6), tarball.WithCompressedCaching)
}
