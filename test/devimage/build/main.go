// Command build makes agentboot's dev OS image from Debian packages, for
// x86_64 and aarch64: per architecture a small live ISO laid out exactly like
// a CoreOS live ISO (images/pxeboot/{vmlinuz,initrd.img,rootfs.img}, a 256 KiB
// images/ignition.img, coreos/igninfo.json, coreos/kargs.json with
// COREOS_KARG_EMBED_AREA regions), bootable with isolinux (BIOS, x86_64 only)
// and GRUB (UEFI), a raw disk image an installer writes, and one CoreOS-style
// stream metadata file that points at them all. It is a test and demo OS,
// not a production one.
//
// Packages come from `apt-get download` and `dpkg-deb -x`, so no root is
// needed beyond what apt needs (another architecture's packages through a
// private apt state under --cache); xorriso, mtools and dosfstools must be
// installed. The result is cached by content under --cache and linked into
// --out, so a rebuild with unchanged inputs is instant.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/agentboot/agentboot/internal/filehash"
	"github.com/agentboot/agentboot/internal/initramfs"
	"github.com/agentboot/agentboot/pxe"
)

// builderVersion changes whenever the image layout changes, to invalidate
// cached images.
const builderVersion = "10"

type builder struct {
	out, cache, repo string
	targets          []target
	log              *os.File

	// per target, while building
	t         target
	work      string
	kernelPkg string
}

func main() {
	var b builder
	var arch, pxeGRUB string
	flag.StringVar(&b.out, "out", "dist/dev-image", "directory the image files are linked into")
	flag.StringVar(&pxeGRUB, "pxe-grub", "", "build only agentboot's netboot GRUB for arm64 UEFI PXE clients, into this file")
	flag.StringVar(&b.cache, "cache", filepath.Join(os.Getenv("HOME"), ".cache", "agentboot"), "cache directory for packages and built images")
	flag.StringVar(&b.repo, "repo", ".", "agentboot checkout (to build devinit)")
	flag.StringVar(&arch, "arch", "x86_64,aarch64", "architectures to build, comma-separated (x86_64, aarch64)")
	flag.Parse()
	b.log = os.Stderr
	var err error
	switch {
	case pxeGRUB != "":
		err = b.pxeGRUB(pxeGRUB)
	default:
		if b.targets, err = parseTargets(arch); err == nil {
			err = b.run()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dev-image: %v\n", err)
		os.Exit(1)
	}
}

func (b *builder) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "dev-image: "+format+"\n", args...)
}

func (b *builder) run() error {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg", "dpkg-deb", "xorriso", "mkfs.vfat", "mcopy", "mmd", "grub-mkimage"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install the Debian packages listed in .ci/packages", tool)
		}
	}
	var dirs []string
	for _, t := range b.targets {
		b.t = t
		debs, err := b.download()
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		devinit, err := b.buildDevinit()
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		dir := filepath.Join(b.cache, "dev-image", t.name+"-"+cacheKey(debs, devinit))
		if _, err := os.Stat(filepath.Join(dir, streamPart)); err != nil {
			if err := b.build(dir, debs, devinit); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
		} else {
			b.logf("%s up to date (%s)", t.name, dir)
		}
		dirs = append(dirs, dir)
	}
	return b.link(dirs)
}

func cacheKey(debs []string, devinit []byte) string {
	h := sha256.New()
	fmt.Fprintln(h, builderVersion)
	for _, d := range debs {
		fmt.Fprintln(h, filepath.Base(d))
	}
	h.Write(devinit)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// download fetches the kernel and the other packages of the target once
// into the cache.
func (b *builder) download() ([]string, error) {
	a, err := b.aptFor(b.t)
	if err != nil {
		return nil, err
	}
	if b.kernelPkg, err = a.kernelPackage(); err != nil {
		return nil, err
	}
	return b.fetch(a, append([]string{b.kernelPkg}, b.t.packages...))
}

// fetch downloads packages of the target once into the cache.
func (b *builder) fetch(a *apt, packages []string) ([]string, error) {
	debDir := filepath.Join(b.cache, "debs")
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return nil, err
	}
	candidates, err := a.candidates(packages)
	if err != nil {
		return nil, err
	}
	var debs []string
	for _, pkg := range packages {
		candidate := candidates[pkg]
		// apt names files with the epoch's colon escaped, and with the
		// architecture (the target's, or all).
		ver := strings.ReplaceAll(candidate, ":", "%3a")
		find := func() string {
			for _, arch := range []string{b.t.deb, "all"} {
				if f := firstMatch(filepath.Join(debDir, fmt.Sprintf("%s_%s_%s.deb", pkg, ver, arch))); f != "" {
					return f
				}
			}
			return ""
		}
		file := find()
		if file == "" {
			b.logf("downloading %s %s (%s)", pkg, candidate, b.t.deb)
			if err := a.download(debDir, pkg+"="+candidate); err != nil {
				return nil, err
			}
			if file = find(); file == "" {
				return nil, fmt.Errorf("apt-get download %s did not produce %s_%s_%s.deb", pkg, pkg, ver, b.t.deb)
			}
		}
		debs = append(debs, file)
	}
	return debs, nil
}

