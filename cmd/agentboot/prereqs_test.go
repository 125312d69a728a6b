package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/testenv"
)

// make run and make test start with hack/prereqs.sh: a missing Debian
// package stops them at once with the command to paste, before any build.
func TestPrereqsSayWhatIsMissing(t *testing.T) {
	list := filepath.Join(t.TempDir(), "packages")
	require.NoError(t, os.WriteFile(list, []byte("# a comment\ncpio\nagentboot-no-such-package\n"), 0o644))
	cmd := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "prereqs.sh"))
	cmd.Env = append(os.Environ(), "PREREQS_PACKAGES="+list, "PREREQS_NO_INSTALL=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "missing Debian packages: agentboot-no-such-package\n")
	require.Contains(t, string(out), "sudo apt-get install -y agentboot-no-such-package\n")
	require.NotContains(t, strings.SplitN(string(out), "\n", 2)[0], "cpio", "installed packages are not named")

	ok := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "prereqs.sh"))
	ok.Env = append(os.Environ(), "PREREQS_NO_INSTALL=1")
	out, err = ok.CombinedOutput()
	require.NoError(t, err, "this machine has what .ci/packages lists: %s", out)
}
