package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// target is one architecture the dev image is built for: which Debian
// packages, kernel modules, console and firmware boot path it has.
type target struct {
	// name is the CoreOS stream's architecture name (x86_64, aarch64).
	name string
	// deb is Debian's name for it (amd64, arm64), goarch Go's.
	deb, goarch string
	// packages are unpacked into the image besides the kernel.
	packages []string
	// initrdModules are what a live boot needs before the root filesystem
	// is there (disks, CD, network); rootfsModules only once the system
	// runs. Modules the kernel has built in are skipped.
	initrdModules, rootfsModules []string
	// console is the serial console's device (the lab reads it).
	console string
	// bios adds isolinux to the ISO and syslinux to the disk image; without
	// it both boot with UEFI only, as aarch64 servers do.
	bios bool
	// grubFormat and efiName are grub-mkimage's -O and the removable-media
	// file name UEFI firmware starts (BOOTX64.EFI, BOOTAA64.EFI).
	grubFormat, efiName string
	// signedEFI boots the ISO's UEFI path through Debian's signed shim
	// and signed GRUB (shim-signed, grub-efi-amd64-signed), as RHCOS's
	// ISO does through Red Hat's, so that hosts with Secure Boot
	// enforced boot it; Debian's kernel is signed too.
	signedEFI bool
}

// Storage and network drivers shared by both architectures: virtio for VMs,
// AHCI/NVMe disks, CD-ROM and the NICs common on servers.
var commonInitrdModules = []string{
	"virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "virtio_rng",
	"ahci", "sd_mod", "sr_mod", "nvme", "isofs", "loop", "8021q", "efivarfs",
	"vfat", "nls_cp437", "nls_ascii", "nls_iso8859-1", "ext4",
	"igb", "ixgbe", "i40e", "tg3", "bnx2", "bnxt_en", "r8169",
}

var targets = map[string]target{
	"x86_64": {
		name: "x86_64", deb: "amd64", goarch: "amd64",
		packages:      []string{"busybox-static", "isolinux", "syslinux-common", "syslinux", "grub-efi-amd64-bin", "shim-signed", "grub-efi-amd64-signed"},
		initrdModules: append([]string{"ata_piix", "e1000", "e1000e", "igc"}, commonInitrdModules...),
		rootfsModules: []string{"kvm_intel", "kvm_amd", "vfio_pci", "vfio_iommu_type1", "ipmi_si", "ipmi_devintf", "megaraid_sas", "mpt3sas"},
		console:       "ttyS0",
		bios:          true,
		grubFormat:    "x86_64-efi", efiName: "BOOTX64.EFI",
		signedEFI: true,
	},
	"aarch64": {
		name: "aarch64", deb: "arm64", goarch: "arm64",
		packages: []string{"busybox-static", "grub-efi-arm64-bin"},
		// Arm servers' BMCs answer IPMI over the SSIF (I2C) interface as
		// often as over the system interface; KVM is built in.
		initrdModules: commonInitrdModules,
		rootfsModules: []string{"vfio_pci", "vfio_iommu_type1", "ipmi_si", "ipmi_ssif", "ipmi_devintf", "megaraid_sas", "mpt3sas"},
		console:       "ttyAMA0",
		grubFormat:    "arm64-efi", efiName: "BOOTAA64.EFI",
	},
}

func (t target) isoName() string  { return "agentboot-dev-live." + t.name + ".iso" }
func (t target) diskName() string { return "agentboot-dev-metal." + t.name + ".raw" }

// parseTargets reads --arch: a comma-separated list of stream names.
func parseTargets(list string) ([]target, error) {
	var out []target
	seen := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		t, ok := targets[name]
		if !ok {
			return nil, fmt.Errorf("--arch %q: unknown architecture (x86_64, aarch64)", name)
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, t)
		}
	}
	return out, nil
}

// apt runs apt-get and apt-cache for one architecture. The machine's own
// architecture uses the system's package lists (`apt-get update` as usual);
// another one gets a private apt state under the cache, so no dpkg
// configuration (dpkg --add-architecture) changes and no root is needed.
type apt struct {
	t    target
	opts []string
	// dir holds the private apt state; empty for the host's architecture.
	dir string
}

