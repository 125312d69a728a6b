package sanitize

import (
	"fmt"
	"strings"
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

func TestParseKeep(t *testing.T) {
	got, err := ParseKeep(" /dev/disk/by-id/wwn-0x5000c500a1b2c3d4 ,ZA1B2C3D,,ZA1B2C3D, /dev/disk/by-path/pci-0000:00:1f.2-ata-2")
	require.NoError(t, err)
	require.Equal(t, []string{"/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "ZA1B2C3D", "/dev/disk/by-path/pci-0000:00:1f.2-ata-2"}, got)
	got, err = ParseKeep("")
	require.NoError(t, err)
	require.Empty(t, got)
	for in, want := range map[string]string{
		"/dev/sdb":               "kernel names can name another disk at the next boot",
		"/dev/nvme0n1,ZA1":       "kernel names",
		"ZA1 ZA2":                "holds a space",
		"ZA1\x00":                "control character",
		strings.Repeat("x", 300): "more than 256",
	} {
		_, err := ParseKeep(in)
		if want == "" {
			continue
		}
		require.ErrorContains(t, err, want, "%q", in)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("SERIAL%d", i)
	}
	_, err = ParseKeep(strings.Join(many, ","))
	require.ErrorContains(t, err, "65 disks, more than 64")
	rec, err := KeepRecord("/dev/sdb")
	require.Error(t, err)
	require.Equal(t, []string{"/dev/sdb"}, rec, "an invalid list is recorded as written: it names no disk, so it holds the erase")
	require.Equal(t, "erase", Stronger("metadata", "erase"))
	require.Equal(t, "erase", Stronger("erase", "metadata"))
	require.Equal(t, "metadata", Stronger("", "metadata"))
}
