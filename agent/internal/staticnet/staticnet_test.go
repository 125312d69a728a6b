package staticnet

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/agentwire"
)

func fakeHost(t *testing.T, ifaces map[string]string) string {
	root := t.TempDir()
	for name, mac := range ifaces {
		dir := filepath.Join(root, "sys/class/net", name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "address"), []byte(mac+"\n"), 0o644))
	}
	return root
}

func TestApplyPicksThisHostsConfig(t *testing.T) {
	root := fakeHost(t, map[string]string{"enp1s0": "52:54:00:00:00:0b", "enp2s0": "52:54:00:00:00:0c"})
	nets := []agentwire.StaticNetwork{
		{Name: "host-a", Interfaces: []agentwire.StaticInterface{{Name: "eth0", MACAddress: "52:54:00:00:00:0a"}}, State: map[string]any{"interfaces": []any{map[string]any{"name": "eth0"}}}},
		{Name: "host-b", Interfaces: []agentwire.StaticInterface{{Name: "eth0", MACAddress: "52:54:00:00:00:0B"}, {Name: "eth1", MACAddress: "52:54:00:00:00:0c"}},
			State: map[string]any{
				"interfaces": []any{
					map[string]any{"name": "eth0", "type": "ethernet"},
					map[string]any{"name": "bond0", "type": "bond", "link-aggregation": map[string]any{"port": []any{"eth0", "eth1"}}},
				},
				"routes": map[string]any{"config": []any{map[string]any{"destination": "0.0.0.0/0", "next-hop-interface": "eth1"}}},
			}},
	}
	cfg := filepath.Join(t.TempDir(), "static-networks.json")
	raw, _ := json.Marshal(nets)
	require.NoError(t, os.WriteFile(cfg, raw, 0o600))
	out := t.TempDir()
	msg, err := Apply(root, cfg, out)
	require.NoError(t, err)
	require.Contains(t, msg, "host-b")
	got, err := os.ReadFile(filepath.Join(out, "agentboot-host-b.yml"))
	require.NoError(t, err)
	require.JSONEq(t, `{
		"interfaces": [
			{"name": "enp1s0", "type": "ethernet"},
			{"name": "bond0", "type": "bond", "link-aggregation": {"port": ["enp1s0", "enp2s0"]}}
		],
		"routes": {"config": [{"destination": "0.0.0.0/0", "next-hop-interface": "enp2s0"}]}
	}`, string(got))

	other := fakeHost(t, map[string]string{"eth9": "52:54:00:00:00:99"})
	msg, err = Apply(other, cfg, t.TempDir())
	require.NoError(t, err)
	require.Contains(t, msg, "keeping DHCP")
}
