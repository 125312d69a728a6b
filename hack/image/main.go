// Command image builds agentboot's OCI image for linux/amd64 and
// linux/arm64 without a container runtime or a registry: the project's own
// binaries (bin/, from make build), and the C tools the service runs
// (xorriso for minimal ISOs, ipmitool for ipmi:// BMCs) with exactly the
// libraries their ELF headers name, from Debian packages pinned by version
// and sha256 in hack/image/debian.lock. Every time in the image is the
// commit's, so the same commit gives the same digest. Beside the OCI
// layout it writes an oci-archive and a CycloneDX SBOM per platform, and
// points deploy/'s kustomize image entry at the index's digest.
//
//	go run ./hack/image -version $(git describe) -epoch $(git log -1 --format=%ct)
//	go run ./hack/image -lock-anew     # pin the mirror's current packages
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's one user (distroless' nonroot), and the paths the service
// writes: declared as volumes, since its root file system is read-only.
const (
	uid       = 65532
	cacheDir  = "/var/cache/agentboot"
	tmpDir    = "/tmp"
	binDir    = "/usr/local/bin"
	refAnnot  = "org.opencontainers.image.ref.name"
	platforms = "amd64,arm64"
)

// tools are the C programs the service runs, and the packages that hold
// them (the roots of the lock).
var tools = map[string]string{"/usr/bin/xorriso": "xorriso", "/usr/bin/ipmitool": "ipmitool"}

