package erase

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/sanitize"
)

func TestParseNVMeIdentify(t *testing.T) {
	ctrl := func(oacs uint16, fna byte, sanicap uint32) []byte {
		b := make([]byte, nvmeIdentifySize)
		binary.LittleEndian.PutUint16(b[256:], oacs)
		b[524] = fna
		binary.LittleEndian.PutUint32(b[328:], sanicap)
		return b
	}
	manyNamespaces := ctrl(0, 0, 0)
	binary.LittleEndian.PutUint32(manyNamespaces[516:], 1024)
	for name, tc := range map[string]struct {
		id   []byte
		want nvmeController
	}{
		"NN":                          {manyNamespaces, nvmeController{namespaces: 1024}},
		"nothing":                     {ctrl(0, 0, 0), nvmeController{}},
		"format without crypto":       {ctrl(1<<1, 0, 0), nvmeController{formatNVM: true}},
		"format with crypto":          {ctrl(1<<1, 1<<2, 0), nvmeController{formatNVM: true, formatCrypto: true}},
		"FNA crypto without Format":   {ctrl(0, 1<<2, 0), nvmeController{}},
		"sanitize crypto and block":   {ctrl(0, 0, 0b011), nvmeController{sanitizeCrypto: true, sanitizeBlock: true}},
		"sanitize overwrite only":     {ctrl(0, 0, 0b100), nvmeController{sanitizeOver: true}},
		"NODMMAS bits are not a verb": {ctrl(0, 0, 0xc000_0000), nvmeController{}},
		"format and erase reach all":  {ctrl(1<<1, 0b011, 0), nvmeController{formatNVM: true, formatAll: true, eraseAll: true}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseNVMeController(tc.id)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := parseNVMeController(make([]byte, 100))
	require.ErrorIs(t, err, errShortIdentify)
}

func TestParseATAIdentify(t *testing.T) {
	id := func(words map[int]uint16) []byte {
		b := make([]byte, ataIdentifySize)
		for n, w := range words {
			binary.LittleEndian.PutUint16(b[2*n:], w)
		}
		return b
	}
	for name, tc := range map[string]struct {
		words map[int]uint16
		want  ataIdentity
	}{
		"nothing": {nil, ataIdentity{}},
		"security, enhanced": {map[int]uint16{82: 1 << 1, 128: 1 | 1<<5},
			ataIdentity{securitySupported: true, enhancedErase: true}},
		"frozen": {map[int]uint16{82: 1 << 1, 128: 1 | 1<<3},
			ataIdentity{securitySupported: true, securityFrozen: true}},
		"locked with a password": {map[int]uint16{82: 1 << 1, 128: 1 | 1<<1 | 1<<2},
			ataIdentity{securitySupported: true, securityEnabled: true, securityLocked: true}},
		"word 82 not valid": {map[int]uint16{82: 0xffff, 128: 1 | 1<<5}, ataIdentity{}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseATAIdentify(id(tc.words))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestNVMePassthroughLayout(t *testing.T) {
	// struct nvme_passthru_cmd is 72 bytes; the ioctl number encodes it.
	require.Equal(t, uintptr(72), unsafe.Sizeof(nvmeAdminCmd{}))
	require.Equal(t, uint32(0xc0000000|72<<16|'N'<<8|0x41), uint32(nvmeIoctlAdminCmd))
}

type fakeDrive struct {
	ctrl, ata []byte
	err       error
	// format plays the drive's Format NVM on the file standing in for it.
	format func(f *os.File, ses uint32) error
	// progress is the drive's Format Progress Indicator; 0 for none.
	progress float64
	// polls counts the indicator's reads, when set.
	polls *atomic.Int32
}

func (f fakeDrive) NVMe(string) ([]byte, error) { return f.ctrl, f.err }
func (f fakeDrive) ATA(string) ([]byte, error)  { return f.ata, f.err }
func (f fakeDrive) FormatNVM(file *os.File, ses uint32, _ time.Duration) error {
	return f.format(file, ses)
}
func (f fakeDrive) FormatProgress(*os.File, time.Duration) (float64, bool) {
	if f.polls != nil {
		f.polls.Add(1)
	}
	return f.progress, f.progress > 0
}

// fakeSys writes a sysfs disk directory under root.
func fakeSys(t *testing.T, root, name string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, "sys/block", name, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(v+"\n"), 0o644))
	}
}

func TestProbeDevice(t *testing.T) {
	nvmeCtrl := make([]byte, nvmeIdentifySize)
	binary.LittleEndian.PutUint16(nvmeCtrl[256:], 1<<1)
	nvmeCtrl[524] = 1 << 2
	binary.LittleEndian.PutUint32(nvmeCtrl[328:], 1)
	binary.LittleEndian.PutUint32(nvmeCtrl[516:], 1) // NN: one namespace
	ata := make([]byte, ataIdentifySize)
	binary.LittleEndian.PutUint16(ata[2*82:], 1<<1)
	binary.LittleEndian.PutUint16(ata[2*128:], 1|1<<3)

	root := t.TempDir()
	fakeSys(t, root, "nvme0n1", map[string]string{"size": "2000", "ro": "0", "queue/write_zeroes_max_bytes": "131072",
		"nvme0n1p1/start": "2048", "nvme0n1p1/size": "1000"})
	fakeSys(t, root, "sda", map[string]string{"size": "4096", "ro": "0", "removable": "0", "queue/write_zeroes_max_bytes": "0"})
	fakeSys(t, root, "sdb", map[string]string{"size": "4096", "ro": "1"})
	fakeSys(t, root, "sdc", map[string]string{"size": "100", "sdc1/start": "50", "sdc1/size": "60"})
	fakeSys(t, root, "sdd", map[string]string{"size": "4096", "removable": "1", "ro": "1"})
	fakeSys(t, root, "sdf", map[string]string{"size": "4096", "removable": "1", "ro": "0"})
	fakeSys(t, root, "sr0", map[string]string{"size": "4096", "ro": "1", "removable": "1", "device/type": "5"})
	fakeSys(t, root, "sde", map[string]string{"size": "4096", "sde2/start": "8", "sde2/size": "8", "sde2/holders/md127": ""})
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/mounts"), []byte("/dev/sdb1 /run/media/iso vfat ro 0 0\n"), 0o644))

	t.Run("nvme", func(t *testing.T) {
		o := Options{Root: root, Drive: fakeDrive{ctrl: nvmeCtrl}}
		_, err := probeDevice(o, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		// The partition claims sectors beyond the 2000-sector disk.
		require.ErrorContains(t, err, "partition nvme0n1p1 (1048576+512000 bytes) lies outside the disk (1024000 bytes)")
		fakeSys(t, root, "nvme0n1", map[string]string{"size": "20000"})
		got, err := probeDevice(o, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		require.NoError(t, err)
		require.Equal(t, int64(20000*512), got.Size)
		require.Equal(t, []Extent{{2048 * 512, 1000 * 512}}, got.Partitions)
		require.Equal(t, sanitize.Device{WriteZeroes: true, NVMeSanitizeCrypto: true, NVMeFormatCrypto: true, NVMeFormatUserData: true}, got.Device)
		require.Equal(t, sanitize.Plan{Method: sanitize.WriteZeroes, Verify: sanitize.ReadsZero, Why: "the device zeroes blocks itself (Write Zeroes)"},
			sanitize.Choose(sanitize.Erase, Supported(got.Device)), "the agent's own choice skips the commands it does not send")
	})
	t.Run("nvme with several namespaces", func(t *testing.T) {
		shared := bytes.Clone(nvmeCtrl)
		binary.LittleEndian.PutUint32(shared[516:], 32)
		got, err := probeDevice(Options{Root: root, Drive: fakeDrive{ctrl: shared}}, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{WriteZeroes: true, NVMeFormatCrypto: true, NVMeFormatUserData: true}, got.Device,
			"a sanitize erases every namespace: not offered; a format per namespace is")
		require.Contains(t, strings.Join(got.Notes, "; "), "NVMe sanitize not used: it erases every namespace, and the subsystem may have namespace IDs up to 32")
		shared[524] |= 1 << 0 // FNA: a format formats every namespace
		got, err = probeDevice(Options{Root: root, Drive: fakeDrive{ctrl: shared}}, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{WriteZeroes: true}, got.Device)
		require.Contains(t, strings.Join(got.Notes, "; "), "NVMe format not used: the subsystem formats or erases all of its namespaces at once (FNA), and may have namespace IDs up to 32")
		shared[524] = 1<<1 | 1<<2 // FNA: the secure erase of a format erases every namespace
		got, err = probeDevice(Options{Root: root, Drive: fakeDrive{ctrl: shared}}, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{WriteZeroes: true}, got.Device)
		binary.LittleEndian.PutUint32(shared[516:], 1)
		got, err = probeDevice(Options{Root: root, Drive: fakeDrive{ctrl: shared}}, Target{Path: "/dev/nvme0n1"}, "nvme0n1", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{WriteZeroes: true, NVMeSanitizeCrypto: true, NVMeFormatCrypto: true, NVMeFormatUserData: true}, got.Device,
			"all namespaces at once is this one when there can be only one")
	})
	t.Run("sata, frozen", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Drive: fakeDrive{ata: ata}}, Target{Path: "/dev/sda"}, "sda", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{ATASecurityErase: true, ATAFrozen: true}, got.Device)
	})
	t.Run("ISO content on a fixed disk is data", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("inappropriate ioctl for device")}}, Target{Path: "/dev/sda"}, "sda", true)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{}, got.Device, "the previous tenant could have written CD001 there")
		require.Equal(t, []string{"no ATA IDENTIFY: inappropriate ioctl for device"}, got.Notes)
	})
	t.Run("ISO on a read-only removable device is the boot medium", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("no")}}, Target{Path: "/dev/sdd"}, "sdd", true)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium)
		got, err = probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("no")}}, Target{Path: "/dev/sdf"}, "sdf", true)
		require.NoError(t, err)
		require.False(t, got.Device.BootMedium, "a writable USB stick holds what anyone wrote")
	})
	t.Run("no medium", func(t *testing.T) {
		fakeSys(t, root, "sdg", map[string]string{"size": "0", "removable": "1"})
		got, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sdg"}, "sdg", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Skip, sanitize.Choose(sanitize.Erase, got.Device).Method)
	})
	t.Run("a fixed disk without capacity", func(t *testing.T) {
		fakeSys(t, root, "nvme1n1", map[string]string{"size": "0", "removable": "0"})
		got, err := probeDevice(Options{Root: root}, Target{Path: "/dev/nvme1n1"}, "nvme1n1", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{NoCapacity: true}, got.Device)
		require.Equal(t, sanitize.Unerasable, sanitize.Choose(sanitize.Erase, got.Device).Method, "what it held may come back")
		fakeSys(t, root, "sdh", map[string]string{"size": "0", "removable": "0"}) // a SAS disk with 520-byte sectors
		got, err = probeDevice(Options{Root: root}, Target{Path: "/dev/sdh"}, "sdh", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{NoCapacity: true}, got.Device)
	})
	t.Run("optical drive", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sr0"}, "sr0", false)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium)
	})
	t.Run("mounted", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("no")}}, Target{Path: "/dev/sdb"}, "sdb", false)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium, "sdb1 is mounted")
	})
	t.Run("held by RAID", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("no")}}, Target{Path: "/dev/sde"}, "sde", false)
		require.EqualError(t, err, "disk /dev/sde is in use by md127 (of sde2): not erased")
		kept, err := probeDevice(Options{Root: root, Drive: fakeDrive{err: errors.New("no")}}, Target{Path: "/dev/sde", Device: sanitize.Device{Kept: true}}, "sde", false)
		require.NoError(t, err, "a disk to keep is never written: its RAID does not matter")
		require.Equal(t, sanitize.Skip, sanitize.Choose(sanitize.Erase, Supported(kept.Device)).Method)
	})
	t.Run("partition outside", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root, Drive: fakeDrive{}}, Target{Path: "/dev/sdc"}, "sdc", false)
		require.ErrorContains(t, err, "lies outside the disk")
	})
	t.Run("no sysfs", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sdz1"}, "sdz1", false)
		require.ErrorContains(t, err, "a partition or not a disk")
	})
}

