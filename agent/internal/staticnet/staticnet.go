// Package staticnet picks, among the NMStateConfigs a discovery image
// carries, the one meant for this host (every MAC address it names is on the
// host), replaces its logical interface names with the host's, and writes it
// where NetworkManager's nmstate service applies it at boot.
package staticnet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// HostMACs maps the host's MAC addresses (lower case) to interface names.
func HostMACs(root string) map[string]string {
	out := map[string]string{}
	entries, _ := os.ReadDir(filepath.Join(root, "sys/class/net"))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(root, "sys/class/net", e.Name(), "address"))
		if err != nil {
			continue
		}
		out[strings.ToLower(strings.TrimSpace(string(raw)))] = e.Name()
	}
	return out
}

// Select returns the first config whose MACs are all on the host, with its
// names mapped to the host's, or nil when none is for this host.
func Select(nets []agentwire.StaticNetwork, macs map[string]string) (*agentwire.StaticNetwork, map[string]string) {
	for i := range nets {
		rename := map[string]string{}
		all := len(nets[i].Interfaces) > 0
		for _, iface := range nets[i].Interfaces {
			name, ok := macs[strings.ToLower(iface.MACAddress)]
			if !ok {
				all = false
				break
			}
			rename[iface.Name] = name
		}
		if all {
			return &nets[i], rename
		}
	}
	return nil, nil
}

// Rename replaces every string equal to a logical interface name (interface
// names, route next hops, bond ports, VLAN base interfaces) with the host's.
func Rename(v any, rename map[string]string) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = Rename(x, rename)
		}
		return t
	case []any:
		for i, x := range t {
			t[i] = Rename(x, rename)
		}
		return t
	case string:
		if n, ok := rename[t]; ok {
			return n
		}
	}
	return v
}

// Apply reads the configs at configPath and writes this host's to outDir.
// It returns what it did, for the log.
func Apply(root, configPath, outDir string) (string, error) {
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return "", err
	}
	var nets []agentwire.StaticNetwork
	if err := json.Unmarshal(raw, &nets); err != nil {
		return "", fmt.Errorf("%s: %w", configPath, err)
	}
	chosen, rename := Select(nets, HostMACs(root))
	if chosen == nil {
		return fmt.Sprintf("none of the %d static network configs names this host's MAC addresses: keeping DHCP", len(nets)), nil
	}
	state := Rename(map[string]any(chosen.State), rename)
	out, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	// nmstate reads YAML, of which JSON is a subset.
	dst := filepath.Join(outDir, "agentboot-"+chosen.Name+".yml")
	if err := os.WriteFile(dst, append(out, '\n'), 0o600); err != nil {
		return "", err
	}
	return fmt.Sprintf("wrote %s from NMStateConfig %s (%v)", dst, chosen.Name, rename), nil
}
