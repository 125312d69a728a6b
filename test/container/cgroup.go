package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryCgroup is a memory cgroup a container runs in, limited as its
// resources.limits.memory says: past it the kernel kills the container, as
// on a node. Both cgroup hierarchies are served (v2's unified one, v1's
// memory controller).
type memoryCgroup struct {
	dir  string
	peak string // the file of the highest usage seen
}

// newMemoryCgroup makes one named name with limit bytes.
func newMemoryCgroup(name string, limit int64) (*memoryCgroup, error) {
	if raw, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(raw), "memory") {
		dir := filepath.Join("/sys/fs/cgroup", name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		for file, v := range map[string]string{"memory.max": strconv.FormatInt(limit, 10), "memory.swap.max": "0"} {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil && file == "memory.max" {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
		}
		return &memoryCgroup{dir: dir, peak: filepath.Join(dir, "memory.peak")}, nil
	}
	v1 := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(v1, "memory.limit_in_bytes")); err != nil {
		return nil, errors.New("no memory cgroup controller (neither cgroup v2 with memory nor v1's memory hierarchy)")
	}
	dir := filepath.Join(v1, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		return nil, fmt.Errorf("memory.limit_in_bytes: %w", err)
	}
	// Swap would let a container past its limit unnoticed.
	_ = os.WriteFile(filepath.Join(dir, "memory.swappiness"), []byte("0"), 0o644)
	return &memoryCgroup{dir: dir, peak: filepath.Join(dir, "memory.max_usage_in_bytes")}, nil
}

// add moves a process into the cgroup.
func (c *memoryCgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// peakBytes is the most memory the cgroup's processes used at once.
func (c *memoryCgroup) peakBytes() int64 {
	raw, err := os.ReadFile(c.peak)
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// remove deletes the cgroup once its processes are gone.
func (c *memoryCgroup) remove() { _ = os.Remove(c.dir) }
