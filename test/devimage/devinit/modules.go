package main

import (
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// moduleInfo is one entry of the index the image builder writes (it plays
// the part of depmod's modules.dep and modules.alias).
type moduleInfo struct {
	Path    string   `json:"path"`
	Depends []string `json:"depends"`
	Aliases []string `json:"aliases"`
}

type moduleIndex struct {
	dir     string
	modules map[string]moduleInfo
	loaded  map[string]bool
}

var loadedModules = map[string]bool{}

// loadModuleIndex reads every agentboot-modules*.json under the running
// kernel's module directory.
func loadModuleIndex() (*moduleIndex, error) {
	dir := filepath.Join("/lib/modules", kernelRelease())
	files, _ := filepath.Glob(filepath.Join(dir, "agentboot-modules*.json"))
	idx := &moduleIndex{dir: dir, modules: map[string]moduleInfo{}, loaded: loadedModules}
	if len(files) == 0 {
		return idx, errors.New("no module index in " + dir)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return idx, err
		}
		var part struct {
			Modules map[string]moduleInfo `json:"modules"`
		}
		if err := json.Unmarshal(raw, &part); err != nil {
			return idx, err
		}
		for k, v := range part.Modules {
			idx.modules[k] = v
		}
	}
	return idx, nil
}

// load inserts a module after its dependencies; already loaded or built-in
// modules are fine.
func (idx *moduleIndex) load(name string, depth int) error {
	name = strings.ReplaceAll(name, "-", "_")
	if idx.loaded[name] || depth > 16 {
		return nil
	}
	m, ok := idx.modules[name]
	if !ok {
		return nil // built in, or not shipped in this image
	}
	for _, d := range m.Depends {
		if err := idx.load(d, depth+1); err != nil {
			return err
		}
	}
	f, err := os.Open(filepath.Join(idx.dir, m.Path))
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err != nil && err != unix.EEXIST {
		return err
	}
	idx.loaded[name] = true
	return nil
}

// coldplug loads the modules for every device the kernel knows, repeating
// while loading modules reveals new devices (a virtio bus, a SCSI disk).
func (idx *moduleIndex) coldplug() {
	for round := 0; round < 5; round++ {
		wanted := map[string]bool{}
		_ = filepath.WalkDir("/sys/devices", func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "modalias" {
				return nil
			}
			raw, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			alias := strings.TrimSpace(string(raw))
			for name, m := range idx.modules {
				if idx.loaded[name] {
					continue
				}
				for _, pattern := range m.Aliases {
					if ok, _ := path.Match(pattern, alias); ok {
						wanted[name] = true
						break
					}
				}
			}
			return nil
		})
		// Block and file-system modules that no device alias names.
		for _, name := range []string{"sr_mod", "sd_mod", "isofs", "vfat", "nls_cp437", "nls_ascii", "loop"} {
			if !idx.loaded[name] {
				if _, ok := idx.modules[name]; ok {
					wanted[name] = true
				}
			}
		}
		if len(wanted) == 0 {
			return
		}
		for name := range wanted {
			if err := idx.load(name, 0); err != nil {
				logf("module %s: %v", name, err)
				idx.loaded[name] = true // do not retry a module that fails
			}
		}
	}
}

// loadCPUVirtualization loads KVM for the CPU's vendor, as udev would. It
// fails on CPUs without usable virtualization, which is what the agent's
// virtualization report then finds out.
func (idx *moduleIndex) loadCPUVirtualization() {
	raw, _ := os.ReadFile("/proc/cpuinfo")
	flags := ""
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "flags") {
			flags = " " + line + " "
			break
		}
	}
	mod := ""
	switch {
	case strings.Contains(flags, " vmx "):
		mod = "kvm_intel"
	case strings.Contains(flags, " svm "):
		mod = "kvm_amd"
	default:
		return
	}
	if err := idx.load(mod, 0); err != nil {
		logf("module %s: %v", mod, err)
	}
}
