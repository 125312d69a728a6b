package sanitize

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPolicy(t *testing.T) {
	levels, err := ParseInfraEnvLevels([]string{"lab/pool=metadata", "scratch/ci=none", "lab/pool=metadata"})
	require.NoError(t, err)
	p := Policy{Default: Erase, PerInfraEnv: levels}
	require.Equal(t, Metadata, p.For("lab", "pool"))
	require.Equal(t, None, p.For("scratch", "ci"))
	require.Equal(t, Erase, p.For("lab", "other"))
	require.Equal(t, Erase, Policy{}.For("lab", "pool"), "no policy is the default: erase")
	require.Equal(t, "erase (default), lab/pool=metadata, scratch/ci=none", p.String())

	for setting, want := range map[string]string{
		"lab/pool":               "want namespace/infraenv=level",
		"pool=erase":             "want namespace/infraenv=level",
		"lab/=erase":             "want namespace/infraenv=level",
		"lab/pool/x=erase":       "want namespace/infraenv=level",
		"lab/pool=":              "want namespace/infraenv=level",
		"lab/pool=shred":         `level "shred": want none, metadata or erase`,
		"lab/pool=none,x/y=none": `level "none,x/y=none"`,
	} {
		_, err := ParseInfraEnvLevels([]string{setting})
		require.ErrorContains(t, err, want, setting)
	}
	_, err = ParseInfraEnvLevels([]string{"lab/pool=erase", "lab/pool=none"})
	require.ErrorContains(t, err, "InfraEnv lab/pool is already set to erase")
}
