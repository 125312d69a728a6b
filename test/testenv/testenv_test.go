package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// A process's build directory survives while the process runs and is
// removed by the next process once it is gone.
func TestProcessTempDir(t *testing.T) {
	prefix := fmt.Sprintf("agentboot-ptd-test-%d-", os.Getpid())
	gone := filepath.Join(os.TempDir(), prefix+"2147483646") // no such process
	alive := filepath.Join(os.TempDir(), prefix+"1")         // init
	for _, d := range []string{gone, alive} {
		require.NoError(t, os.MkdirAll(d, 0o700))
	}
	t.Cleanup(func() { os.RemoveAll(alive) })
	dir, err := ProcessTempDir(prefix)
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.Equal(t, filepath.Join(os.TempDir(), prefix+strconv.Itoa(os.Getpid())), dir)
	require.DirExists(t, dir)
	require.NoDirExists(t, gone, "a gone process's directory is removed")
	require.DirExists(t, alive, "a running process's is kept")
	again, err := ProcessTempDir(prefix)
	require.NoError(t, err)
	require.Equal(t, dir, again)

	// One planted at the predictable path (here: open to all) is refused.
	planted := prefix + "planted-"
	p := filepath.Join(os.TempDir(), planted+strconv.Itoa(os.Getpid()))
	require.NoError(t, os.Mkdir(p, 0o700))
	require.NoError(t, os.Chmod(p, 0o777))
	t.Cleanup(func() { os.RemoveAll(p) })
	_, err = ProcessTempDir(planted)
	require.ErrorContains(t, err, "is not a directory of this user's")
}
