package discovery

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/coreos/go-semver/semver"
	"github.com/coreos/ignition/v2/config/v3_2"
	"github.com/coreos/ignition/v2/config/v3_3"
	"github.com/coreos/ignition/v2/config/v3_4"
	"github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/vcontext/report"
)

// MergeOverride merges an Ignition config a user wrote (field names it in
// errors: the InfraEnv's ignitionConfigOverride, an Agent's
// ignitionConfigOverrides) into a base config agentboot rendered. The
// result has the override's spec version when it is newer than the base's
// (3.2.0), so an override can use newer Ignition features; both are parsed,
// translated and merged with Ignition's own code for that version. Problems
// with the override are InputErrors.
func MergeOverride(field string, base, override []byte) ([]byte, error) {
	if len(override) > maxOverrideBytes {
		return nil, inputErrorf("%s is %d bytes, more than %d", field, len(override), maxOverrideBytes)
	}
	var head struct {
		Ignition struct {
			Version string `json:"version"`
		} `json:"ignition"`
	}
	if err := json.Unmarshal(override, &head); err != nil {
		return nil, inputErrorf("%s is not valid JSON: %v", field, err)
	}
	v, err := semver.NewVersion(head.Ignition.Version)
	if err != nil {
		return nil, inputErrorf("%s: ignition.version %q is not a version", field, head.Ignition.Version)
	}
	if v.PreRelease != "" {
		return nil, inputErrorf("%s: experimental Ignition version %s is not accepted", field, v)
	}
	switch {
	case v.Major != 3 || v.Minor > 5:
		return nil, inputErrorf("%s: Ignition spec version %s is not supported (3.0.0 to 3.5.0)", field, v)
	case v.Minor <= 2:
		return merge(field, v3_2.ParseCompatibleVersion, v3_2.Merge, base, override)
	case v.Minor == 3:
		return merge(field, v3_3.ParseCompatibleVersion, v3_3.Merge, base, override)
	case v.Minor == 4:
		return merge(field, v3_4.ParseCompatibleVersion, v3_4.Merge, base, override)
	default:
		return merge(field, v3_5.ParseCompatibleVersion, v3_5.Merge, base, override)
	}
}

func merge[C any](field string, parse func([]byte) (C, report.Report, error), mergeFn func(C, C) C, base, override []byte) ([]byte, error) {
	b, rpt, err := parse(base)
	if err != nil {
		return nil, fmt.Errorf("the base Ignition config does not parse (a bug): %v: %s", err, rpt.String())
	}
	o, rpt, err := parse(override)
	if err != nil {
		return nil, inputErrorf("%s is not a valid Ignition config: %v%s", field, err, reportText(rpt))
	}
	// Ignition boots despite warnings such as an unused key, which is
	// almost always a typo that would silently do nothing: refuse it.
	for _, e := range rpt.Entries {
		if e.Kind == report.Warn {
			return nil, inputErrorf("%s is not a valid Ignition config: %s", field, strings.TrimSpace(rpt.String()))
		}
	}
	merged, err := json.Marshal(mergeFn(b, o))
	if err != nil {
		return nil, err
	}
	// Parsing validates the merged config as a whole.
	if _, rpt, err := parse(merged); err != nil {
		return nil, inputErrorf("%s conflicts with the Ignition config agentboot renders: %v%s", field, err, reportText(rpt))
	}
	return merged, nil
}

func reportText(r report.Report) string {
	if s := r.String(); s != "" {
		return ": " + s
	}
	return ""
}
