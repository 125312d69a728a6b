package main

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/test/container"
)

// fakeBin is a bin/ whose agentboot and agents are a small Go program
// (with build information, as the real ones): the image's own layer,
// without building the service for two architectures.
func fakeBin(t *testing.T) string {
	dir := t.TempDir()
	hello := filepath.Join(dir, "hello")
	build := exec.Command("go", "build", "-trimpath", "-o", hello, "./testdata/hello")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(hello)
	require.NoError(t, err)
	for _, name := range []string{"agentboot-linux-amd64", "agentboot-linux-arm64", "agent", "agent-arm64"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o755))
	}
	return dir
}

func options(t *testing.T, bin string, epoch int64) buildOptions {
	cache := defaultCache()
	return buildOptions{out: filepath.Join(t.TempDir(), "image"), bin: bin, lock: testLock("debian.lock", cache), cache: cache,
		version: "v0.0.0-test", epoch: time.Unix(epoch, 0).UTC(), apt: apt{dir: filepath.Join(cache, "apt")}}
}

// One image, built twice from the same inputs: the same digest and the
// same archive, byte for byte; the commit's time in it; an SBOM beside it;
// and, unpacked, C tools that run in a root of their own as the image's
// user, with every library they need in it, readable by that user. (Two
// builds only: under the race detector each costs a minute.)
func TestImage(t *testing.T) {
	const epoch = 1_790_000_000
	bin := fakeBin(t)
	a, b := options(t, bin, epoch), options(t, bin, epoch)
	da, err := build(a)
	require.NoError(t, err, "the pinned packages come from make image-debs")
	db, err := build(b)
	require.NoError(t, err)
	require.Equal(t, da, db)
	ra, err := os.ReadFile(a.out + ".oci.tar")
	require.NoError(t, err)
	rb, err := os.ReadFile(b.out + ".oci.tar")
	require.NoError(t, err)
	require.Equal(t, ra, rb, "the oci-archives differ")
	sbom, err := os.ReadFile(filepath.Join(filepath.Dir(a.out), "sbom-linux-amd64.cdx.json"))
	require.NoError(t, err)
	for _, want := range []string{`"bomFormat": "CycloneDX"`, "pkg:deb/debian/xorriso@", "pkg:deb/debian/libc6@", "pkg:golang/github.com/agentboot/agentboot@v0.0.0-test"} {
		require.Contains(t, string(sbom), want, "the SBOM")
	}

	// The README's push, word for word, into a registry (go-containerregistry's,
	// in this process): the registry holds the index under the digest make
	// image pinned deploy/ to.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	// --insecure-policy: the test copies its own image and needs no
	// /etc/containers/policy.json (a machine may lack one).
	out, err := exec.Command("skopeo", "--insecure-policy", "copy", "--all", "--preserve-digests", "--dest-tls-verify=false",
		"oci:"+a.out, "docker://"+host+"/agentboot:v0.0.0-test").CombinedOutput()
	require.NoError(t, err, "skopeo copy: %s", out)
	ref, err := name.ParseReference(host + "/agentboot:v0.0.0-test")
	require.NoError(t, err)
	pushed, err := remote.Index(ref)
	require.NoError(t, err)
	pd, err := pushed.Digest()
	require.NoError(t, err)
	require.Equal(t, da, pd, "the registry serves the index by the digest deploy/ is pinned to")

	// What a user pushes it with reads it, the layout and the archive, also
	// by the version it is tagged with.
	for _, ref := range []string{"oci:" + a.out + ":v0.0.0-test", "oci-archive:" + a.out + ".oci.tar:v0.0.0-test"} {
		out, err := exec.Command("skopeo", "inspect", "--override-os", "linux", "--override-arch", "arm64", ref).CombinedOutput()
		require.NoError(t, err, "skopeo inspect %s (skopeo comes with make test's prerequisites): %s", ref, out)
		require.Contains(t, string(out), `"Architecture": "arm64"`)
	}

	p, err := layout.FromPath(a.out)
	require.NoError(t, err)
	idx, err := p.ImageIndex()
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Equal(t, "v0.0.0-test", im.Manifests[0].Annotations[refAnnot], "skopeo's oci:dist/image:<version>")
	inner, err := idx.ImageIndex(im.Manifests[0].Digest)
	require.NoError(t, err)
	inm, err := inner.IndexManifest()
	require.NoError(t, err)
	images := map[string]v1.Image{}
	for _, m := range inm.Manifests {
		images[m.Platform.OS+"/"+m.Platform.Architecture], err = inner.Image(m.Digest)
		require.NoError(t, err)
	}
	require.Len(t, images, 2)
	img := images["linux/amd64"]
	require.NotNil(t, img, "no linux/amd64 image in the index")
	require.NotNil(t, images["linux/arm64"], "no linux/arm64 image in the index")
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, time.Unix(epoch, 0).UTC(), cf.Created.UTC(), "the commit's time")
	require.Equal(t, "65532:65532", cf.Config.User)
	require.Contains(t, cf.Config.Volumes, cacheDir)
	require.Equal(t, []string{"/usr/local/bin/agentboot"}, cf.Config.Entrypoint)

	root := t.TempDir()
	require.NoError(t, container.Unpack(img, root))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"/usr/bin/xorriso", "-version"}, "xorriso 1.5"},
		{[]string{"/usr/bin/ipmitool", "-V"}, "ipmitool version 1.8"},
	} {
		cmd := exec.Command(tc.args[0], tc.args[1:]...)
		cmd.Dir = "/"
		cmd.Env = cf.Config.Env
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Chroot:      root,
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: os.Getgid(), Size: 1}},
			Credential:  &syscall.Credential{Uid: uid, Gid: uid},
		}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s in the image: %s", tc.args[0], out)
		require.Contains(t, string(out), tc.want)
	}
	bundle, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	require.NoError(t, err)
	require.Greater(t, strings.Count(string(bundle), "BEGIN CERTIFICATE"), 100)
}

// make image points deploy/'s one image entry at what it built: by digest,
// and at the repository it will be pushed to when IMAGE_NAME says.
func TestPin(t *testing.T) {
	k := filepath.Join(t.TempDir(), "kustomization.yaml")
	base := "resources:\n  - a.yaml\nimages:\n  - name: agentboot\n    newName: agentboot\n    newTag: latest\n"
	require.NoError(t, os.WriteFile(k, []byte(base), 0o644))
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	require.NoError(t, pin(k, "", d))
	raw, err := os.ReadFile(k)
	require.NoError(t, err)
	require.Equal(t, "resources:\n  - a.yaml\nimages:\n  - name: agentboot\n    newName: agentboot\n    digest: sha256:"+d.Hex+"\n", string(raw))

	d2 := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("cd", 32)}
	require.NoError(t, pin(k, "registry.example:5000/team/agentboot", d2))
	raw, err = os.ReadFile(k)
	require.NoError(t, err)
	require.Equal(t, "resources:\n  - a.yaml\nimages:\n  - name: agentboot\n    newName: registry.example:5000/team/agentboot\n    digest: sha256:"+d2.Hex+"\n", string(raw))

	for _, bad := range []string{"registry.example/agentboot:v1", "registry.example/agentboot@sha256:" + d.Hex, "a b"} {
		require.ErrorContains(t, pin(k, bad, d), "is not a repository", bad)
	}
	require.NoError(t, os.WriteFile(k, []byte("resources: []\n"), 0o644))
	require.ErrorContains(t, pin(k, "", d), "has no images entry")
}
