package inventory

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentapi"
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
		got := Hostname(Options{Root: root}, []agentapi.Interface{
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
