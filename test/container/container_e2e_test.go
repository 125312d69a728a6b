//go:build e2e

package container

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/testenv"
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

// The image make image built runs as its manifests run it: as user 65532,
// its root file system read-only, the image cache an emptyDir volume. Its
// agentboot answers, and its own xorriso writes an ISO into the volume and
// nowhere else.
func TestImageRunsReadOnlyAsItsUser(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot(), "dist", "image")
	img, err := Image(dir, "amd64")
	require.NoError(t, err, "make e2e runs make image first")
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, Unpack(img, root))
	cache := t.TempDir()
	require.NoError(t, os.Chown(cache, 65532, 65532))

	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out bytes.Buffer
		cmd, err := Command(ctx, Spec{Root: root, Args: args, Env: cf.Config.Env, UID: 65532, GID: 65532,
			Mounts: []Mount{{Source: cache, Target: "/var/cache/agentboot"}}}, &out, &out)
		require.NoError(t, err)
		err = cmd.Run()
		return out.String(), err
	}
	out, err := run(cf.Config.Entrypoint[0], "version")
	require.NoError(t, err, out)
	require.Equal(t, cf.Config.Labels["org.opencontainers.image.version"], strings.TrimSpace(out), "the image's agentboot is the version it is labelled with")

	iso := []string{"/usr/bin/xorriso", "-as", "mkisofs", "-quiet", "-V", "test", "-o"}
	out, err = run(append(iso, "/var/cache/agentboot/test.iso", "/etc/passwd")...)
	require.NoError(t, err, "xorriso writing into the cache volume: %s", out)
	st, err := os.Stat(filepath.Join(cache, "test.iso"))
	require.NoError(t, err)
	require.Greater(t, st.Size(), int64(32<<10))

	out, err = run(append(iso, "/etc/test.iso", "/etc/passwd")...)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "writing to the read-only root succeeded: %s", out)
	require.Contains(t, out, "Read-only file system")
	_, err = os.Stat(filepath.Join(root, "etc", "test.iso"))
	require.True(t, os.IsNotExist(err), "the root file system was written")
}
