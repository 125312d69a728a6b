// Package iso9660 finds files inside an ISO 9660 image without extracting
// it: for each path it returns where the file's bytes lie in the image, so
// callers can serve or overlay them in place. It understands Rock Ridge names
// (what CoreOS and xorriso write) and falls back to plain ISO 9660 names,
// including their 8.3 forms. It only reads; every structure it parses comes
// from an untrusted image and is bounds-checked.
package iso9660

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// SectorSize is the logical block size of every ISO this package reads.
const SectorSize = 2048

const (
	maxDirSize  = 16 << 20 // bytes of one directory's records
	maxDepth    = 32
	maxCEChain  = 16 // Rock Ridge continuation areas followed per record
	flagDir     = 1 << 1
	flagMultiEx = 1 << 7
)

// ErrNotExist is returned for a path the image does not contain.
var ErrNotExist = errors.New("no such file in ISO")

// File is a file or directory inside the image.
type File struct {
	// Name is the Rock Ridge name when there is one, else the ISO name
	// without its ";1" version.
	Name string
	// Offset of the file's first byte in the image.
	Offset int64
	// Size in bytes.
	Size  int64
	IsDir bool
}

// FS is an opened image.
type FS struct {
	r         io.ReaderAt
	size      int64 // bytes the volume claims
	root      File
	rockRidge bool
	suspSkip  int
}

// Open reads the primary volume descriptor and the root directory of the
// image in r.
func Open(r io.ReaderAt) (*FS, error) {
	fs := &FS{r: r}
	for sector := int64(16); sector < 16+64; sector++ {
		var vd [SectorSize]byte
		if _, err := r.ReadAt(vd[:], sector*SectorSize); err != nil {
			return nil, fmt.Errorf("read volume descriptor %d: %w", sector, err)
		}
		if string(vd[1:6]) != "CD001" {
			return nil, errors.New("not an ISO 9660 image (no CD001 signature)")
		}
		switch vd[0] {
		case 1: // primary volume descriptor
			if bs := binary.LittleEndian.Uint16(vd[128:]); bs != SectorSize {
				return nil, fmt.Errorf("logical block size %d, only %d is supported", bs, SectorSize)
			}
			fs.size = int64(binary.LittleEndian.Uint32(vd[80:])) * SectorSize
			rec, _, err := parseRecord(vd[156:190])
			if err != nil {
				return nil, fmt.Errorf("root directory record: %w", err)
			}
			if !rec.isDir() {
				return nil, errors.New("root directory record is not a directory")
			}
			fs.root = File{Name: "/", Offset: rec.extent * SectorSize, Size: rec.size, IsDir: true}
			if err := fs.detectRockRidge(); err != nil {
				return nil, err
			}
			return fs, nil
		case 255:
			return nil, errors.New("no primary volume descriptor")
		}
	}
	return nil, errors.New("no primary volume descriptor in the first 64 descriptors")
}

// Size is the size of the volume in bytes, as its descriptor says.
func (fs *FS) Size() int64 { return fs.size }

// Stat finds the file at p, a slash-separated path relative to the root
// ("images/pxeboot/vmlinuz"). Names match case-insensitively.
func (fs *FS) Stat(p string) (File, error) {
	p = strings.Trim(path.Clean("/"+p), "/")
	cur := fs.root
	if p == "" {
		return cur, nil
	}
	parts := strings.Split(p, "/")
	if len(parts) > maxDepth {
		return File{}, fmt.Errorf("%s: too deep", p)
	}
	for i, want := range parts {
		if !cur.IsDir {
			return File{}, fmt.Errorf("%s: %w", p, ErrNotExist)
		}
		entries, err := fs.readDir(cur)
		if err != nil {
			return File{}, fmt.Errorf("%s: %w", strings.Join(parts[:i], "/"), err)
		}
		found := false
		for _, e := range entries {
			if e.matches(want) {
				if e.multiExtent {
					return File{}, fmt.Errorf("%s: files of several extents are not supported", p)
				}
				cur, found = e.File, true
				break
			}
		}
		if !found {
			return File{}, fmt.Errorf("%s: %w", p, ErrNotExist)
		}
	}
	return cur, nil
}