func main() {
	out := flag.String("out", "dist/image", "the OCI layout to write (replaced)")
	bin := flag.String("bin", "bin", "the binaries of make build and make image-binaries: agentboot-linux-<arch>, agent, agent-arm64")
	lock := flag.String("lock", "hack/image/debian.lock", "the pinned Debian packages")
	cache := flag.String("cache", defaultCache(), "where the pinned .debs are kept")
	version := flag.String("version", "dev", "the version the image is tagged with")
	epoch := flag.Int64("epoch", 0, "every time in the image, in seconds since 1970 (the commit's time)")
	kustomization := flag.String("kustomization", "deploy/kustomization.yaml", "whose image entry named agentboot is set to the built digest (empty: none)")
	name := flag.String("name", "", "the repository the kustomization's image entry names (its newName), where the image is pushed; empty keeps the one it has")
	relock := flag.Bool("lock-anew", false, "pin the packages the mirror has now, and build nothing")
	fetchOnly := flag.Bool("fetch", false, "download the pinned packages into the cache (tests build offline from it), and build nothing")
	flag.Parse()
	a := apt{dir: filepath.Join(*cache, "apt")}
	var err error
	switch {
	case *relock:
		err = lockAnew(*lock, *cache, a)
	case *fetchOnly:
		err = fetchForTests(*lock, *cache, a)
	default:
		var digest v1.Hash
		digest, err = build(buildOptions{out: *out, bin: *bin, lock: *lock, cache: *cache, version: *version, epoch: time.Unix(*epoch, 0).UTC(), apt: a})
		if err == nil && *kustomization != "" {
			err = pin(*kustomization, *name, digest)
		}
		if err == nil {
			fmt.Printf("image: %s@%s\n", *out, digest)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// fallbackLock is where -fetch pins the mirror's current packages when a
// version the lock pins is gone from it (Debian's mirrors keep the current
// version only): the tests build from it then, so that a point release of
// Debian does not fail make test; make image still refuses until make
// image-lock pins anew.
const fallbackLock = "fallback.lock"

func fetchForTests(lock, cache string, a apt) error {
	pkgs, err := readLock(lock)
	if err != nil {
		return err
	}
	ferr := fetch(pkgs, cache, a)
	if ferr == nil {
		_ = os.Remove(filepath.Join(cache, fallbackLock))
		return nil
	}
	fmt.Fprintf(os.Stderr, "image: %v\nimage: the tests build from the mirror's current packages instead (%s); make image needs make image-lock\n", ferr, filepath.Join(cache, fallbackLock))
	return lockAnew(filepath.Join(cache, fallbackLock), cache, a)
}

// testLock is the lock the tests build from: the project's, or the
// fallback -fetch pinned when the project's packages could not be had.
func testLock(lock, cache string) string {
	fb := filepath.Join(cache, fallbackLock)
	if _, err := os.Stat(fb); err == nil {
		return fb
	}
	return lock
}

func defaultCache() string {
	if c := os.Getenv("AGENTBOOT_CACHE"); c != "" {
		return filepath.Join(c, "debs")
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "agentboot", "debs")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "agentboot", "debs")
}

type buildOptions struct {
	out, bin, lock, cache, version string
	epoch                          time.Time
	apt                            apt
}

// build writes the layout and returns the index's digest.
func build(o buildOptions) (v1.Hash, error) {
	pkgs, err := readLock(o.lock)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := fetch(pkgs, o.cache, o.apt); err != nil {
		return v1.Hash{}, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var sboms []sbomFile
	for _, arch := range strings.Split(platforms, ",") {
		img, used, err := platformImage(o, pkgs, arch)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("linux/%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
		sb, err := sbom(o, arch, img, used)
		if err != nil {
			return v1.Hash{}, err
		}
		sboms = append(sboms, sb)
	}
	if idx, err = withoutArtifactTypes(idx); err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(o.out); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refAnnot: o.version})); err != nil {
		return v1.Hash{}, err
	}
	for _, sb := range sboms {
		if err := os.WriteFile(filepath.Join(filepath.Dir(o.out), sb.name), sb.data, 0o644); err != nil {
			return v1.Hash{}, err
		}
	}
	if err := archive(o.out, o.out+".oci.tar", o.epoch); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

// platformImage is the image for one architecture, and the packages it
// took files from.
func platformImage(o buildOptions, pkgs []pkg, arch string) (v1.Image, []pkg, error) {
	t := tree{}
	for _, p := range pkgs {
		if p.Arch != arch && p.Arch != "all" {
			continue
		}
		if err := t.unpack(filepath.Join(o.cache, p.file()), p.Name); err != nil {
			return nil, nil, err
		}
	}
	var roots []string
	for p := range tools {
		roots = append(roots, p)
	}
	sort.Strings(roots)
	need, err := closure(t, arch, roots...)
	if err != nil {
		return nil, nil, err
	}
	base, err := baseLayer(t)
	if err != nil {
		return nil, nil, err
	}
	toolLayer := layer{}
	usedBy := map[string]bool{"ca-certificates": true}
	for _, p := range need {
		e := t[p]
		if e.typeflag == tar.TypeLink {
			// A hard link is written as a copy: in path order it may
			// come before the file it links to.
			e = t[e.link]
		}
		toolLayer[p] = file{mode: e.mode, typeflag: e.typeflag, link: e.link, data: e.data}
		usedBy[e.pkg] = true
	}
	own := layer{}
	for name, src := range map[string]string{"agentboot": "agentboot-linux-" + arch, "agent": "agent", "agent-arm64": "agent-arm64"} {
		data, err := os.ReadFile(filepath.Join(o.bin, src))
		if err != nil {
			return nil, nil, fmt.Errorf("%w (make image-binaries builds it)", err)
		}
		own.file(binDir+"/"+name, 0o755, data)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range []struct {
		what string
		l    layer
	}{
		{"base: the nonroot user, CA certificates, the writable paths", base},
		{"tools: xorriso and ipmitool with their libraries, from Debian", toolLayer},
		{"agentboot " + o.version + ": the service and the agents it serves", own},
	} {
		v1l, err := l.l.v1Layer(o.epoch)
		if err != nil {
			return nil, nil, err
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: v1l, History: v1.History{Created: v1.Time{Time: o.epoch}, CreatedBy: "hack/image", Comment: l.what}}); err != nil {
			return nil, nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = arch, "linux", v1.Time{Time: o.epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{binDir + "/agentboot"},
		User:       fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Volumes:    map[string]struct{}{cacheDir: {}, tmpDir: {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "agentboot",
			"org.opencontainers.image.version": o.version,
			"org.opencontainers.image.created": o.epoch.Format(time.RFC3339),
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, nil, err
	}
	var used []pkg
	for _, p := range pkgs {
		if (p.Arch == arch || p.Arch == "all") && usedBy[p.Name] {
			used = append(used, p)
		}
	}
	return img, used, nil
}

// baseLayer holds what every process of the image expects of a system:
// its user, CA certificates (Mozilla's, as Debian's ca-certificates ships
// them, in the bundle update-ca-certificates would make), /tmp and the
// image cache (owned by the user; both volumes), and merged-/usr links.
func baseLayer(t tree) (layer, error) {
	l := layer{}
	l.file("/etc/passwd", 0o644, []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)))
	l.file("/etc/group", 0o644, []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)))
	l.file("/etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n"))
	var certs []string
	for p, e := range t {
		if strings.HasPrefix(p, "/usr/share/ca-certificates/mozilla/") && strings.HasSuffix(p, ".crt") && e.typeflag == tar.TypeReg {
			certs = append(certs, p)
		}
	}
	if len(certs) < 50 {
		return nil, fmt.Errorf("only %d CA certificates in the pinned ca-certificates package", len(certs))
	}
	sort.Strings(certs)
	var bundle []byte
	for _, c := range certs {
		bundle = append(bundle, t[c].data...)
		if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
			bundle = append(bundle, '\n')
		}
	}
	l.file("/etc/ssl/certs/ca-certificates.crt", 0o644, bundle)
	l.dir(tmpDir, 0o1777)
	// The user's own: the image cache and its home.
	l[cacheDir] = file{mode: 0o755, typeflag: tar.TypeDir, uid: uid, gid: uid}
	l["/home/nonroot"] = file{mode: 0o755, typeflag: tar.TypeDir, uid: uid, gid: uid}
	for _, d := range []string{"bin", "lib", "lib64", "sbin"} {
		l.symlink("/"+d, "usr/"+d)
	}
	l.dir("/usr/lib64", 0o755)
	l.dir("/usr/sbin", 0o755)
	return l, nil
}