// disk is a file full of random bytes, standing in for a disk.
// randomBytes are as many as the largest disk of the tests, none zero.
var randomBytes = sync.OnceValue(func() []byte {
	b := make([]byte, 64<<20)
	_, _ = rand.NewChaCha8([32]byte{3, 4}).Read(b)
	return bytes.ReplaceAll(b, []byte{0}, []byte{1}) // never zero: every byte left shows
})

// Each disk of a size holds the same bytes (generated once: under the race
// detector, generating them is most of a test's time).
func disk(t *testing.T, size int64) (string, []byte) {
	t.Helper()
	data := bytes.Clone(randomBytes()[:size])
	p := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(p, data, 0o644))
	return p, data
}

func TestOverwrite(t *testing.T) {
	path, _ := disk(t, 48<<20+512)
	target, err := Probe(Options{}, path, false)
	require.NoError(t, err)
	plan := sanitize.Choose(sanitize.Erase, Supported(target.Device))
	require.Equal(t, sanitize.Overwrite, plan.Method)
	var last, total int64
	ev, err := Run(context.Background(), target, plan, func(done, all int64) { last, total = done, all })
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, make([]byte, len(got)), got, "every byte is zero")
	require.Equal(t, int64(len(got)), ev.Bytes)
	require.Equal(t, ev.Bytes, last)
	require.Equal(t, ev.Bytes, total)
	require.Equal(t, string(sanitize.ReadsZero), ev.Verification)
	require.Contains(t, ev.Checked, "256 sampled 64 KiB blocks and the first and last MiB of 1 regions read back as zeros (read ")
	require.Positive(t, ev.DurationSeconds)
}

