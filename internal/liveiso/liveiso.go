// Package liveiso understands the layout of a CoreOS live ISO (Fedora CoreOS,
// RHCOS, and agentboot's dev image, which copies it): where the Ignition embed
// area and the kernel-argument areas lie, and where the PXE kernel, initrd and
// root filesystem are. It computes the bytes to lay over those areas; it never
// writes an ISO.
package liveiso

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/agentboot/agentboot/internal/iso9660"
	"github.com/agentboot/agentboot/internal/overlay"
)

// Paths inside a live ISO.
const (
	IgnInfoPath = "coreos/igninfo.json"
	KargsPath   = "coreos/kargs.json"
	// FeaturesPath says what the image's live initramfs does; its
	// live-initrd-network is NetworkManager keyfiles in
	// etc/coreos-firstboot-network applied before Ignition.
	FeaturesPath = "coreos/features.json"
	KernelPath   = "images/pxeboot/vmlinuz"
	InitrdPath   = "images/pxeboot/initrd.img"
	RootfsPath   = "images/pxeboot/rootfs.img"
	defaultIgn   = "images/ignition.img"

	// maxKargAreaSize is coreos-installer's limit for one karg area.
	maxKargAreaSize = 2048
)

// Area is a byte range of the ISO.
type Area struct {
	Offset int64
	Length int64
}

// KargAreas are the regions of the boot loader configs that hold the kernel
// arguments; every region holds the same text.
type KargAreas struct {
	// Default is the kernel argument string the image was built with.
	Default string
	// Size of each region in bytes.
	Size int
	Pad  byte
	End  byte
	// Offsets of the regions in the ISO.
	Offsets []int64
}

// Layout is what agentboot needs to know about one live ISO.
type Layout struct {
	VolumeID string
	// Size of the ISO file in bytes.
	Size int64
	// Ignition is the embed area; all zeros in a pristine image.
	Ignition Area
	Kargs    KargAreas
	Kernel   Area
	Initrd   Area
	// Rootfs is zero-length in an ISO without images/pxeboot/rootfs.img.
	Rootfs Area
	// InitrdNetwork: the live initramfs applies NetworkManager keyfiles
	// it carries before Ignition (coreos/features.json live-initrd-network).
	InitrdNetwork bool
}

type ignInfo struct {
	File   string `json:"file"`
	Offset *int64 `json:"offset,omitempty"`
	Length *int64 `json:"length,omitempty"`
}

type kargsInfo struct {
	Default string `json:"default"`
	Files   []struct {
		Path   string `json:"path"`
		Offset int64  `json:"offset"`
		Pad    string `json:"pad"`
		End    string `json:"end"`
	} `json:"files"`
	Size int `json:"size"`
}

