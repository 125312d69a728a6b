package discovery

import (
	"fmt"
	"strings"

	"github.com/agentboot/agentboot/internal/cmdwords"
)

// GRUB network boot: arm64 UEFI firmware gets a GRUB from agentboot's PXE
// service (Debian 12 ships no arm64 iPXE). That GRUB is agentboot's own
// build (pxe.GRUBEarlyConfig, pxe.GRUBConfig): it asks the PXE service for
// $agentboot_root/boot.grub?mac=<its MAC>&arch=<grub_cpu>, which the PXE
// service fetches from the image service, and then fetches every file
// through the PXE service's TFTP server too. Debian 12's GRUB 2.06 speaks
// HTTP only on port 80, so TFTP through the PXE service reaches an image
// service on any port. The scripts here name files as
// "$agentboot_root/<path and query of the image service's HTTP URL>"; the
// PXE service maps them back.

// GRUBRootVariable is set by the embedded config of agentboot's netboot
// GRUB: the TFTP directory through which the PXE service reaches the image
// service, "(tftp,<server>)/agentboot".
const GRUBRootVariable = "agentboot_root"

// GRUBPathPrefix is the TFTP directory of the PXE service that stands for
// the image service's HTTP root; GRUBRootVariable names it without the
// slash.
const GRUBPathPrefix = "agentboot"

// GRUBScript boots the discovery image from agentboot's netboot GRUB on the
// host with mac (six colon-separated bytes). It fails when a URL is not on
// the image service's HTTP listener or a kernel argument cannot pass
// through GRUB's command line unchanged.
func (o *Output) GRUBScript(s Settings, mac string) (string, error) {
	kernel, err := grubPath(s, o.URLs.Kernel)
	if err != nil {
		return "", err
	}
	initrd, err := grubPath(s, o.URLs.Initrd)
	if err != nil {
		return "", err
	}
	var args []string
	for _, a := range cmdwords.Split(o.PXEKargs) {
		// initrd= names iPXE's image; the kernel's EFI stub would look for
		// a file of that name. BOOTIF is iPXE's expansion: GRUB gets the
		// MAC it asked with.
		if a == "initrd=initrd" || strings.HasPrefix(a, "BOOTIF=") {
			continue
		}
		// GRUB escapes quotes and backslashes on the way to the kernel,
		// which Linux does not undo.
		if strings.ContainsAny(a, `"'\`) {
			return "", inputErrorf("kernel argument %q cannot be passed through GRUB unchanged (quotes and backslashes are escaped on the way to the kernel): network boot of arm64 hosts needs kernel arguments without them", a)
		}
		args = append(args, "'"+a+"'")
	}
	args = append(args, "'BOOTIF=01-"+strings.ReplaceAll(mac, ":", "-")+"'")
	var b strings.Builder
	b.WriteString("echo 'agentboot: loading the discovery kernel'\n")
	fmt.Fprintf(&b, "linux \"$%s/%s\" %s\n", GRUBRootVariable, kernel, strings.Join(args, " "))
	b.WriteString("echo 'agentboot: loading the discovery initrd'\n")
	fmt.Fprintf(&b, "initrd \"$%s/%s\"\n", GRUBRootVariable, initrd)
	b.WriteString("boot\n")
	return b.String(), nil
}

// grubPath is url relative to the image service's HTTP root, checked to be
// safe inside a double-quoted GRUB word.
func grubPath(s Settings, url string) (string, error) {
	base := strings.TrimSuffix(s.ImageServiceHTTPURL, "/") + "/"
	rel, ok := strings.CutPrefix(url, base)
	if !ok {
		return "", fmt.Errorf("%s is not on the image service's HTTP URL %s", url, base)
	}
	for _, c := range rel {
		if c <= ' ' || c > '~' || strings.ContainsRune(`"$\'`+"`", c) {
			return "", fmt.Errorf("URL %s has a character GRUB would interpret", url)
		}
	}
	return rel, nil
}

// GRUBDiskScript boots an installed host of arch (x86_64, aarch64) from
// its disk.
func GRUBDiskScript(arch string) string {
	return "echo 'agentboot: this host is installed; booting from disk'\n" + grubLocalBoot(arch)
}

// GRUBExitScript says why the host does not boot discovery and hands it to
// its local disk, or back to its firmware.
func GRUBExitScript(why, arch string) string {
	return "echo 'agentboot: " + GRUBText(why) + "'\necho 'agentboot: not booting discovery'\n" + grubLocalBoot(arch)
}

// grubLocalBoot chainloads the removable-media boot loader of the first
// local EFI system partition that has one (/EFI/BOOT/BOOTAA64.EFI on
// aarch64, BOOTX64.EFI on x86_64), as CoreOS installs it, and otherwise
// exits. Returning to the firmware is not enough on its own: EDK2-based
// firmware stops at its boot menu when a boot loader returns successfully,
// and GRUB 2.06 always returns success. The partition becomes $root, so
// the loader (shim on CoreOS) sees its own disk. For an unknown
// architecture it only exits.
func grubLocalBoot(arch string) string {
	loader := map[string]string{"aarch64": "/EFI/BOOT/BOOTAA64.EFI", "x86_64": "/EFI/BOOT/BOOTX64.EFI"}[arch]
	if loader == "" {
		return "echo 'agentboot: trying the next boot device'\nexit\n"
	}
	return "search --no-floppy --file --set=agentboot_disk " + loader + "\n" +
		"if [ -n \"$agentboot_disk\" ]; then\n" +
		"  echo \"agentboot: starting " + loader + " on $agentboot_disk\"\n" +
		"  set root=$agentboot_disk\n" +
		"  chainloader " + loader + "\n" +
		"  boot\n" +
		"fi\n" +
		"echo 'agentboot: no local EFI system partition has " + loader + "; trying the next boot device'\n" +
		"exit\n"
}

// GRUBRetryScript says why the host waits; agentboot's GRUB asks again
// after its own pause.
func GRUBRetryScript(why string) string {
	return "echo 'agentboot: " + GRUBText(why) + "'\n"
}

// GRUBText keeps text from objects inside a single-quoted GRUB word: no
// quotes, no line breaks, bounded length.
func GRUBText(s string) string { return scriptText(s, `'\`) }

// IPXEText keeps text from objects out of iPXE's syntax: no settings
// expansion (${...}), quotes, command separators, comments or conditionals
// (; # || &&), no line breaks, bounded length.
func IPXEText(s string) string { return scriptText(s, `${}\"';#|&`) }

// scriptText is s for a boot script's echo: each of special becomes '_',
// control and non-ASCII characters a space, and it ends after 300 bytes.
func scriptText(s, special string) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 300 {
			b.WriteString("...")
			break
		}
		switch {
		case strings.ContainsRune(special, c):
			b.WriteByte('_')
		case c < 0x20 || c > 0x7e:
			b.WriteByte(' ')
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}
