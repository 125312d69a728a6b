// Package initramfs writes the compressed newc cpio archives the Linux kernel
// unpacks as an initramfs: the Ignition embed area of a live ISO and the
// archive appended to a PXE initrd. It writes archives in memory and never
// reads them back; the kernel and cpio(1) are its readers in tests.
package initramfs

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/ulikunitz/xz"
)

// File is one regular file of an archive.
type File struct {
	// Path inside the archive, relative ("config.ign", "etc/x/y").
	Path string
	Mode uint32 // permission bits, such as 0o644
	Data []byte
}

// Compression of an archive.
type Compression int

// Compressions the kernel accepts for an initramfs.
const (
	// XZ with a CRC32 check, as coreos-installer writes: the kernel's xz
	// decoder does not accept CRC64 or SHA-256 checks.
	XZ Compression = iota
	Gzip
	None
)

const (
	modeDir  = 0o040000
	modeFile = 0o100000
)

// Archive builds a newc cpio of files, with an entry for every parent
// directory, in path order, compressed with c.
func Archive(c Compression, files ...File) ([]byte, error) {
	var raw bytes.Buffer
	if err := writeCPIO(&raw, files); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	switch c {
	case XZ:
		w, err := xz.WriterConfig{CheckSum: xz.CRC32}.NewWriter(&out)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(raw.Bytes()); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
	case Gzip:
		w, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(raw.Bytes()); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
	case None:
		return raw.Bytes(), nil
	default:
		return nil, fmt.Errorf("unknown compression %d", c)
	}
	return out.Bytes(), nil
}

// Pad4 returns b zero-padded to a multiple of four bytes, which the kernel
// requires between concatenated archives.
func Pad4(b []byte) []byte {
	if r := len(b) % 4; r != 0 {
		return append(b, make([]byte, 4-r)...)
	}
	return b
}

func writeCPIO(w io.Writer, files []File) error {
	type entry struct {
		name string
		mode uint32
		data []byte
	}
	dirs := map[string]bool{}
	var entries []entry
	for _, f := range files {
		p := path.Clean(strings.TrimPrefix(f.Path, "/"))
		if p == "." || strings.HasPrefix(p, "../") || p == ".." {
			return fmt.Errorf("cpio: invalid path %q", f.Path)
		}
		for d := path.Dir(p); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			entries = append(entries, entry{name: d, mode: modeDir | 0o755})
		}
		entries = append(entries, entry{name: p, mode: modeFile | (f.Mode & 0o7777), data: f.Data})
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	for i, e := range entries {
		if err := writeEntry(w, uint32(i+1), e.name, e.mode, e.data); err != nil {
			return err
		}
	}
	return writeEntry(w, 0, "TRAILER!!!", 0, nil)
}

func writeEntry(w io.Writer, ino uint32, name string, mode uint32, data []byte) error {
	nlink := uint32(1)
	if mode&modeDir != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, err := w.Write(b.Bytes())
	return err
}
