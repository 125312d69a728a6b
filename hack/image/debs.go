package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/agentboot/agentboot/internal/filehash"
)

// pkg is one Debian package the image takes files from, as the lock file
// pins it.
type pkg struct {
	Name, Arch, Version, SHA256 string
}

func (p pkg) file() string {
	// apt names downloads with the epoch's colon escaped.
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), p.Arch)
}

// readLock reads hack/image/debian.lock: "name arch version sha256" lines.
func readLock(file string) ([]pkg, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pkg
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 || len(f[3]) != 64 {
			return nil, fmt.Errorf("%s:%d: want \"name arch version sha256\", got %q", file, n, line)
		}
		out = append(out, pkg{f[0], f[1], f[2], f[3]})
	}
	return out, s.Err()
}

func writeLock(file string, pkgs []pkg) error {
	sort.Slice(pkgs, func(i, j int) bool {
		if pkgs[i].Arch != pkgs[j].Arch {
			return pkgs[i].Arch < pkgs[j].Arch
		}
		return pkgs[i].Name < pkgs[j].Name
	})
	var b bytes.Buffer
	b.WriteString("# The Debian packages the image takes its C tools, their libraries and its CA certificates\n" +
		"# from: name, architecture, version, sha256 of the .deb. `make image-lock` pins them anew.\n")
	for _, p := range pkgs {
		fmt.Fprintf(&b, "%s %s %s %s\n", p.Name, p.Arch, p.Version, p.SHA256)
	}
	return os.WriteFile(file, b.Bytes(), 0o644)
}

// apt runs apt-get or apt-cache with a private state under dir: package
// lists for both architectures, without touching the machine's own.
type apt struct{ dir string }

func (a apt) opts() []string {
	return []string{
		"-o", "Dir::State::Lists=" + filepath.Join(a.dir, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(a.dir, "cache"),
		"-o", "Dir::State::status=/dev/null",
		"-o", "APT::Architectures::=amd64", "-o", "APT::Architectures::=arm64",
		"-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
	}
}

func (a apt) run(tool, dir string, args ...string) ([]byte, error) {
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(a.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(tool, append(a.opts(), args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// fetch makes sure every pinned package is in cache, downloading those
// that are not, and checks each against its sha256.
func fetch(pkgs []pkg, cache string, a apt) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	var missing []string
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(cache, p.file())); err != nil {
			missing = append(missing, p.Name+":"+p.Arch+"="+p.Version)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "image: downloading %d pinned Debian packages into %s\n", len(missing), cache)
		if _, err := a.run("apt-get", cache, "update", "-qq"); err != nil {
			return err
		}
		if _, err := a.run("apt-get", cache, append([]string{"download", "-qq"}, missing...)...); err != nil {
			return fmt.Errorf("%w\n(a pinned version the mirror no longer has: run make image-lock to pin the current ones)", err)
		}
	}
	for _, p := range pkgs {
		sum, _, err := filehash.SHA256(filepath.Join(cache, p.file()))
		if err != nil {
			return err
		}
		if sum != p.SHA256 {
			return fmt.Errorf("%s: sha256 %s, the lock pins %s", p.file(), sum, p.SHA256)
		}
	}
	return nil
}

// entry is a file, directory or symlink of an unpacked package.
type entry struct {
	mode     int64
	typeflag byte
	link     string
	data     []byte
	pkg      string
}

// tree is the unpacked files of some packages, by absolute path.
type tree map[string]*entry

// unpacked keeps each .deb's files once read: a process builds both
// platforms, and the tests several images, from the same packages.
var unpacked sync.Map // .deb path → tree

// unpack adds the files of the .deb to t.
func (t tree) unpack(deb, name string) error {
	if files, ok := unpacked.Load(deb); ok {
		maps.Copy(t, files.(tree))
		return nil
	}
	files := tree{}
	if err := files.read(deb, name); err != nil {
		return err
	}
	unpacked.Store(deb, files)
	maps.Copy(t, files)
	return nil
}

// read reads the files of the .deb (dpkg-deb reads every compression
// Debian uses).
func (t tree) read(deb, name string) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			_ = cmd.Wait()
			return fmt.Errorf("%s: %w", deb, err)
		}
		p := usrmerge(path.Clean("/" + h.Name))
		e := &entry{mode: h.Mode, typeflag: h.Typeflag, link: h.Linkname, pkg: name}
		if h.Typeflag == tar.TypeReg {
			if e.data, err = io.ReadAll(tr); err != nil {
				return err
			}
		}
		if h.Typeflag == tar.TypeLink {
			e.link = usrmerge(path.Clean("/" + h.Linkname))
		}
		t[p] = e
	}
	return cmd.Wait()
}

// usrmerge maps /lib, /lib64, /bin and /sbin into /usr, as a merged-usr
// system (Debian 12) has them.
func usrmerge(p string) string {
	for _, d := range []string{"/lib", "/lib64", "/bin", "/sbin"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "/usr" + p
		}
	}
	return p
}