func TestWipeMetadata(t *testing.T) {
	path, data := disk(t, 16<<20)
	target, err := Probe(Options{}, path, false)
	require.NoError(t, err)
	target.Partitions = []Extent{{1 << 20, 8 << 20}, {9 << 20, 1 << 20}}
	ev, err := Run(context.Background(), target, sanitize.Choose(sanitize.Metadata, target.Device), nil)
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	zero := func(from, to int64) {
		require.Equal(t, make([]byte, to-from), got[from:to], "bytes %d to %d", from, to)
	}
	zero(0, 2<<20)       // the disk's first MiB and the first partition's
	zero(8<<20, 10<<20)  // the first partition's last MiB, the whole second one
	zero(15<<20, 16<<20) // the disk's last MiB (backup GPT)
	require.Equal(t, data[2<<20:8<<20], got[2<<20:8<<20], "data blocks stay: metadata promises nothing about them")
	require.Equal(t, int64(5<<20), ev.Bytes)
}

func TestEraseRefusesAndReports(t *testing.T) {
	t.Run("a method the agent does not send", func(t *testing.T) {
		path, _ := disk(t, 1<<20)
		target, err := Probe(Options{}, path, false)
		require.NoError(t, err)
		_, err = Run(context.Background(), target, sanitize.Plan{Method: sanitize.NVMeSanitizeCrypto}, nil)
		require.ErrorContains(t, err, "method nvme-sanitize-crypto is not one this agent carries out")
	})
	t.Run("cancelled", func(t *testing.T) {
		path, data := disk(t, 32<<20)
		target, err := Probe(Options{}, path, false)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		_, err = Run(ctx, target, sanitize.Plan{Method: sanitize.Overwrite, Verify: sanitize.ReadsZero}, func(done, _ int64) {
			if done >= 8<<20 {
				cancel()
			}
		})
		require.ErrorIs(t, err, context.Canceled)
		got, _ := os.ReadFile(path)
		require.Equal(t, data[len(data)-10:], got[len(got)-10:], "the rest was not reached")
	})
	t.Run("a byte that does not read back as zero", func(t *testing.T) {
		path, _ := disk(t, 8<<20)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, zeroRegions(context.Background(), f, []Extent{{0, 8 << 20}}, func(int64, int64) {}))
		_, err = f.WriteAt([]byte{0x5a}, 8<<20-3)
		require.NoError(t, err)
		_, err = verifyZero(path, 8<<20, []Extent{{0, 8 << 20}})
		require.EqualError(t, err, "byte 8388605 reads 0x5a, not zero")
	})
	t.Run("read-only", func(t *testing.T) {
		path, _ := disk(t, 1<<20)
		target, err := Probe(Options{}, path, false)
		require.NoError(t, err)
		target.Device.ReadOnly = true
		_, err = Run(context.Background(), target, sanitize.Choose(sanitize.Erase, target.Device), nil)
		require.ErrorContains(t, err, "read-only, so what it holds cannot be erased")
	})
	t.Run("not a disk", func(t *testing.T) {
		_, err := Probe(Options{}, "/dev/null", false)
		require.ErrorContains(t, err, "is not a block device")
		_, err = Probe(Options{}, filepath.Join(t.TempDir(), "nope"), false)
		require.True(t, strings.Contains(err.Error(), "no such file"), err)
	})
}