// ReadDir lists the directory at p.
func (fs *FS) ReadDir(p string) ([]File, error) {
	dir, err := fs.Stat(p)
	if err != nil {
		return nil, err
	}
	if !dir.IsDir {
		return nil, fmt.Errorf("%s: not a directory", p)
	}
	entries, err := fs.readDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]File, len(entries))
	for i, e := range entries {
		out[i] = e.File
	}
	return out, nil
}

// ReadFile returns the content of the file at p, refusing files larger than
// max bytes.
func (fs *FS) ReadFile(p string, max int64) ([]byte, error) {
	f, err := fs.Stat(p)
	if err != nil {
		return nil, err
	}
	if f.IsDir {
		return nil, fmt.Errorf("%s: is a directory", p)
	}
	if f.Size > max {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d expected", p, f.Size, max)
	}
	buf := make([]byte, f.Size)
	if _, err := fs.r.ReadAt(buf, f.Offset); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return buf, nil
}

// entry is a parsed directory record with both of its names.
type entry struct {
	File
	isoName     string // without version, upper case as recorded
	rrName      string
	multiExtent bool
}

func (e entry) matches(want string) bool {
	if e.rrName != "" {
		return strings.EqualFold(e.rrName, want)
	}
	return strings.EqualFold(e.isoName, want) || strings.EqualFold(e.isoName, mangle83(want))
}

// mangle83 is the ISO level 1 form of a name: at most eight characters, a
// dot and three characters, as a reader without Rock Ridge sees
// "igninfo.json" ("IGNINFO.JSO").
func mangle83(name string) string {
	base, ext, _ := strings.Cut(name, ".")
	if len(base) > 8 {
		base = base[:8]
	}
	if len(ext) > 3 {
		ext = ext[:3]
	}
	if ext == "" {
		return base
	}
	return base + "." + ext
}

type record struct {
	length  int
	extent  int64
	size    int64
	flags   byte
	name    []byte
	sysUse  []byte
	nameLen int
}

func (r record) isDir() bool { return r.flags&flagDir != 0 }

// parseRecord parses one directory record at the start of b.
func parseRecord(b []byte) (record, int, error) {
	if len(b) < 1 || b[0] == 0 {
		return record{}, 0, nil
	}
	n := int(b[0])
	if n < 34 || n > len(b) {
		return record{}, 0, fmt.Errorf("directory record length %d out of range", n)
	}
	nameLen := int(b[32])
	if 33+nameLen > n {
		return record{}, 0, fmt.Errorf("name length %d overruns record of %d bytes", nameLen, n)
	}
	rec := record{
		length:  n,
		extent:  int64(binary.LittleEndian.Uint32(b[2:])),
		size:    int64(binary.LittleEndian.Uint32(b[10:])),
		flags:   b[25],
		name:    b[33 : 33+nameLen],
		nameLen: nameLen,
	}
	su := 33 + nameLen
	if nameLen%2 == 0 {
		su++ // padding byte
	}
	if su < n {
		rec.sysUse = b[su:n]
	}
	return rec, n, nil
}

// readDir parses the records of one directory.
func (fs *FS) readDir(dir File) ([]entry, error) {
	if dir.Size > maxDirSize {
		return nil, fmt.Errorf("directory of %d bytes is too large", dir.Size)
	}
	if fs.size > 0 && dir.Offset+dir.Size > fs.size {
		return nil, fmt.Errorf("directory at %d+%d lies beyond the volume", dir.Offset, dir.Size)
	}
	// Records never cross sector boundaries, so one sector at a time.
	var out []entry
	var sector [SectorSize]byte
	for base := int64(0); base < dir.Size; base += SectorSize {
		n, err := fs.r.ReadAt(sector[:], dir.Offset+base)
		if n < SectorSize && (err == nil || errors.Is(err, io.EOF)) && base+int64(n) < dir.Size {
			return nil, fmt.Errorf("read directory: %w", io.ErrUnexpectedEOF)
		} else if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read directory: %w", err)
		}
		buf := sector[:min(int64(n), dir.Size-base)]
		entries, err := fs.parseSector(buf, dir.Offset+base)
		if err != nil {
			return nil, err
		}
		out = append(out, entries...)
	}
	return out, nil
}

