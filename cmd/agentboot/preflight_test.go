package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/testenv"
)

// Each thing a Deployment may leave out is named: the flag, the path or the
// variable, and where to look.
func TestSettingsProblemsNameWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(present, []byte("x"), 0o600))
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("AGENTBOOT_TEST_SET", "https://x")
	var kubeconfig string

	set := flag.NewFlagSet("t", flag.ContinueOnError)
	for _, name := range []string{"stream", "literal", "url", "ca", "cert", "cache", "spare", "unset-file"} {
		set.String(name, "", "")
	}
	require.NoError(t, set.Parse([]string{
		"--stream=https://mirror:s3cret@example/$(OS_IMAGE_STREAM_NOT_SET)",
		"--literal=$(AGENTBOOT_TEST_SET)", // defined: the kubelet would have expanded it; a literal on purpose
		"--url=https://example",
		"--ca=" + present,
		"--cert=" + filepath.Join(dir, "tls.crt"),
		"--cache=" + filepath.Join(present, "no-volume"), // under a file: cannot be made
		"--unset-file=$(TLS_DIR_NOT_SET)/tls.key",
	}))
	got := needs{Files: []string{"ca", "cert", "spare", "unset-file"}, Writable: []string{"cache"}, Kubeconfig: &kubeconfig}.problems(set)
	require.Len(t, got, 5, "%q", got)
	require.Contains(t, got[0]+got[1], `the environment has no OS_IMAGE_STREAM_NOT_SET`)
	require.Contains(t, got[0]+got[1], `--unset-file refers to $(TLS_DIR_NOT_SET), and the environment has no TLS_DIR_NOT_SET`)
	require.Equal(t, fmt.Sprintf("--cert %s cannot be read: no such file or directory (is the volume that holds it mounted there, and does its Secret have this key?)", filepath.Join(dir, "tls.crt")), got[2])
	require.Equal(t, fmt.Sprintf("--cache %s is not writable: not a directory (mount a volume there, an emptyDir)", filepath.Join(present, "no-volume")), got[3])
	require.Contains(t, got[4], "no way to the cluster")
	for _, p := range got {
		require.NotContains(t, p, "--literal")
		require.NotContains(t, p, "s3cret", "the value is not repeated: whoever asks /readyz reads it")
	}

	// With everything there, nothing; the write check leaves nothing. A
	// cache directory that does not exist yet is made, as the catalog
	// makes it.
	cache := filepath.Join(t.TempDir(), "new", "cache")
	set = flag.NewFlagSet("t", flag.ContinueOnError)
	set.String("ca", "", "")
	set.String("cache", "", "")
	require.NoError(t, set.Parse([]string{"--ca=" + present, "--cache=" + cache}))
	kubeconfig = "/elsewhere"
	require.Empty(t, needs{Files: []string{"ca"}, Writable: []string{"cache"}, Kubeconfig: &kubeconfig}.problems(set))
	left, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Empty(t, left)
}

func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// An image service started without its certificate's Secret keys and with
// a ConfigMap key missing stays up, unready, saying why, in its log and in
// its readiness probe's answer; stopped, it says what it waited for.
func TestImageServiceWaitsUnreadyForMissingSettings(t *testing.T) {
	dir := t.TempDir()
	ports, err := testenv.FreePorts(1)
	require.NoError(t, err)
	probes := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runImageService(ctx, []string{
			"--kubeconfig=" + filepath.Join(dir, "kubeconfig"),
			"--log-format=text",
			"--health-probe-bind-address=" + probes,
			"--tls-cert-file=" + filepath.Join(dir, "tls", "tls.crt"),
			"--tls-key-file=" + filepath.Join(dir, "tls", "tls.key"),
			"--image-cache-dir=" + dir,
			"--os-image-stream=$(OS_IMAGE_STREAM_NOT_SET)",
		})
	}()
	var code int
	var body string
	require.Eventually(t, func() bool {
		code, body = probe(t, "http://"+probes+"/readyz")
		return code != 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusServiceUnavailable, code)
	for _, want := range []string{"--tls-cert-file " + filepath.Join(dir, "tls", "tls.crt"), "--tls-key-file", "the environment has no OS_IMAGE_STREAM_NOT_SET"} {
		require.Contains(t, body, want)
	}
	code, _ = probe(t, "http://"+probes+"/healthz")
	require.Equal(t, http.StatusOK, code, "alive: a restart would not bring a missing file")
	cancel()
	err = <-done
	require.ErrorContains(t, err, "stopped while waiting for settings")
	require.ErrorContains(t, err, "OS_IMAGE_STREAM_NOT_SET")
}

// Files that appear (the kubelet brings a Secret's new key) end the wait,
// and the probe address is free again for the process's own probes.
func TestAwaitSettingsEndsWhenFilesAppear(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "tls.crt")
	set := flag.NewFlagSet("t", flag.ContinueOnError)
	set.String("cert", "", "")
	require.NoError(t, set.Parse([]string{"--cert=" + cert}))
	ports, err := testenv.FreePorts(1)
	require.NoError(t, err)
	probes := fmt.Sprintf("127.0.0.1:%d", ports[0])
	done := make(chan error, 1)
	go func() {
		done <- awaitSettings(context.Background(), testr.New(t), probes, 10*time.Millisecond, func() []string { return needs{Files: []string{"cert"}}.problems(set) })
	}()
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = probe(t, "http://"+probes+"/readyz")
		return code == http.StatusServiceUnavailable
	}, 10*time.Second, 20*time.Millisecond)
	require.True(t, strings.HasPrefix(body, "not ready, waiting for settings:\n--cert "+cert), body)
	require.NoError(t, os.WriteFile(cert, []byte("x"), 0o600))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting after the file appeared")
	}
	l, err := net.Listen("tcp", probes)
	require.NoError(t, err, "the probe address is free again")
	l.Close()
}
