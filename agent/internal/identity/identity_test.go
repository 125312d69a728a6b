package identity

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
)

func fakeHost(t *testing.T, uuid, serial string, macs map[string]string) string {
	root := t.TempDir()
	dmi := filepath.Join(root, "sys/class/dmi/id")
	require.NoError(t, os.MkdirAll(dmi, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte(uuid+"\n"), 0o444))
	require.NoError(t, os.WriteFile(filepath.Join(dmi, "product_serial"), []byte(serial+"\n"), 0o444))
	for name, mac := range macs {
		dir := filepath.Join(root, "sys/class/net", name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "device"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "address"), []byte(mac+"\n"), 0o444))
	}
	// A virtual interface without a device does not count.
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/class/net/br0"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sys/class/net/br0/address"), []byte("02:00:00:00:00:99\n"), 0o444))
	return root
}

func TestIdentity(t *testing.T) {
	a := Read(fakeHost(t, "2B0D6A31-7C1E-4A9B-9D3E-5F8A2C4E6B10", "ABC123", map[string]string{"eth0": "52:54:00:00:00:02", "eth1": "52:54:00:00:00:01"}))
	require.Equal(t, agentwire.HostIdentity{SystemUUID: "2b0d6a31-7c1e-4a9b-9d3e-5f8a2c4e6b10", SerialNumber: "ABC123", MACAddresses: []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}}, a)
	require.Equal(t, "2b0d6a31-7c1e-4a9b-9d3e-5f8a2c4e6b10", Primary(a), "a real UUID is the host ID")

	// Same UUID, other NICs: another derived ID; the same host again: the same.
	b := Read(fakeHost(t, "2b0d6a31-7c1e-4a9b-9d3e-5f8a2c4e6b10", "ABC123", map[string]string{"eth0": "52:54:00:00:00:03"}))
	require.NotEqual(t, Derived(a), Derived(b))
	require.Equal(t, Derived(a), Derived(Read(fakeHost(t, "2b0d6a31-7c1e-4a9b-9d3e-5f8a2c4e6b10", "ABC123", map[string]string{"eth1": "52:54:00:00:00:01", "eth0": "52:54:00:00:00:02"}))))
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, Derived(a))

	// Placeholders are not identities: the MACs tell the hosts apart.
	for _, placeholder := range []struct{ uuid, serial string }{
		{"00000000-0000-0000-0000-000000000000", "To be filled by O.E.M."},
		{"FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "Default string"},
		{"03000200-0400-0500-0006-000700080009", "System Serial Number"},
		{"not-a-uuid", "0"},
	} {
		x := Read(fakeHost(t, placeholder.uuid, placeholder.serial, map[string]string{"eth0": "52:54:00:00:00:0a"}))
		y := Read(fakeHost(t, placeholder.uuid, placeholder.serial, map[string]string{"eth0": "52:54:00:00:00:0b"}))
		require.Empty(t, x.SystemUUID, placeholder.uuid)
		require.Empty(t, x.SerialNumber, placeholder.serial)
		require.NotEqual(t, Primary(x), Primary(y), "two hosts with %s are two hosts", placeholder.uuid)
		require.Equal(t, Derived(x), Primary(x))
	}
}
