package sanitize

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/agentboot/agentboot/internal/clip"
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

// Disks to keep, as an administrator lists them (docs/security.md).
const (
	maxKeep      = 64
	maxKeepEntry = 256
)

// ParseKeep reads a comma-separated list of disks never to erase: by-id or
// by-path links, serial numbers or WWNs. Kernel names (/dev/sdb, /dev/nvme0n1)
// are refused: they can name another disk at the next boot.
func ParseKeep(v string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case len(e) > maxKeepEntry:
			return nil, fmt.Errorf("an entry is %d bytes long, more than %d", len(e), maxKeepEntry)
		case strings.ContainsFunc(e, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
			return nil, fmt.Errorf("entry %q holds a space or a control character", e)
		case strings.HasPrefix(e, "/dev/") && !strings.HasPrefix(e, "/dev/disk/by-id/") && !strings.HasPrefix(e, "/dev/disk/by-path/"):
			return nil, fmt.Errorf("entry %q: kernel names can name another disk at the next boot; use a /dev/disk/by-id or by-path link, a serial number or a WWN", e)
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(out) > maxKeep {
		return nil, fmt.Errorf("%d disks, more than %d", len(out), maxKeep)
	}
	return out, nil
}

// KeepAnnotation is the BareMetalHost annotation that lists its disks to
// keep (ParseKeep); an administrator writes it, the BareMetalHost
// controller copies it to the host's Agent (KeepRecord), and the agent API
// holds a sanitization while the copy differs.
const KeepAnnotation = "agentboot.io/sanitize-keep"

// KeepRecord is what the Agent records of a keep annotation: its disks,
// or, when it does not parse, the annotation as written (clipped), which
// names no disk and so holds every erase until it is corrected.
func KeepRecord(raw string) ([]string, error) {
	keep, err := ParseKeep(raw)
	if err != nil {
		return []string{clip.Text(raw, maxKeepEntry)}, err
	}
	return keep, nil
}