// parseSector parses the records in one sector of a directory.
func (fs *FS) parseSector(buf []byte, at int64) ([]entry, error) {
	var out []entry
	for off := 0; off < len(buf); {
		rec, n, err := parseRecord(buf[off:])
		if err != nil {
			return nil, fmt.Errorf("record at %d: %w", at+int64(off), err)
		}
		if n == 0 { // the rest of the sector is padding
			break
		}
		off += n
		if rec.nameLen == 1 && (rec.name[0] == 0 || rec.name[0] == 1) {
			continue // "." and ".."
		}
		e := entry{
			File: File{
				Offset: rec.extent * SectorSize,
				Size:   rec.size,
				IsDir:  rec.isDir(),
			},
			isoName:     isoName(rec.name),
			multiExtent: rec.flags&flagMultiEx != 0,
		}
		if fs.rockRidge {
			e.rrName = fs.rockRidgeName(rec.sysUse)
		}
		e.Name = e.rrName
		if e.Name == "" {
			e.Name = e.isoName
		}
		if fs.size > 0 && e.Offset+e.Size > fs.size {
			return nil, fmt.Errorf("%s lies beyond the end of the volume", e.Name)
		}
		out = append(out, e)
	}
	return out, nil
}

func isoName(b []byte) string {
	s := string(b)
	if i := strings.IndexByte(s, ';'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSuffix(s, ".")
}

// detectRockRidge reads the root's "." record: Rock Ridge images carry a
// SUSP "SP" entry there, which also says how many bytes to skip.
func (fs *FS) detectRockRidge() error {
	buf := make([]byte, min(fs.root.Size, SectorSize))
	if _, err := fs.r.ReadAt(buf, fs.root.Offset); err != nil {
		return fmt.Errorf("read root directory: %w", err)
	}
	rec, n, err := parseRecord(buf)
	if err != nil || n == 0 {
		return fmt.Errorf("root directory: first record unreadable (%v)", err)
	}
	su := rec.sysUse
	if len(su) >= 7 && su[0] == 'S' && su[1] == 'P' && su[4] == 0xBE && su[5] == 0xEF {
		fs.rockRidge = true
		fs.suspSkip = int(su[6])
	}
	return nil
}

// rockRidgeName assembles the NM entries of a record's system use area,
// following continuation areas.
func (fs *FS) rockRidgeName(su []byte) string {
	if fs.suspSkip < len(su) {
		su = su[fs.suspSkip:]
	} else {
		return ""
	}
	var name strings.Builder
	for hops := 0; hops <= maxCEChain && len(su) > 0; hops++ {
		var next []byte
		for len(su) >= 4 {
			sig, l := string(su[:2]), int(su[2])
			if l < 4 || l > len(su) {
				break
			}
			body := su[4:l]
			switch sig {
			case "NM":
				if len(body) >= 1 && body[0]&0x06 == 0 { // not "." or ".."
					name.Write(body[1:])
				}
			case "CE":
				if len(body) >= 24 {
					block := int64(binary.LittleEndian.Uint32(body[0:]))
					off := int64(binary.LittleEndian.Uint32(body[8:]))
					n := int64(binary.LittleEndian.Uint32(body[16:]))
					if n > 0 && n <= SectorSize && off < SectorSize {
						buf := make([]byte, n)
						if _, err := fs.r.ReadAt(buf, block*SectorSize+off); err == nil {
							next = buf
						}
					}
				}
			case "ST":
				su = nil
			}
			if su == nil {
				break
			}
			su = su[l:]
		}
		su = next
	}
	return name.String()
}