func firstMatch(pattern string) string {
	m, _ := filepath.Glob(pattern)
	if len(m) == 0 {
		return ""
	}
	return m[0]
}

func (b *builder) buildDevinit() ([]byte, error) {
	// In the checkout's bin/, at the same path every time: go build does
	// not link again when the binary there is up to date (a link costs
	// seconds). The lock keeps two builds in this checkout (make run and
	// make test at once) from reading each other's half-written binary.
	dir, err := filepath.Abs(filepath.Join(b.repo, "bin", "devimage"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	bin := filepath.Join(dir, "devinit-"+b.t.goarch)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./test/devimage/devinit")
	cmd.Dir = b.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+b.t.goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build devinit: %v: %s", err, out)
	}
	return os.ReadFile(bin)
}

// build makes every artifact in a temporary directory and renames it to dir.
func (b *builder) build(dir string, debs []string, devinit []byte) error {
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b.work = filepath.Join(tmp, "work")
	root := filepath.Join(b.work, "debs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", d, root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v: %s", d, err, out)
		}
	}
	release, err := kernelRelease(root)
	if err != nil {
		return err
	}
	version := "dev-" + strings.TrimSuffix(release, "-"+b.t.deb)
	volID := "agentboot-" + version
	if len(volID) > 32 {
		volID = volID[:32]
	}
	b.logf("building %s for %s (kernel %s)", version, b.t.name, release)

	mods, err := scanModules(filepath.Join(root, "lib/modules", release))
	if err != nil {
		return err
	}
	initrdSet, err := mods.closure(b.t.initrdModules)
	if err != nil {
		return err
	}
	rootfsSet, err := mods.closure(b.t.rootfsModules)
	if err != nil {
		return err
	}
	for m := range initrdSet {
		delete(rootfsSet, m)
	}

	rootfs, err := b.rootfsArchive(root, release, mods, rootfsSet)
	if err != nil {
		return err
	}
	rootfsSum := sha256.Sum256(rootfs)
	initrd, err := b.initrdArchive(root, release, mods, initrdSet, devinit, hex.EncodeToString(rootfsSum[:]))
	if err != nil {
		return err
	}
	kernel, err := os.ReadFile(filepath.Join(root, "boot", "vmlinuz-"+release))
	if err != nil {
		return err
	}

	iso := filepath.Join(tmp, b.t.isoName())
	if err := b.makeISO(iso, root, volID, kernel, initrd, rootfs); err != nil {
		return err
	}
	disk := filepath.Join(tmp, b.t.diskName())
	if err := b.makeDisk(disk, root, kernel, initrd, rootfs); err != nil {
		return err
	}
	if err := b.writeStreamPart(tmp, version, iso, disk); err != nil {
		return err
	}
	if err := os.RemoveAll(b.work); err != nil {
		return err
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	b.logf("built %s in %s", dir, time.Since(start).Round(time.Second))
	return nil
}

func kernelRelease(root string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(root, "lib/modules"))
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.IsDir() {
			return e.Name(), nil
		}
	}
	return "", errors.New("no kernel modules directory in the kernel package")
}

// module is what depmod would record for one .ko file.
type module struct {
	Path    string   `json:"path"`
	Depends []string `json:"depends"`
	Aliases []string `json:"aliases"`
	// builtin: compiled into the kernel (modules.builtin), nothing to load.
	builtin bool
}

type moduleSet map[string]module