// Inspect reads the layout of the live ISO in r, which is size bytes long.
func Inspect(r io.ReaderAt, size int64) (*Layout, error) {
	fs, err := iso9660.Open(r)
	if err != nil {
		return nil, err
	}
	l := &Layout{Size: size}
	var pvd [32]byte
	if _, err := r.ReadAt(pvd[:], 16*iso9660.SectorSize+40); err == nil {
		l.VolumeID = strings.TrimRight(string(pvd[:]), " \x00")
	}
	if l.Ignition, err = ignitionArea(fs); err != nil {
		return nil, err
	}
	if l.Kargs, err = kargAreas(fs, r); err != nil {
		return nil, err
	}
	switch raw, err := fs.ReadFile(FeaturesPath, 4096); {
	case err == nil:
		var f struct {
			InitrdNetwork bool `json:"live-initrd-network"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, fmt.Errorf("%s: %w", FeaturesPath, err)
		}
		l.InitrdNetwork = f.InitrdNetwork
	case !errors.Is(err, iso9660.ErrNotExist):
		return nil, err
	}
	for _, f := range []struct {
		path     string
		area     *Area
		optional bool
	}{
		{KernelPath, &l.Kernel, false},
		{InitrdPath, &l.Initrd, false},
		{RootfsPath, &l.Rootfs, true},
	} {
		st, err := fs.Stat(f.path)
		if errors.Is(err, iso9660.ErrNotExist) && f.optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("not a CoreOS live ISO: %w", err)
		}
		*f.area = Area{Offset: st.Offset, Length: st.Size}
	}
	for _, a := range []Area{l.Ignition, l.Kernel, l.Initrd, l.Rootfs} {
		if a.Offset+a.Length > size {
			return nil, fmt.Errorf("ISO is truncated: a file ends at %d, the ISO at %d", a.Offset+a.Length, size)
		}
	}
	return l, nil
}

func ignitionArea(fs *iso9660.FS) (Area, error) {
	info := ignInfo{File: defaultIgn}
	raw, err := fs.ReadFile(IgnInfoPath, 4096)
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &info); err != nil {
			return Area{}, fmt.Errorf("%s: %w", IgnInfoPath, err)
		}
	case !errors.Is(err, iso9660.ErrNotExist):
		return Area{}, err
	}
	f, err := fs.Stat(info.File)
	if err != nil {
		return Area{}, fmt.Errorf("Ignition embed area %s: %w", info.File, err)
	}
	off := int64(0)
	if info.Offset != nil {
		off = *info.Offset
	}
	length := f.Size - off
	if info.Length != nil {
		length = *info.Length
	}
	if off < 0 || length <= 0 || off+length > f.Size {
		return Area{}, fmt.Errorf("%s: area %d+%d does not fit in %s (%d bytes)", IgnInfoPath, off, length, info.File, f.Size)
	}
	return Area{Offset: f.Offset + off, Length: length}, nil
}

func kargAreas(fs *iso9660.FS, r io.ReaderAt) (KargAreas, error) {
	raw, err := fs.ReadFile(KargsPath, 64<<10)
	if err != nil {
		return KargAreas{}, fmt.Errorf("kernel arguments cannot be embedded in this ISO: %w", err)
	}
	var info kargsInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return KargAreas{}, fmt.Errorf("%s: %w", KargsPath, err)
	}
	if info.Size <= 0 || info.Size > maxKargAreaSize {
		return KargAreas{}, fmt.Errorf("%s: area size %d out of range (1-%d)", KargsPath, info.Size, maxKargAreaSize)
	}
	if len(info.Default) >= info.Size {
		return KargAreas{}, fmt.Errorf("%s: default kernel arguments longer than the area", KargsPath)
	}
	if len(info.Files) == 0 {
		return KargAreas{}, fmt.Errorf("%s: no kernel-argument areas", KargsPath)
	}
	k := KargAreas{Default: info.Default, Size: info.Size, Pad: '#', End: '\n'}
	for i, f := range info.Files {
		pad, end, err := padAndEnd(f.Pad, f.End)
		if err != nil {
			return KargAreas{}, fmt.Errorf("%s: %s: %w", KargsPath, f.Path, err)
		}
		if i == 0 {
			k.Pad, k.End = pad, end
		} else if pad != k.Pad || end != k.End {
			return KargAreas{}, fmt.Errorf("%s: areas use different pad or end characters", KargsPath)
		}
		st, err := fs.Stat(f.Path)
		if err != nil {
			return KargAreas{}, fmt.Errorf("%s: %w", KargsPath, err)
		}
		if f.Offset < 0 || f.Offset+int64(info.Size) > st.Size {
			return KargAreas{}, fmt.Errorf("%s: area at %d+%d lies outside %s", KargsPath, f.Offset, info.Size, f.Path)
		}
		abs := st.Offset + f.Offset
		// The area must hold the default arguments, or this is not the
		// pristine image the catalog expects.
		cur := make([]byte, info.Size)
		if _, err := r.ReadAt(cur, abs); err != nil {
			return KargAreas{}, fmt.Errorf("read kernel-argument area in %s: %w", f.Path, err)
		}
		if got := k.current(cur); got != info.Default {
			return KargAreas{}, fmt.Errorf("kernel-argument area in %s holds %q, not the default %q", f.Path, got, info.Default)
		}
		k.Offsets = append(k.Offsets, abs)
	}
	return k, nil
}

func padAndEnd(pad, end string) (byte, byte, error) {
	p, e := byte('#'), byte('\n')
	if pad != "" {
		if len(pad) != 1 {
			return 0, 0, fmt.Errorf("pad %q is not one byte", pad)
		}
		p = pad[0]
	}
	if end != "" {
		if len(end) != 1 {
			return 0, 0, fmt.Errorf("end %q is not one byte", end)
		}
		e = end[0]
	}
	return p, e, nil
}

// current reads the arguments out of one area's bytes.
func (k KargAreas) current(b []byte) string {
	s := strings.TrimRight(string(b), string(k.Pad))
	s = strings.TrimRight(s, string(k.End))
	return strings.TrimSpace(s)
}

// ErrKargsTooLong is returned when arguments do not fit the area.
var ErrKargsTooLong = errors.New("kernel arguments do not fit the ISO's kernel-argument area")

// Render returns the bytes of one area holding kargs: the arguments, one end
// character, then padding.
func (k KargAreas) Render(kargs string) ([]byte, error) {
	kargs = strings.TrimSpace(kargs)
	if len(kargs) >= k.Size {
		return nil, fmt.Errorf("%w: %d bytes, the area holds %d", ErrKargsTooLong, len(kargs), k.Size-1)
	}
	if strings.ContainsAny(kargs, "\n\r\x00"+string(k.Pad)) {
		return nil, fmt.Errorf("kernel arguments contain a line break or %q", k.Pad)
	}
	b := bytes.Repeat([]byte{k.Pad}, k.Size)
	copy(b, kargs)
	b[len(kargs)] = k.End
	return b, nil
}

// ErrIgnitionTooLarge is returned when the compressed Ignition archive does
// not fit the embed area.
var ErrIgnitionTooLarge = errors.New("the compressed Ignition config does not fit the ISO's embed area")

// Patches returns the overlay that embeds the compressed Ignition archive
// (zero-padded to the whole area) and kargs into the image.
func (l *Layout) Patches(ignitionArchive []byte, kargs string) ([]overlay.Patch, error) {
	n := int64(len(ignitionArchive))
	if n > l.Ignition.Length {
		return nil, fmt.Errorf("%w: %d bytes, the area holds %d", ErrIgnitionTooLarge, n, l.Ignition.Length)
	}
	patches := []overlay.Patch{
		overlay.BytesAt(l.Ignition.Offset, ignitionArchive),
		overlay.ZerosAt(l.Ignition.Offset+n, l.Ignition.Length-n),
	}
	region, err := l.Kargs.Render(kargs)
	if err != nil {
		return nil, err
	}
	for _, off := range l.Kargs.Offsets {
		patches = append(patches, overlay.BytesAt(off, region))
	}
	return patches, nil
}
