package inventory

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
)

func writeDisk(t *testing.T, b []byte) string {
	p := filepath.Join(t.TempDir(), "disk")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestBootable(t *testing.T) {
	empty := make([]byte, 64<<10)
	p := writeDisk(t, empty)
	require.False(t, bootable(p, readHead(p)))

	mbr := make([]byte, 64<<10)
	mbr[510], mbr[511] = 0x55, 0xAA
	mbr[446] = 0x80 // first partition active
	p = writeDisk(t, mbr)
	require.True(t, bootable(p, readHead(p)))

	gpt := make([]byte, 64<<10)
	gpt[510], gpt[511] = 0x55, 0xAA
	gpt[446+4] = 0xEE // protective MBR
	copy(gpt[512:], "EFI PART")
	binary.LittleEndian.PutUint64(gpt[512+72:], 2)   // entries at LBA 2
	binary.LittleEndian.PutUint32(gpt[512+80:], 4)   // four entries
	binary.LittleEndian.PutUint32(gpt[512+84:], 128) // of 128 bytes
	p = writeDisk(t, gpt)
	require.False(t, bootable(p, readHead(p)), "a GPT without an EFI system partition")
	copy(gpt[1024+128:], guid("C12A7328-F81F-11D2-BA4B-00A0C93EC93B"))
	p = writeDisk(t, gpt)
	require.True(t, bootable(p, readHead(p)))
	// The ESP's type GUID in its on-disk (mixed-endian) form.
	require.Equal(t, []byte{0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9, 0x3b}, guid("C12A7328-F81F-11D2-BA4B-00A0C93EC93B"))
}

func TestHostnameAndBootInterface(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc/sys/kernel"), 0o755))
	for name, want := range map[string]string{
		"localhost":             "host-52-54-00-00-00-02",
		"localhost.localdomain": "host-52-54-00-00-00-02",
		"(none)":                "host-52-54-00-00-00-02",
		"Worker-7":              "worker-7",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(root, "proc/sys/kernel/hostname"), []byte(name+"\n"), 0o644))
		got := Hostname(Options{Root: root}, []agentwire.Interface{
			{MacAddress: "52:54:00:00:00:01"},
			{MacAddress: "52:54:00:00:00:02", HasCarrier: true, IPV4Addresses: []string{"198.18.0.5/24"}},
		})
		require.Equal(t, want, got, name)
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("initrd=initrd BOOTIF=01-52-54-00-AB-CD-EF console=ttyS0\n"), 0o644))
	require.Equal(t, "52:54:00:ab:cd:ef", BootInterface(Options{Root: root}))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("BOOTIF=01-${netX/mac:hexhyp}\n"), 0o644))
	require.Empty(t, BootInterface(Options{Root: root}), "an unexpanded iPXE variable is no MAC")
}

func TestParseIPMI(t *testing.T) {
	out := "Set in Progress         : Set Complete\nIP Address Source       : DHCP Address\nIP Address              : 198.18.0.50\nSubnet Mask             : 255.255.255.0\n"
	require.Equal(t, "198.18.0.50", parseIPMI(out, "IP Address"))
	require.Empty(t, parseIPMI("IP Address              : 0.0.0.0\n", "IP Address"))
}

func TestArmCPUName(t *testing.T) {
	for _, tc := range []struct{ impl, part, want string }{
		{"0x41", "0xd0c", "Neoverse-N1"},
		{"0x41", "0xd4f", "Neoverse-V2"},
		{"0xc0", "0xac3", "AmpereOne"},
		{"0x48", "0xd01", "HiSilicon Kunpeng 920"},
		{"0x4e", "0x004", "NVIDIA CPU part 0x004"},
		{"0x00", "0x051", "software-defined Arm CPU part 0x051"},
		{"0x99", "0x001", "Arm implementer 0x99 CPU part 0x001"},
		{"zz", "0x001", ""},
	} {
		require.Equal(t, tc.want, ArmCPUName(tc.impl, tc.part), tc.impl+"/"+tc.part)
	}
}

// What an Arm server shows: cpuinfo without "model name", a device tree
// where there is no SMBIOS.
func TestArmInventory(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(s), 0o644))
	}
	cpuinfo := ""
	for i := range 4 {
		cpuinfo += "processor\t: " + string(rune('0'+i)) + "\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n" +
			"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
	}
	write("proc/cpuinfo", cpuinfo)
	c := collectCPU(Options{Root: root})
	require.Equal(t, "Neoverse-N1", c.ModelName)
	require.Contains(t, c.Flags, "asimd")

	// No implementer line (some kernels): MIDR_EL1 from sysfs.
	write("proc/cpuinfo", "processor\t: 0\nFeatures\t: fp asimd\n")
	write("sys/devices/system/cpu/cpu0/regs/identification/midr_el1", "0x00000000c00fac30\n")
	require.Equal(t, "AmpereOne", collectCPU(Options{Root: root}).ModelName)

	write("sys/firmware/devicetree/base/model", "Raspberry Pi 4 Model B Rev 1.4\x00")
	write("sys/firmware/devicetree/base/compatible", "raspberrypi,4-model-b\x00brcm,bcm2711\x00")
	write("sys/firmware/devicetree/base/serial-number", "10000000deadbeef\x00")
	v := collectVendor(Options{Root: root})
	require.Equal(t, "Raspberry Pi 4 Model B Rev 1.4", v.ProductName)
	require.Equal(t, "raspberrypi", v.Manufacturer)
	require.Equal(t, "10000000deadbeef", v.SerialNumber)
	require.False(t, v.Virtual)
	write("sys/firmware/devicetree/base/hypervisor/compatible", "xen,xen\x00")
	require.True(t, collectVendor(Options{Root: root}).Virtual)
}