// scanModules reads the .modinfo section of every module, as depmod does,
// and modules.builtin for those compiled in.
func scanModules(dir string) (moduleSet, error) {
	set := moduleSet{}
	builtin, err := os.ReadFile(filepath.Join(dir, "modules.builtin"))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Fields(string(builtin)) {
		name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(line), ".ko"), "-", "_")
		set[name] = module{builtin: true}
	}
	err = filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".ko") {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		defer f.Close()
		sec := f.Section(".modinfo")
		if sec == nil {
			return nil
		}
		data, err := sec.Data()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m := module{Path: rel}
		name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(p), ".ko"), "-", "_")
		for _, kv := range bytes.Split(data, []byte{0}) {
			k, v, ok := strings.Cut(string(kv), "=")
			if !ok {
				continue
			}
			switch k {
			case "alias":
				m.Aliases = append(m.Aliases, v)
			case "depends":
				for _, dep := range strings.Split(v, ",") {
					if dep != "" {
						m.Depends = append(m.Depends, strings.ReplaceAll(dep, "-", "_"))
					}
				}
			}
		}
		set[name] = m
		return nil
	})
	return set, err
}

// closure returns the named modules and everything they depend on.
func (s moduleSet) closure(names []string) (moduleSet, error) {
	out := moduleSet{}
	var add func(string) error
	add = func(n string) error {
		n = strings.ReplaceAll(n, "-", "_")
		if _, done := out[n]; done {
			return nil
		}
		m, ok := s[n]
		if !ok {
			return fmt.Errorf("module %s is neither in the kernel package nor built in", n)
		}
		if m.builtin {
			return nil
		}
		out[n] = m
		for _, d := range m.Depends {
			if err := add(d); err != nil {
				return err
			}
		}
		return nil
	}
	for _, n := range names {
		if err := add(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (b *builder) moduleFiles(root, release string, set moduleSet, indexName string) ([]initramfs.File, error) {
	var files []initramfs.File
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(root, "lib/modules", release, set[n].Path))
		if err != nil {
			return nil, err
		}
		files = append(files, initramfs.File{Path: filepath.Join("lib/modules", release, set[n].Path), Mode: 0o644, Data: data})
	}
	index, err := json.MarshalIndent(map[string]any{"modules": set}, "", " ")
	if err != nil {
		return nil, err
	}
	files = append(files, initramfs.File{Path: filepath.Join("lib/modules", release, indexName), Mode: 0o644, Data: index})
	return files, nil
}

func (b *builder) rootfsArchive(root, release string, mods, set moduleSet) ([]byte, error) {
	files, err := b.moduleFiles(root, release, set, "agentboot-modules-rootfs.json")
	if err != nil {
		return nil, err
	}
	files = append(files, initramfs.File{Path: "etc/agentboot/rootfs-loaded", Mode: 0o644, Data: []byte("the dev OS root filesystem is unpacked\n")})
	return initramfs.Archive(initramfs.Gzip, files...)
}

// udhcpcScript configures an interface from busybox udhcpc's environment.
const udhcpcScript = `#!/bin/sh
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set "$interface" up
	;;
bound|renew)
	ip -4 addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
	if [ -n "$dns" ]; then
		: > /etc/resolv.conf
		for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
	fi
	[ -n "$ntpsrv" ] && echo "$ntpsrv" > "/run/dhcp-ntp-$interface"
	;;
esac
exit 0
`

func (b *builder) initrdArchive(root, release string, mods, set moduleSet, devinit []byte, rootfsDigest string) ([]byte, error) {
	busybox, err := os.ReadFile(filepath.Join(root, "bin/busybox"))
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w", err)
	}
	files, err := b.moduleFiles(root, release, set, "agentboot-modules.json")
	if err != nil {
		return nil, err
	}
	files = append(files,
		initramfs.File{Path: "init", Mode: 0o755, Data: devinit},
		initramfs.File{Path: "bin/busybox", Mode: 0o755, Data: busybox},
		initramfs.File{Path: "etc/udhcpc.script", Mode: 0o755, Data: []byte(udhcpcScript)},
		initramfs.File{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		initramfs.File{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\n")},
		initramfs.File{Path: "etc/os-release", Mode: 0o644, Data: []byte("NAME=\"agentboot dev OS\"\nID=agentboot-dev\nVERSION_ID=\"" + release + "\"\nPRETTY_NAME=\"agentboot dev OS (test and demo only)\"\n")},
		initramfs.File{Path: "etc/agentboot/rootfs.sha256", Mode: 0o644, Data: []byte(rootfsDigest + "\n")},
	)
	return initramfs.Archive(initramfs.Gzip, files...)
}

// kargMarker ends every kernel-argument area, as in CoreOS boot configs.
const kargMarker = "# COREOS_KARG_EMBED_AREA\n"

// kargArea is what follows the default arguments on the kernel line: a line
// of 1024 '#', the last of which (with the marker) stays outside the area.
func kargArea() string { return "\n" + strings.Repeat("#", 1023) + kargMarker }

func (b *builder) makeISO(out, root, volID string, kernel, initrd, rootfs []byte) error {
	tree := filepath.Join(b.work, "iso")
	kargs := "console=tty0 console=" + b.t.console + ",115200n8 coreos.liveiso=" + volID + " ignition.firstboot ignition.platform.id=metal"
	// x86 GRUB drives the PC's UART itself; arm64-efi GRUB has no such
	// port, and the firmware's console already reaches the serial line.
	console := ""
	if b.t.bios {
		console = "serial --unit=0 --speed=115200\nterminal_input console serial\nterminal_output console serial\n"
	}
	grub := "set timeout=1\n" + console +
		"menuentry 'agentboot dev OS (live)' {\n\tlinux /images/pxeboot/vmlinuz " + kargs + kargArea() + "\tinitrd /images/pxeboot/initrd.img /images/ignition.img\n}\n"
	files := map[string][]byte{
		"images/pxeboot/vmlinuz":    kernel,
		"images/pxeboot/initrd.img": initramfs.Pad4(initrd),
		"images/pxeboot/rootfs.img": rootfs,
		"images/ignition.img":       make([]byte, 256<<10),
		"coreos/igninfo.json":       []byte(`{"file": "images/ignition.img"}` + "\n"),
		// devinit applies etc/coreos-firstboot-network, as CoreOS live
		// initramfs images since this feature do.
		"coreos/features.json":   []byte(`{"live-initrd-network": true}` + "\n"),
		"EFI/agentboot/grub.cfg": []byte(grub),
	}
	kargFiles := []map[string]any{{"path": "EFI/agentboot/grub.cfg", "offset": strings.Index(grub, kargs), "pad": "#", "end": "\n"}}
	if b.t.signedEFI {
		// What Debian's signed CD GRUB looks for (efiBootImage).
		files[".disk/info"] = []byte("agentboot dev OS " + volID + "\n")
		files["boot/grub/grub.cfg"] = []byte("configfile ($root)/EFI/agentboot/grub.cfg\n")
	}
	if b.t.bios {
		isolinux := "serial 0 115200\ndefault linux\nprompt 0\ntimeout 10\nlabel linux\n  kernel /images/pxeboot/vmlinuz\n  append initrd=/images/pxeboot/initrd.img,/images/ignition.img " + kargs + kargArea()
		files["isolinux/isolinux.cfg"] = []byte(isolinux)
		kargFiles = append(kargFiles, map[string]any{"path": "isolinux/isolinux.cfg", "offset": strings.Index(isolinux, kargs), "pad": "#", "end": "\n"})
		for _, f := range []struct{ src, dst string }{
			{"usr/lib/ISOLINUX/isolinux.bin", "isolinux/isolinux.bin"},
			{"usr/lib/syslinux/modules/bios/ldlinux.c32", "isolinux/ldlinux.c32"},
		} {
			data, err := os.ReadFile(filepath.Join(root, f.src))
			if err != nil {
				return err
			}
			files[f.dst] = data
		}
	}
	kargsJSON, err := json.MarshalIndent(map[string]any{"default": kargs, "files": kargFiles, "size": len(kargs) + 1024}, "", "  ")
	if err != nil {
		return err
	}
	files["coreos/kargs.json"] = append(kargsJSON, '\n')
	for name, data := range files {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	if err := b.efiBootImage(root, volID, filepath.Join(tree, "images/efiboot.img")); err != nil {
		return err
	}
	args := []string{"-as", "mkisofs", "-quiet", "-V", volID, "-R", "-J", "-joliet-long"}
	if b.t.bios {
		args = append(args, "-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat", "-no-emul-boot", "-boot-load-size", "4", "-boot-info-table",
			"-isohybrid-mbr", filepath.Join(root, "usr/lib/ISOLINUX/isohdpfx.bin"),
			"-eltorito-alt-boot", "-e", "images/efiboot.img", "-no-emul-boot", "-isohybrid-gpt-basdat")
	} else {
		// UEFI only, as aarch64 live ISOs are: the El Torito EFI image for
		// CDs (and a BMC's virtual media), the same image as an appended
		// EFI system partition for USB sticks.
		args = append(args, "-c", "boot.cat", "-e", "images/efiboot.img", "-no-emul-boot",
			"-append_partition", "2", "0xef", filepath.Join(tree, "images/efiboot.img"))
	}
	args = append(args, "-o", out, tree)
	if o, err := exec.Command("xorriso", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("xorriso: %v: %s", err, o)
	}
	return nil
}

// efiBootImage makes the FAT image UEFI firmware boots from the CD: a GRUB
// that finds the ISO by its label and reads EFI/agentboot/grub.cfg there.
// With signedEFI that GRUB is Debian's signed CD GRUB (gcdx64.efi), started
// by Debian's signed shim as BOOTX64.EFI: its built-in config finds the CD
// by /.disk/info and reads /boot/grub/grub.cfg there (makeISO writes both),
// which sends it on to EFI/agentboot/grub.cfg.
func (b *builder) efiBootImage(root, volID, out string) error {
	files := map[string]string{}
	size := "4096"
	if b.t.signedEFI {
		files["EFI/BOOT/"+b.t.efiName] = filepath.Join(root, "usr/lib/shim/shimx64.efi.signed")
		files["EFI/BOOT/grubx64.efi"] = filepath.Join(root, "usr/lib/grub/x86_64-efi-signed/gcdx64.efi.signed")
		size = "8192"
	} else {
		efi, err := b.grubEFI(root, volID)
		if err != nil {
			return err
		}
		files["EFI/BOOT/"+b.t.efiName] = efi
	}
	if o, err := exec.Command("mkfs.vfat", "-C", out, size).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.vfat: %v: %s", err, o)
	}
	return mtools(out, files, "EFI", "EFI/BOOT")
}

// grubEFI builds a standalone GRUB for the target's UEFI that finds the
// filesystem labelled label and reads EFI/agentboot/grub.cfg there.
func (b *builder) grubEFI(root, label string) (string, error) {
	early := filepath.Join(b.work, "grub-early-"+label+".cfg")
	cfg := fmt.Sprintf("search --no-floppy --set=root --label %q\nset prefix=($root)/EFI/agentboot\nconfigfile $prefix/grub.cfg\n", label)
	if err := os.WriteFile(early, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	efi := filepath.Join(b.work, label+"-"+b.t.efiName)
	cmd := exec.Command("grub-mkimage", "-O", b.t.grubFormat, "-d", filepath.Join(root, "usr/lib/grub", b.t.grubFormat),
		"-c", early, "-p", "/EFI/agentboot", "-o", efi,
		"iso9660", "part_gpt", "part_msdos", "fat", "search", "search_label", "configfile", "normal", "linux", "echo", "serial", "terminal", "all_video", "gzio", "test")
	if o, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("grub-mkimage: %v: %s", err, o)
	}
	return efi, nil
}

// pxeGRUB builds agentboot's netboot GRUB for arm64 UEFI PXE clients from
// Debian's grub-efi-arm64-bin into out: a standalone GRUB whose embedded
// config (pxe.GRUBEarlyConfig) asks the PXE service what to boot.
func (b *builder) pxeGRUB(out string) error {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb", "grub-mkimage"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install the Debian packages listed in .ci/packages", tool)
		}
	}
	b.t = targets["aarch64"]
	a, err := b.aptFor(b.t)
	if err != nil {
		return err
	}
	debs, err := b.fetch(a, []string{"grub-efi-arm64-bin"})
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "pxe-grub-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "debs")
	if o, err := exec.Command("dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %v: %s", debs[0], err, o)
	}
	early := filepath.Join(tmp, "early.cfg")
	if err := os.WriteFile(early, []byte(pxe.GRUBEarlyConfig), 0o644); err != nil {
		return err
	}
	// The memdisk holds normal mode's grub.cfg: its retry loop must not
	// depend on the network.
	var memdisk bytes.Buffer
	tw := tar.NewWriter(&memdisk)
	if err := tw.WriteHeader(&tar.Header{Name: "grub.cfg", Mode: 0o644, Size: int64(len(pxe.GRUBConfig)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write([]byte(pxe.GRUBConfig)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	memdiskFile := filepath.Join(tmp, "memdisk.tar")
	if err := os.WriteFile(memdiskFile, memdisk.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	efi := filepath.Join(tmp, filepath.Base(out))
	args := append([]string{"-O", "arm64-efi", "-d", filepath.Join(root, "usr/lib/grub/arm64-efi"), "-c", early, "-m", memdiskFile, "-p", "(memdisk)", "-o", efi}, pxe.GRUBModules()...)
	if o, err := exec.Command("grub-mkimage", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("grub-mkimage: %v: %s", err, o)
	}
	if err := copyFile(efi, out); err != nil {
		return err
	}
	b.logf("built %s from %s", out, filepath.Base(debs[0]))
	return nil
}

// mtools makes dirs and copies files (destination: source) into the FAT
// image img, without mounting it.
func mtools(img string, files map[string]string, dirs ...string) error {
	for _, d := range dirs {
		if o, err := exec.Command("mmd", "-i", img, "::"+d).CombinedOutput(); err != nil {
			return fmt.Errorf("mmd %s: %v: %s", d, err, o)
		}
	}
	names := make([]string, 0, len(files))
	for dst := range files {
		names = append(names, dst)
	}
	sort.Strings(names)
	for _, dst := range names {
		if o, err := exec.Command("mcopy", "-i", img, files[dst], "::"+dst).CombinedOutput(); err != nil {
			return fmt.Errorf("mcopy %s: %v: %s", dst, err, o)
		}
	}
	return nil
}

// streamPart is the target's piece of the stream metadata, written next to
// its artifacts in the cache; link joins the pieces into stream.json.
const streamPart = "stream-arch.json"

// writeStreamPart writes the target's CoreOS stream architecture entry.
func (b *builder) writeStreamPart(dir, version, iso, disk string) error {
	isoSum, _, err := filehash.SHA256(iso)
	if err != nil {
		return err
	}
	diskSum, _, err := filehash.SHA256(disk)
	if err != nil {
		return err
	}
	part := map[string]any{
		"artifacts": map[string]any{
			"metal": map[string]any{
				"release": version,
				"formats": map[string]any{
					"iso": map[string]any{
						"disk": map[string]any{"location": filepath.Base(iso), "sha256": isoSum},
					},
					"raw": map[string]any{
						"disk": map[string]any{"location": filepath.Base(disk), "sha256": diskSum},
					},
				},
			},
		},
	}
	data, err := json.MarshalIndent(map[string]any{b.t.name: part}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, streamPart), append(data, '\n'), 0o644)
}

// writeStream writes CoreOS stream metadata for the built architectures, so
// the catalog reads it the way it reads Fedora CoreOS and RHCOS streams.
func writeStream(out string, dirs []string) error {
	arches := map[string]json.RawMessage{}
	// The newest part's time, so that an unchanged image keeps its metadata.
	var modified time.Time
	for _, dir := range dirs {
		p := filepath.Join(dir, streamPart)
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.ModTime().After(modified) {
			modified = st.ModTime()
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var part map[string]json.RawMessage
		if err := json.Unmarshal(raw, &part); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, streamPart), err)
		}
		for k, v := range part {
			arches[k] = v
		}
	}
	stream := map[string]any{
		"stream":        "agentboot-dev",
		"metadata":      map[string]any{"last-modified": modified.UTC().Format(time.RFC3339), "generator": "agentboot test/devimage/build " + builderVersion},
		"architectures": arches,
	}
	data, err := json.MarshalIndent(stream, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "stream.json"), append(data, '\n'), 0o644)
}

