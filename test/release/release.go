// Package release builds an earlier release of agentboot from its commit,
// for the upgrade test: the source comes out of this repository's own
// history (git archive), is built with the Go toolchain at hand, and is
// kept in the user's cache by commit, so it is built once per machine.
package release

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/agentboot/agentboot/test/testenv"
	"github.com/agentboot/agentboot/test/vm"
)

// Release is a built release.
type Release struct {
	// Version is its tag; Commit the commit the tag names.
	Version, Commit string
	// Note says what the release is to the test (the first one has no
	// predecessor).
	Note string
	// Source is its tree; Deploy its kustomize base.
	Source, Deploy string
	// Agentboot and Agent are its binaries.
	Agentboot, Agent string
}

// previousFile names the release an upgrade starts from: "<tag> <commit>"
// and a note, one per line. It names the commit, not only the tag, because
// a clone need not carry tags; the history it does carry.
const previousFile = "test/release/previous"

var line = regexp.MustCompile(`^(v\d+\.\d+\.\d+)\s+([0-9a-f]{40})\s*$`)

// Previous builds the release before this one (test/release/previous).
func Previous() (Release, error) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), previousFile))
	if err != nil {
		return Release{}, err
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
	m := line.FindStringSubmatch(lines[0])
	if m == nil {
		return Release{}, fmt.Errorf("%s: first line %q is not \"vMAJOR.MINOR.PATCH <40-hex commit>\"", previousFile, lines[0])
	}
	r := Release{Version: m[1], Commit: m[2]}
	if len(lines) > 1 {
		r.Note = strings.TrimSpace(lines[1])
	}
	return r, r.build()
}

func (r *Release) build() error {
	root := testenv.RepoRoot()
	if err := exec.Command("git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").Run(); err != nil {
		return fmt.Errorf("release %s: commit %s is not in this clone's history (a shallow clone? git fetch --unshallow)", r.Version, r.Commit)
	}
	dir := filepath.Join(vm.CacheDir(), "releases", r.Commit)
	r.Source, r.Deploy = filepath.Join(dir, "src"), filepath.Join(dir, "src", "deploy")
	r.Agentboot, r.Agent = filepath.Join(dir, "bin", "agentboot"), filepath.Join(dir, "bin", "agent")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	done := filepath.Join(dir, "built")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	for _, p := range []string{r.Source, filepath.Join(dir, "bin")} {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
	}
	tarball := filepath.Join(dir, "src.tar")
	if out, err := exec.Command("git", "-C", root, "archive", "--format=tar", "-o", tarball, r.Commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", r.Commit, err, out)
	}
	if out, err := exec.Command("tar", "-x", "-C", r.Source, "-f", tarball).CombinedOutput(); err != nil {
		return fmt.Errorf("extract %s: %v: %s", r.Commit, err, out)
	}
	if err := os.Remove(tarball); err != nil {
		return err
	}
	for bin, pkg := range map[string]string{r.Agentboot: "./cmd/agentboot", r.Agent: "./cmd/agent"} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version="+r.Version, "-o", bin, pkg)
		cmd.Dir = r.Source
		// -mod=readonly: the release builds with the modules its go.sum
		// pins, or not at all.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s of %s: %v: %s", pkg, r.Version, err, out)
		}
	}
	return os.WriteFile(done, nil, 0o600)
}
