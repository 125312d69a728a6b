package container

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Image is the platform's image of the OCI layout at dir (what make image
// writes: an index holding one index of platform images).
func Image(dir, arch string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		inner, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		if img, err := platformImage(inner, arch); err == nil {
			return img, nil
		}
	}
	return nil, fmt.Errorf("%s has no linux/%s image", dir, arch)
}

// ImageByDigest is the platform's image of the index with that digest in
// the OCI layout at dir, or the image with that digest, as a runtime pulls
// an image referenced by digest.
func ImageByDigest(dir string, digest v1.Hash, arch string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	var find func(idx v1.ImageIndex) (v1.Image, error)
	find = func(idx v1.ImageIndex) (v1.Image, error) {
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, d := range im.Manifests {
			if d.MediaType.IsIndex() {
				inner, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return nil, err
				}
				if d.Digest == digest {
					return platformImage(inner, arch)
				}
				if img, err := find(inner); err == nil {
					return img, nil
				}
				continue
			}
			if d.Digest == digest {
				return idx.Image(d.Digest)
			}
		}
		return nil, fmt.Errorf("%s holds no image or index %s (make image builds it; deploy/ names it)", dir, digest)
	}
	return find(top)
}

func platformImage(idx v1.ImageIndex, arch string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == arch {
			return idx.Image(m.Digest)
		}
	}
	return nil, fmt.Errorf("index has no linux/%s image", arch)
}

// Unpack writes the image's file system, its layers applied, under root:
// modes as the image says, owners too when the caller is root.
func Unpack(img v1.Image, root string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(h.Mode)&0o7777|modeBits(h.Mode)); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
			continue
		case tar.TypeLink:
			if err := os.Link(filepath.Join(root, filepath.Clean("/"+h.Linkname)), p); err != nil {
				return err
			}
			continue
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		default:
			continue
		}
		if os.Getuid() == 0 {
			if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
				return err
			}
		}
	}
}

// modeBits keeps the sticky bit (/tmp) that os.FileMode spells apart.
func modeBits(m int64) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}