// link hard-links the cached files of every target into the output
// directory and writes the stream metadata listing them.
func (b *builder) link(dirs []string) error {
	if err := os.RemoveAll(b.out); err != nil {
		return err
	}
	if err := os.MkdirAll(b.out, 0o755); err != nil {
		return err
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Name() == streamPart {
				continue
			}
			src, dst := filepath.Join(dir, e.Name()), filepath.Join(b.out, e.Name())
			if err := os.Link(src, dst); err != nil {
				if err := copyFile(src, dst); err != nil {
					return err
				}
			}
		}
	}
	if err := writeStream(b.out, dirs); err != nil {
		return err
	}
	b.logf("image in %s", b.out)
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Disk image layout: an MBR and one bootable FAT32 partition labelled "boot"
// from 1 MiB, as an installer writes it to a disk. On x86_64 the MBR holds
// syslinux's boot code and the partition syslinux (BIOS); on aarch64 the
// partition is an EFI system partition with GRUB at the removable-media
// path UEFI firmware starts (EFI/BOOT/BOOTAA64.EFI).
const (
	diskBootLabel   = "boot"
	diskPartOffset  = 1 << 20
	diskSectorBytes = 512
	// The partition is as large as its files and 8 MiB for what an
	// installer adds (the Ignition config), in whole MiB, and at least
	// 40 MiB (FAT32 needs 65525 clusters): what `agent install` writes,
	// and checksums, under TCG in the tests, costs seconds per 10 MiB.
	diskPartSlack   = 8 << 20
	diskPartMinSize = 40 << 20
)

