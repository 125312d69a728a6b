package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentboot/agentboot/internal/filehash"
)

// lockAnew pins the packages the mirror has now: the tools' packages and
// every library package apt says they may depend on, downloaded, unpacked
// and kept only where the tools' ELF closure takes a file from them; and
// ca-certificates.
func lockAnew(lock, cache string, a apt) error {
	if _, err := a.run("apt-get", cache, "update", "-qq"); err != nil {
		return err
	}
	dl, err := os.MkdirTemp("", "image-lock-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dl)
	// apt-cache names the machine's own architecture's packages without
	// a qualifier.
	native, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		return fmt.Errorf("dpkg --print-architecture: %w", err)
	}
	var pinned []pkg
	for _, arch := range strings.Split(platforms, ",") {
		var roots []string
		for _, name := range tools {
			roots = append(roots, name+":"+arch)
		}
		out, err := a.run("apt-cache", dl, append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests",
			"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, roots...)...)
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			name, qual, _ := strings.Cut(strings.TrimSpace(line), ":")
			if line == "" || line[0] == ' ' || strings.HasPrefix(line, "<") || qual != arch && !(qual == "" && arch == strings.TrimSpace(string(native))) {
				continue
			}
			if (strings.HasPrefix(name, "lib") || name == "zlib1g" || name+":"+arch == roots[0] || name+":"+arch == roots[1]) &&
				!strings.HasPrefix(name, "libperl") && !strings.HasSuffix(name, "-perl") {
				want[name+":"+arch] = true
			}
		}
		archDir := filepath.Join(dl, arch)
		if err := os.MkdirAll(archDir, 0o755); err != nil {
			return err
		}
		args := []string{"download", "-qq"}
		for n := range want {
			args = append(args, n)
		}
		if arch == "amd64" { // once: it is for all architectures
			args = append(args, "ca-certificates")
		}
		if _, err := a.run("apt-get", archDir, args...); err != nil {
			return err
		}
		debs, _ := filepath.Glob(filepath.Join(archDir, "*.deb"))
		t := tree{}
		byName := map[string]pkg{}
		debOf := map[string]string{}
		for _, deb := range debs {
			base := strings.TrimSuffix(filepath.Base(deb), ".deb")
			parts := strings.Split(base, "_")
			if len(parts) != 3 {
				return fmt.Errorf("unexpected package file name %s", deb)
			}
			sum, _, err := filehash.SHA256(deb)
			if err != nil {
				return err
			}
			p := pkg{Name: parts[0], Version: strings.ReplaceAll(parts[1], "%3a", ":"), Arch: parts[2], SHA256: sum}
			byName[p.Name], debOf[p.Name] = p, deb
			if err := t.read(deb, p.Name); err != nil {
				return err
			}
		}
		var bins []string
		for b := range tools {
			bins = append(bins, b)
		}
		need, err := closure(t, arch, bins...)
		if err != nil {
			return err
		}
		used := map[string]bool{}
		if arch == "amd64" {
			used["ca-certificates"] = true
		}
		for _, p := range need {
			used[t[p].pkg] = true
		}
		// Only what is pinned is kept in the cache.
		for name := range used {
			pinned = append(pinned, byName[name])
			if err := os.Rename(debOf[name], filepath.Join(cache, byName[name].file())); err != nil {
				return err
			}
		}
	}
	return writeLock(lock, pinned)
}
