// Package container runs a program from an unpacked OCI image the way a
// kubelet and its runtime run a container: a mount namespace of its own
// with the image as a read-only root, the pod's volumes mounted at their
// paths, a private /proc and a minimal /dev, as the image's user; Kubelet
// runs a Deployment's pod with it as the manifest describes it. It is the
// harness that checks that the image has what the manifests ask of it
// (issue 31); it needs root, so its tests run in make e2e.
//
// A package whose tests use it calls Init first in TestMain: the runner
// re-executes the test binary, which sets the container up and execs the
// program in its place.
package container

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Mount is a volume: a host directory (an emptyDir, a Secret's files)
// mounted at Target in the container.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Spec is a container as a Deployment describes it, resolved: the command
// with its arguments, the environment, the user, the mounts.
type Spec struct {
	// Root is the unpacked image; Start adds the mount points it lacks
	// (a runtime creates them too) before it is mounted read-only.
	Root string
	// Args is the entrypoint and its arguments; Env the environment.
	Args, Env []string
	// Dir is the working directory ("/" when empty).
	Dir string
	// UID and GID the process runs as; Groups its supplementary groups
	// (a pod's fsGroup and supplementalGroups).
	UID, GID int
	Groups   []int
	// NoNewPrivs sets no_new_privs (allowPrivilegeEscalation: false).
	NoNewPrivs bool
	Mounts     []Mount
	// WritableRoot leaves the root file system writable
	// (readOnlyRootFilesystem: false).
	WritableRoot bool
	// NetNS, when set, is the path of the network namespace to run in
	// (/run/netns/<name>); otherwise the caller's.
	NetNS string
}

const initEnv = "AGENTBOOT_CONTAINER_INIT"

// Command is the container as a command to start: its own mount and PID
// namespaces, the program in place of a re-executed test binary.
func Command(ctx context.Context, s Spec, stdout, stderr io.Writer) (*exec.Cmd, error) {
	if os.Getuid() != 0 {
		return nil, fmt.Errorf("running a container needs root (mount namespaces): run it in make e2e")
	}
	for _, m := range s.Mounts {
		if err := os.MkdirAll(filepath.Join(s.Root, m.Target), 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(s.Root, d), 0o755); err != nil {
			return nil, err
		}
	}
	spec, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = []string{initEnv + "=" + string(spec)}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// Init turns a re-executed test binary into the container's program; in
// any other process it returns at once. Call it first in TestMain.
func Init() {
	raw, ok := os.LookupEnv(initEnv)
	if !ok {
		return
	}
	// The network namespace is joined by this thread, which must be the
	// one that execs.
	runtime.LockOSThread()
	var s Spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fail("spec", err)
	}
	if err := setUp(s); err != nil {
		fail("set up", err)
	}
	err := syscall.Exec(s.Args[0], s.Args, s.Env)
	fail("exec "+s.Args[0], err)
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "container: %s: %v\n", what, err)
	os.Exit(127)
}

// setUp runs in the new mount and PID namespaces, as root.
func setUp(s Spec) error {
	if s.NetNS != "" {
		f, err := os.Open(s.NetNS)
		if err != nil {
			return err
		}
		// For this thread, which execs the program (Init locks it).
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns %s: %w", s.NetNS, err)
		}
		f.Close()
	}
	// Nothing mounted here is seen outside.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := s.Root
	if err := syscall.Mount(root, root, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the root: %w", err)
	}
	for _, m := range s.Mounts {
		target := filepath.Join(root, m.Target)
		if err := syscall.Mount(m.Source, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("mount %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := syscall.Mount("", target, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("mount %s read-only: %w", m.Target, err)
			}
		}
	}
	if err := syscall.Mount("proc", filepath.Join(root, "proc"), "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := syscall.Mount("tmpfs", filepath.Join(root, "dev"), "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "random", "urandom"} {
		p := filepath.Join(root, "dev", d)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := syscall.Mount("/dev/"+d, p, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	if !s.WritableRoot {
		if err := syscall.Mount("", root, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root read-only: %w", err)
		}
	}
	if err := syscall.Chroot(root); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	dir := s.Dir
	if dir == "" {
		dir = "/"
	}
	if err := syscall.Chdir(dir); err != nil {
		return fmt.Errorf("chdir %s: %w", dir, err)
	}
	if err := syscall.Setgroups(s.Groups); err != nil {
		return err
	}
	if s.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	if err := syscall.Setresgid(s.GID, s.GID, s.GID); err != nil {
		return err
	}
	return syscall.Setresuid(s.UID, s.UID, s.UID)
}