// diskPartSize is the size of a boot partition holding files.
func diskPartSize(files map[string][]byte) int64 {
	size := int64(diskPartSlack)
	for _, data := range files {
		size += int64(len(data))
	}
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	return max(size, diskPartMinSize)
}

// makeDisk builds the raw disk image an installer writes: the dev OS boots
// from its "boot" partition (the kernel, the initramfs and the root
// filesystem), and devinit applies the Ignition config an installer put at
// ignition/config.ign on that partition, where CoreOS's installer puts it.
func (b *builder) makeDisk(out, root string, kernel, initrd, rootfs []byte) error {
	args := "console=tty0 console=" + b.t.console + ",115200n8 agentboot.disk=" + diskBootLabel
	files := map[string][]byte{"vmlinuz": kernel, "initrd.img": initramfs.Pad4(initrd), "rootfs.img": rootfs}
	dirs := []string{"ignition"}
	var partType byte = 0x0c // FAT32 with LBA
	if b.t.bios {
		files["syslinux.cfg"] = []byte("SERIAL 0 115200\nDEFAULT dev\nPROMPT 0\nTIMEOUT 0\nLABEL dev\n  KERNEL /vmlinuz\n  INITRD /initrd.img\n  APPEND " + args + "\n")
	} else {
		efi, err := b.grubEFI(root, diskBootLabel)
		if err != nil {
			return err
		}
		if files["EFI/BOOT/"+b.t.efiName], err = os.ReadFile(efi); err != nil {
			return err
		}
		files["EFI/agentboot/grub.cfg"] = []byte("set timeout=0\nmenuentry 'agentboot dev OS' {\n\tlinux /vmlinuz " + args + "\n\tinitrd /initrd.img\n}\n")
		dirs = append(dirs, "EFI", "EFI/BOOT", "EFI/agentboot")
		partType = 0xef // EFI system partition
	}
	partSize := diskPartSize(files)
	part := filepath.Join(b.work, "boot.part")
	if err := os.WriteFile(part, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(part, partSize); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.vfat", "-F", "32", "-n", diskBootLabel, part).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.vfat: %v: %s", err, out)
	}
	copies := map[string]string{}
	for name, data := range files {
		src := filepath.Join(b.work, "disk-"+strings.ReplaceAll(name, "/", "-"))
		if err := os.WriteFile(src, data, 0o644); err != nil {
			return err
		}
		copies[name] = src
	}
	if err := mtools(part, copies, dirs...); err != nil {
		return err
	}
	header := make([]byte, diskPartOffset)
	if b.t.bios {
		// Debian's syslinux installs through mtools: no mount, no root.
		if out, err := exec.Command(filepath.Join(root, "usr/bin/syslinux"), "--install", part).CombinedOutput(); err != nil {
			return fmt.Errorf("syslinux --install: %v: %s", err, out)
		}
		mbr, err := os.ReadFile(filepath.Join(root, "usr/lib/syslinux/mbr/mbr.bin"))
		if err != nil {
			return err
		}
		if len(mbr) > 440 {
			return fmt.Errorf("mbr.bin is %d bytes, want at most 440", len(mbr))
		}
		copy(header, mbr)
	}
	entry := header[446:462]
	entry[0] = 0x80 // bootable
	entry[4] = partType
	binary.LittleEndian.PutUint32(entry[8:], diskPartOffset/diskSectorBytes)
	binary.LittleEndian.PutUint32(entry[12:], uint32(partSize/diskSectorBytes))
	// CHS fields say "use LBA".
	copy(entry[1:4], []byte{0xfe, 0xff, 0xff})
	copy(entry[5:8], []byte{0xfe, 0xff, 0xff})
	header[510], header[511] = 0x55, 0xaa
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(header); err != nil {
		return err
	}
	in, err := os.Open(part)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := io.Copy(f, in); err != nil {
		return err
	}
	return f.Close()
}