func TestParseNVMeNamespace(t *testing.T) {
	ns := func(nlbaf, flbas, dps byte) []byte {
		b := make([]byte, nvmeIdentifySize)
		b[25], b[26], b[29] = nlbaf, flbas, dps
		return b
	}
	for name, tc := range map[string]struct {
		id    []byte
		want  nvmeNamespace
		cdw10 uint32 // with the user-data erase
		err   string
	}{
		"first format, no metadata":   {ns(0, 0, 0), nvmeNamespace{}, 1 << 9, ""},
		"4 KiB format of two":         {ns(1, 1, 0), nvmeNamespace{lbaf: 1}, 1 | 1<<9, ""},
		"extended metadata, PI 1":     {ns(4, 3|1<<4, 1|1<<3), nvmeNamespace{lbaf: 3, extended: true, pi: 1, piFirst: true}, 3 | 1<<4 | 1<<5 | 1<<8 | 1<<9, ""},
		"format 17 of 20 (high bits)": {ns(19, 1|1<<5, 0), nvmeNamespace{lbaf: 17}, 1 | 1<<9 | 1<<12, ""},
		"a format it does not list":   {ns(0, 2, 0), nvmeNamespace{}, 0, "LBA format 2 in use, but only 1 listed"},
		"a protection type not known": {ns(0, 0, 5), nvmeNamespace{}, 0, "protection information type 5"},
		"short":                       {make([]byte, 100), nvmeNamespace{}, 0, "too short"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseNVMeNamespace(tc.id)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.cdw10, got.formatCDW10(sesUserData), "%#x", got.formatCDW10(sesUserData))
		})
	}
}