func (b *builder) aptFor(t target) (*apt, error) {
	out, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg --print-architecture: %w", err)
	}
	if strings.TrimSpace(string(out)) == t.deb {
		return &apt{t: t}, nil
	}
	dir := filepath.Join(b.cache, "apt", t.deb)
	for _, d := range []string{"state/lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	status := filepath.Join(dir, "state", "status")
	if _, err := os.Stat(status); err != nil {
		if err := os.WriteFile(status, nil, 0o644); err != nil {
			return nil, err
		}
	}
	a := &apt{t: t, opts: []string{
		"-o", "Dir::State=" + filepath.Join(dir, "state"),
		"-o", "Dir::State::status=" + status,
		"-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "APT::Architecture=" + t.deb,
		"-o", "APT::Architectures::=" + t.deb,
		"-o", "Debug::NoLocking=1",
	}}
	a.dir = dir
	// The lists are fetched when missing and refreshed when a week old, so
	// the kernel follows Debian's updates as the host's does after its own
	// `apt-get update`; offline, a refresh that fails leaves the cached
	// lists (and the downloaded packages) in use.
	lists, _ := filepath.Glob(filepath.Join(dir, "state", "lists", "*_Packages*"))
	var newest time.Time
	for _, l := range lists {
		if st, err := os.Stat(l); err == nil && st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	if len(lists) > 0 && time.Since(newest) < listsMaxAge {
		return a, nil
	}
	b.logf("%s: fetching Debian's %s package lists into %s", t.name, t.deb, dir)
	out, err = exec.Command("apt-get", append(a.opts, "-q", "update")...).CombinedOutput()
	switch {
	case err != nil && len(lists) == 0:
		return nil, fmt.Errorf("apt-get update for %s: %v: %s", t.deb, err, out)
	case err != nil:
		b.logf("%s: refreshing the package lists failed (%v); using the ones from %s", t.name, err, newest.Format(time.DateOnly))
	}
	return a, nil
}

// listsMaxAge is when another architecture's package lists are refreshed.
const listsMaxAge = 7 * 24 * time.Hour

// updateHint says how to refresh the lists apt reads for this target.
func (a *apt) updateHint() string {
	if a.dir == "" {
		return "run `apt-get update`"
	}
	return "remove " + filepath.Join(a.dir, "state", "lists") + " to fetch them again"
}

func (a *apt) cache(args ...string) ([]byte, error) {
	cmd := exec.Command("apt-cache", append(append([]string{}, a.opts...), args...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C") // "Candidate:" is translated
	out, err := cmd.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && len(ee.Stderr) > 0 {
		err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return out, err
}

func (a *apt) download(dir, pkgVersion string) error {
	cmd := exec.Command("apt-get", append(append([]string{}, a.opts...), "download", "-q", pkgVersion)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %v: %s", pkgVersion, err, out)
	}
	return nil
}

// kernelPackage is the versioned kernel package linux-image-<arch> points at.
func (a *apt) kernelPackage() (string, error) {
	meta := "linux-image-" + a.t.deb
	out, err := a.cache("show", meta)
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("apt-cache knows no %s: %s", meta, a.updateHint())
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Depends:") {
			if f := strings.Fields(strings.TrimPrefix(line, "Depends:")); len(f) > 0 {
				return f[0], nil
			}
		}
	}
	return "", errors.New("cannot tell which kernel " + meta + " depends on")
}

// candidates are the versions apt would install of pkgs, asked in one
// apt-cache call (each call loads apt's whole package cache, about a
// second).
func (a *apt) candidates(pkgs []string) (map[string]string, error) {
	out, err := a.cache(append([]string{"policy"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("apt-cache policy %s: %w", strings.Join(pkgs, " "), err)
	}
	got := map[string]string{}
	pkg := ""
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" && line[0] != ' ' && strings.HasSuffix(line, ":") {
			// A package's block: "name:", or "name:arch:" for another
			// architecture than apt's own.
			pkg, _, _ = strings.Cut(strings.TrimSuffix(line, ":"), ":")
			continue
		}
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Candidate:" && f[1] != "(none)" && pkg != "" {
			got[pkg] = f[1]
		}
	}
	for _, p := range pkgs {
		if got[p] == "" {
			return nil, fmt.Errorf("no %s candidate version of %s: %s", a.t.deb, p, a.updateHint())
		}
	}
	return got, nil
}