// pin points the kustomization's image entry named agentboot at digest,
// and at the repository name when it is not empty.
func pin(kustomization, name string, digest v1.Hash) error {
	raw, err := os.ReadFile(kustomization)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^(  - name: agentboot\n    newName: )([^\n]+)\n(    (newTag|digest): [^\n]+\n)`)
	m := re.FindSubmatch(raw)
	if m == nil {
		return fmt.Errorf("%s has no images entry \"- name: agentboot\" with newName and newTag or digest", kustomization)
	}
	if name == "" {
		name = string(m[2])
	}
	// A registry may have a port (registry.example:5000/agentboot); the
	// repository's last part has no tag.
	if last := name[strings.LastIndex(name, "/")+1:]; strings.ContainsAny(name, " \n\t@") || strings.Contains(last, ":") {
		return fmt.Errorf("-name %q is not a repository (registry.example/agentboot, without a tag or digest)", name)
	}
	raw = re.ReplaceAllLiteral(raw, []byte(string(m[1])+name+"\n    digest: "+digest.String()+"\n"))
	return os.WriteFile(kustomization, raw, 0o644)
}

type sbomFile struct {
	name string
	data []byte
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return b
}

// withoutArtifactTypes is idx with its descriptors' artifactType left out.
// The field is optional (OCI 1.1) and go-containerregistry fills it in from
// each image's config; clients that predate it (skopeo 1.9, Debian's)
// cannot copy an index that has it without rewriting the index, which
// changes the digest deploy/ is pinned to.
func withoutArtifactTypes(idx v1.ImageIndex) (v1.ImageIndex, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for i := range m.Manifests {
		m.Manifests[i].ArtifactType = ""
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	digest, size, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	return &plainIndex{inner: idx, raw: raw, manifest: m, digest: digest, size: size}, nil
}

// plainIndex is an index whose manifest was rewritten; its images are the
// original's.
type plainIndex struct {
	inner    v1.ImageIndex
	raw      []byte
	manifest *v1.IndexManifest
	digest   v1.Hash
	size     int64
}

func (p *plainIndex) RawManifest() ([]byte, error)                { return p.raw, nil }
func (p *plainIndex) IndexManifest() (*v1.IndexManifest, error)   { return p.manifest.DeepCopy(), nil }
func (p *plainIndex) Digest() (v1.Hash, error)                    { return p.digest, nil }
func (p *plainIndex) Size() (int64, error)                        { return p.size, nil }
func (p *plainIndex) MediaType() (types.MediaType, error)         { return p.inner.MediaType() }
func (p *plainIndex) Image(h v1.Hash) (v1.Image, error)           { return p.inner.Image(h) }
func (p *plainIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) { return p.inner.ImageIndex(h) }