// Format NVM with the user-data erase: the standard leaves what the blocks
// read afterwards open, so the check is that random data written just
// before no longer reads back, that the previous tenant's data read just
// before at other places has changed, and, where the erased blocks read as
// one repeated byte, that every block does.
func TestNVMeFormat(t *testing.T) {
	// Large enough for the sampled places not to cover all of it.
	const size = 32<<20 + 4096
	fill := func(b byte) func(*os.File, uint32) error {
		return func(f *os.File, ses uint32) error {
			if ses != sesUserData {
				return errors.New("not a user-data erase")
			}
			buf := bytes.Repeat([]byte{b}, 1<<20)
			for off := int64(0); off < size; off += int64(len(buf)) {
				n := min(int64(len(buf)), size-off)
				if _, err := f.WriteAt(buf[:n], off); err != nil {
					return err
				}
			}
			return nil
		}
	}
	run := func(t *testing.T, d fakeDrive) (string, agentwire.DiskSanitization, []int64, error) {
		path, _ := disk(t, size)
		target, err := Probe(Options{Drive: d}, path, false)
		require.NoError(t, err)
		target.Device.NVMeFormatUserData = true
		plan := sanitize.Force(sanitize.Erase, target.Device, sanitize.NVMeFormatUserData)
		require.Equal(t, sanitize.NVMeFormatUserData, plan.Method, plan.Why)
		var seen []int64
		ev, err := Run(context.Background(), target, plan, func(done, total int64) {
			require.Equal(t, int64(size), total)
			seen = append(seen, done)
		})
		return path, ev, seen, err
	}
	t.Run("zeros", func(t *testing.T) {
		path, ev, seen, err := run(t, fakeDrive{format: fill(0)})
		require.NoError(t, err)
		require.Equal(t, []int64{0, size}, seen, "a format shorter than a poll reports its start and end")
		require.Equal(t, string(sanitize.ReadsChanged), ev.Verification)
		require.Equal(t, int64(size), ev.Bytes)
		require.Regexp(t, `^random data written just before the erase to \d+ places \(the first and last MiB, sampled 64 KiB blocks\) no longer reads back in any 512-byte block, `+
			`and none of \d+ blocks of 512 bytes that held data at \d+ other sampled places reads back as before; every block read, and 128 64 KiB blocks at random places chosen after the erase, reads as 0x00 \(read `, ev.Checked)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, make([]byte, size), got)
	})
	t.Run("the maker's pattern", func(t *testing.T) {
		_, ev, _, err := run(t, fakeDrive{format: fill(0xff)})
		require.NoError(t, err)
		require.Contains(t, ev.Checked, "chosen after the erase, reads as 0xff (")
	})
	t.Run("noise", func(t *testing.T) {
		_, ev, _, err := run(t, fakeDrive{format: func(f *os.File, _ uint32) error {
			b := make([]byte, size)
			_, _ = rand.NewChaCha8([32]byte{9}).Read(b)
			_, err := f.WriteAt(b, 0)
			return err
		}})
		require.NoError(t, err)
		require.Contains(t, ev.Checked, "; the erased blocks read as noise, so the others were checked for change only (")
	})
	t.Run("a drive that did nothing", func(t *testing.T) {
		_, _, _, err := run(t, fakeDrive{format: func(*os.File, uint32) error { return nil }})
		require.ErrorContains(t, err, "verify nvme-format-user-data: the 512 bytes at 0 still hold the random data written there just before the erase")
	})
	t.Run("a drive that skipped one block", func(t *testing.T) {
		_, _, _, err := run(t, fakeDrive{format: func(f *os.File, ses uint32) error {
			keep := make([]byte, 512)
			if _, err := f.ReadAt(keep, size-1024); err != nil {
				return err
			}
			if err := fill(0)(f, ses); err != nil {
				return err
			}
			_, err := f.WriteAt(keep, size-1024)
			return err
		}})
		require.ErrorContains(t, err, fmt.Sprintf("the 512 bytes at %d still hold the random data", size-1024))
	})
	// byBlock plays a drive that treats each 512-byte block by whether it
	// changed since the disk was made (the agent's random data) or not.
	byBlock := func(changed, unchanged func(block []byte)) func(*os.File, uint32) error {
		_, original := disk(t, size) // the same bytes as the disk run writes
		return func(f *os.File, _ uint32) error {
			b := make([]byte, size)
			if _, err := f.ReadAt(b, 0); err != nil {
				return err
			}
			for i := 0; i < size; i += 512 {
				if bytes.Equal(b[i:i+512], original[i:i+512]) {
					unchanged(b[i : i+512])
				} else {
					changed(b[i : i+512])
				}
			}
			_, err := f.WriteAt(b, 0)
			return err
		}
	}
	t.Run("a drive that erased only what was just written", func(t *testing.T) {
		_, _, _, err := run(t, fakeDrive{format: byBlock(func(b []byte) { clear(b) }, func([]byte) {})})
		require.ErrorContains(t, err, "read back as they did before the erase")
	})
	t.Run("zeros where it was just written, noise elsewhere", func(t *testing.T) {
		// A drive that zeroes what it wrote last and turns the rest into
		// something else (re-keyed, but the old media is still there):
		// every block changed, yet not to what the erase shows where the
		// agent looked first.
		noise := rand.NewChaCha8([32]byte{7})
		_, _, _, err := run(t, fakeDrive{format: byBlock(func(b []byte) { clear(b) }, func(b []byte) { _, _ = noise.Read(b) })})
		require.ErrorContains(t, err, "do not read as 0x00, as every erased block the agent wrote before does")
	})
	t.Run("a drive that erased only what it was asked about", func(t *testing.T) {
		path, _ := disk(t, size)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		c, err := prepareChangeCheck(f, size)
		require.NoError(t, err)
		for _, x := range append(c.canaries, c.witnesses...) {
			_, err := f.WriteAt(make([]byte, len(x.data)), x.offset)
			require.NoError(t, err)
		}
		_, err = c.verify(f, size)
		require.ErrorContains(t, err, "do not read as 0x00, as every erased block the agent wrote before does", "the blocks read after the erase were never asked about")
	})
	t.Run("progress while the drive formats", func(t *testing.T) {
		defer func(p time.Duration) { formatPoll = p }(formatPoll)
		formatPoll = 10 * time.Millisecond
		_, _, seen, err := run(t, fakeDrive{progress: 0.5, format: func(f *os.File, ses uint32) error {
			time.Sleep(100 * time.Millisecond)
			return fill(0)(f, ses)
		}})
		require.NoError(t, err)
		require.Contains(t, seen, int64(size/2), "the drive's own estimate")
		require.Equal(t, int64(size), seen[len(seen)-1])
	})
	t.Run("a drive without the indicator is left alone while it formats", func(t *testing.T) {
		defer func(p time.Duration) { formatPoll = p }(formatPoll)
		formatPoll = 10 * time.Millisecond
		var polls atomic.Int32
		_, _, seen, err := run(t, fakeDrive{polls: &polls, format: func(f *os.File, ses uint32) error {
			time.Sleep(100 * time.Millisecond)
			return fill(0)(f, ses)
		}})
		require.NoError(t, err)
		require.Equal(t, int32(1), polls.Load(), "asked once, before the format")
		require.Greater(t, len(seen), 3, "still reported, which keeps the host connected")
	})
	t.Run("the controller refuses", func(t *testing.T) {
		_, _, _, err := run(t, fakeDrive{format: func(*os.File, uint32) error { return nvmeStatus(0x4002) }})
		require.ErrorContains(t, err, "nvme-format-user-data: the controller answered status 0x4002 (type 0, code 0x02, do not retry)")
	})
	t.Run("a namespace of another size after it", func(t *testing.T) {
		_, _, _, err := run(t, fakeDrive{format: func(f *os.File, _ uint32) error { return f.Truncate(size / 2) }})
		require.ErrorContains(t, err, fmt.Sprintf("the namespace is %d bytes after the format, %d before", size/2, size))
	})
}

