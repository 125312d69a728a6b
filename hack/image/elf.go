package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"path"
	"sort"
)

// libDirs are where the dynamic loader looks, per architecture (Debian's
// multiarch paths, merged into /usr).
var libDirs = map[string][]string{
	"amd64": {"/usr/lib/x86_64-linux-gnu", "/usr/lib"},
	"arm64": {"/usr/lib/aarch64-linux-gnu", "/usr/lib"},
}

// closure is every path (binaries, their loader, the libraries they need,
// and each symlink on the way) that the binaries need to run, found by
// their ELF headers: DT_NEEDED, recursively, and PT_INTERP.
func closure(t tree, arch string, binaries ...string) ([]string, error) {
	keep := map[string]bool{}
	var visit func(p string) error
	seen := map[string]bool{}
	// add keeps p and every link it goes through.
	add := func(p string) (string, *entry, error) {
		for range 40 {
			p = usrmerge(p)
			keep[p] = true
			e, ok := t[p]
			if !ok {
				return p, nil, fmt.Errorf("%s is in none of the pinned packages", p)
			}
			if e.typeflag != tar.TypeSymlink {
				if e.typeflag == tar.TypeLink { // its target is the file
					target, ok := t[e.link]
					if !ok {
						return p, nil, fmt.Errorf("%s is a hard link to %s, which none of the pinned packages has", p, e.link)
					}
					keep[e.link] = true
					return e.link, target, nil
				}
				return p, e, nil
			}
			if path.IsAbs(e.link) {
				p = e.link
			} else {
				p = path.Join(path.Dir(p), e.link)
			}
		}
		return p, nil, fmt.Errorf("%s: too many symlinks", p)
	}
	visit = func(p string) error {
		real, e, err := add(p)
		if err != nil {
			return err
		}
		if seen[real] {
			return nil
		}
		seen[real] = true
		f, err := elf.NewFile(bytes.NewReader(e.data))
		if err != nil {
			return fmt.Errorf("%s: %w", real, err)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b := make([]byte, prog.Filesz)
				if _, err := prog.ReadAt(b, 0); err != nil {
					return err
				}
				if err := visit(string(bytes.TrimRight(b, "\x00"))); err != nil {
					return err
				}
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", real, err)
		}
		for _, lib := range libs {
			found := false
			for _, dir := range libDirs[arch] {
				if _, ok := t[path.Join(dir, lib)]; ok {
					if err := visit(path.Join(dir, lib)); err != nil {
						return err
					}
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("%s needs %s, which none of the pinned %s packages has", real, lib, arch)
			}
		}
		return nil
	}
	for _, b := range binaries {
		if err := visit(b); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(keep))
	for p := range keep {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}
