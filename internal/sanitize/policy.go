package sanitize

import (
	"fmt"
	"sort"
	"strings"
)

// Policy is the sanitization level hosts owe when they leave a cluster, set
// in the manager's configuration, which only the cluster's administrators
// write: never on an Agent or an InfraEnv, which tenants write.
type Policy struct {
	// Default applies to every InfraEnv not in PerInfraEnv.
	Default Level
	// PerInfraEnv maps "namespace/name" of an InfraEnv to its level.
	PerInfraEnv map[string]Level
}

// DefaultPolicy erases every disk of every released host.
var DefaultPolicy = Policy{Default: Erase}

// For is the level of hosts of InfraEnv namespace/name.
func (p Policy) For(namespace, name string) Level {
	if l, ok := p.PerInfraEnv[namespace+"/"+name]; ok {
		return l
	}
	if p.Default == "" {
		return Erase
	}
	return p.Default
}

// ParseInfraEnvLevels reads "namespace/name=level" settings, as the
// manager's --disk-sanitization-infraenv flag takes them.
func ParseInfraEnvLevels(settings []string) (map[string]Level, error) {
	out := map[string]Level{}
	for _, s := range settings {
		key, value, ok := strings.Cut(s, "=")
		ns, name, hasSlash := strings.Cut(key, "/")
		if !ok || !hasSlash || ns == "" || name == "" || strings.Contains(name, "/") || value == "" {
			return nil, fmt.Errorf("disk sanitization setting %q: want namespace/infraenv=level", s)
		}
		l, err := ParseLevel(value)
		if err != nil {
			return nil, fmt.Errorf("disk sanitization setting %q: %w", s, err)
		}
		if prev, dup := out[key]; dup && prev != l {
			return nil, fmt.Errorf("disk sanitization setting %q: InfraEnv %s is already set to %s", s, key, prev)
		}
		out[key] = l
	}
	return out, nil
}

// String lists the policy for logs: "erase (default), lab/pool=metadata".
func (p Policy) String() string {
	parts := []string{string(p.For("", "")) + " (default)"}
	keys := make([]string, 0, len(p.PerInfraEnv))
	for k := range p.PerInfraEnv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k+"="+string(p.PerInfraEnv[k]))
	}
	return strings.Join(parts, ", ")
}