func TestNVMeStatus(t *testing.T) {
	require.NoError(t, nvmeStatus(0))
	require.EqualError(t, nvmeStatus(0x0002), "the controller answered status 0x2 (type 0, code 0x02)")
	require.EqualError(t, nvmeStatus(0x4181), "the controller answered status 0x4181 (type 1, code 0x81, do not retry)")
	require.EqualError(t, nvmeStatus(0x371), "the controller answered status 0x371 (type 3, code 0x71)")
}

func TestFormatProgress(t *testing.T) {
	id := make([]byte, nvmeIdentifySize)
	_, ok := parseFormatProgress(id)
	require.False(t, ok, "bit 7 clear: the drive keeps no indicator")
	id[32] = 0x80 | 25
	frac, ok := parseFormatProgress(id)
	require.True(t, ok)
	require.InDelta(t, 0.75, frac, 1e-9, "25% remains")
	_, ok = parseFormatProgress(id[:64])
	require.False(t, ok)
}

// The places the format's check writes random data to always include the
// first and last MiB; no place writes over another or over a place read
// before; every place is aligned; what was read is what the disk held.
func TestChangeCheckPlaces(t *testing.T) {
	for _, size := range []int64{64 << 20, 32<<20 + 512, 2<<20 + 512, 1 << 20, 64 << 10} {
		path, data := disk(t, size)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		for range 5 {
			c, err := prepareChangeCheck(f, size)
			require.NoError(t, err)
			require.Equal(t, int64(0), c.canaries[0].offset)
			require.Len(t, c.canaries[0].data, int(min(edge, size)))
			if size > edge {
				require.Equal(t, size-edge, c.canaries[1].offset, "size %d", size)
			}
			if size >= 32<<20 {
				require.Greater(t, len(c.witnesses), sampleCount/4, "size %d", size)
			}
			all := slices.Clone(append(c.canaries, c.witnesses...))
			slices.SortFunc(all, func(a, b canary) int { return cmp.Compare(a.offset, b.offset) })
			for i, x := range all {
				require.Zero(t, x.offset%c.align, "size %d: offset %d", size, x.offset)
				require.Zero(t, int64(len(x.data))%c.align)
				require.LessOrEqual(t, x.offset+int64(len(x.data)), size)
				if i > 0 {
					prev := all[i-1]
					require.LessOrEqual(t, prev.offset+int64(len(prev.data)), x.offset, "size %d: places overlap", size)
				}
			}
			for _, w := range c.witnesses {
				require.Equal(t, data[w.offset:w.offset+int64(len(w.data))], w.data, "a witness is what the disk held")
			}
			for _, x := range c.canaries {
				copy(data[x.offset:], x.data) // the next round reads them
			}
		}
		require.NoError(t, f.Close())
	}
}
