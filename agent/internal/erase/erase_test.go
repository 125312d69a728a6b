package erase

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

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
	for name, tc := range map[string]struct {
		id   []byte
		want nvmeController
	}{
		"nothing":                     {ctrl(0, 0, 0), nvmeController{}},
		"format without crypto":       {ctrl(1<<1, 0, 0), nvmeController{formatNVM: true}},
		"format with crypto":          {ctrl(1<<1, 1<<2, 0), nvmeController{formatNVM: true, formatCrypto: true}},
		"FNA crypto without Format":   {ctrl(0, 1<<2, 0), nvmeController{}},
		"sanitize crypto and block":   {ctrl(0, 0, 0b011), nvmeController{sanitizeCrypto: true, sanitizeBlock: true}},
		"sanitize overwrite only":     {ctrl(0, 0, 0b100), nvmeController{sanitizeOver: true}},
		"NODMMAS bits are not a verb": {ctrl(0, 0, 0xc000_0000), nvmeController{}},
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

type fakeIdentify struct {
	ctrl, ata []byte
	err       error
}

func (f fakeIdentify) NVMe(string) ([]byte, error) { return f.ctrl, f.err }
func (f fakeIdentify) ATA(string) ([]byte, error)  { return f.ata, f.err }

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
		o := Options{Root: root, Identify: fakeIdentify{ctrl: nvmeCtrl}}
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
	t.Run("sata, frozen", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Identify: fakeIdentify{ata: ata}}, Target{Path: "/dev/sda"}, "sda", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{ATASecurityErase: true, ATAFrozen: true}, got.Device)
	})
	t.Run("ISO content on a fixed disk is data", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("inappropriate ioctl for device")}}, Target{Path: "/dev/sda"}, "sda", true)
		require.NoError(t, err)
		require.Equal(t, sanitize.Device{}, got.Device, "the previous tenant could have written CD001 there")
		require.Equal(t, []string{"no ATA IDENTIFY: inappropriate ioctl for device"}, got.Notes)
	})
	t.Run("ISO on a read-only removable device is the boot medium", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("no")}}, Target{Path: "/dev/sdd"}, "sdd", true)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium)
		got, err = probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("no")}}, Target{Path: "/dev/sdf"}, "sdf", true)
		require.NoError(t, err)
		require.False(t, got.Device.BootMedium, "a writable USB stick holds what anyone wrote")
	})
	t.Run("no medium", func(t *testing.T) {
		fakeSys(t, root, "sdg", map[string]string{"size": "0", "removable": "1"})
		got, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sdg"}, "sdg", false)
		require.NoError(t, err)
		require.Equal(t, sanitize.Skip, sanitize.Choose(sanitize.Erase, got.Device).Method)
	})
	t.Run("optical drive", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sr0"}, "sr0", false)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium)
	})
	t.Run("mounted", func(t *testing.T) {
		got, err := probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("no")}}, Target{Path: "/dev/sdb"}, "sdb", false)
		require.NoError(t, err)
		require.True(t, got.Device.BootMedium, "sdb1 is mounted")
	})
	t.Run("held by RAID", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("no")}}, Target{Path: "/dev/sde"}, "sde", false)
		require.EqualError(t, err, "disk /dev/sde is in use by md127 (of sde2): not erased")
		kept, err := probeDevice(Options{Root: root, Identify: fakeIdentify{err: errors.New("no")}}, Target{Path: "/dev/sde", Device: sanitize.Device{Kept: true}}, "sde", false)
		require.NoError(t, err, "a disk to keep is never written: its RAID does not matter")
		require.Equal(t, sanitize.Skip, sanitize.Choose(sanitize.Erase, Supported(kept.Device)).Method)
	})
	t.Run("partition outside", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root, Identify: fakeIdentify{}}, Target{Path: "/dev/sdc"}, "sdc", false)
		require.ErrorContains(t, err, "lies outside the disk")
	})
	t.Run("no sysfs", func(t *testing.T) {
		_, err := probeDevice(Options{Root: root}, Target{Path: "/dev/sdz1"}, "sdz1", false)
		require.ErrorContains(t, err, "a partition or not a disk")
	})
}

// disk is a file full of random bytes, standing in for a disk.
func disk(t *testing.T, size int64) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.UintN(255) + 1) // never zero: every byte left shows
	}
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
