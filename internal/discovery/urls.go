package discovery

import (
	"fmt"
	"strings"

	"github.com/agentboot/agentboot/internal/osimage"
)

// Files the image service serves for each InfraEnv.
const (
	FileISO        = "discovery.iso" // the flavour of spec.imageType
	FileFullISO    = "full.iso"
	FileMinimalISO = "minimal.iso"
	FileKernel     = "vmlinuz"
	FileInitrd     = "initrd.img"
	FileRootfs     = "rootfs.img"
	FileIPXE       = "boot.ipxe"
	FileIgnition   = "discovery.ign"
	// FileDisk is the OS disk image hosts install, as the catalog has it
	// (raw, gzip or xz).
	FileDisk = "disk.img"
)

// DiskImageURL is where hosts fetch the OS disk image they install: the
// image service's HTTPS listener, which hosts trust through the CA bundle
// of their discovery Ignition.
func DiskImageURL(s Settings, image osimage.Key) string {
	return strings.TrimSuffix(s.ImageServiceURL, "/") + BootArtifactPath(image.Arch, image.Version, FileDisk)
}

// BootArtifactPath is the path of a file of an OS image itself, the same for
// every InfraEnv (kernel, root filesystem): /boot-artifacts/<arch>/<version>/<file>.
// These are the public OS bits and carry no token.
func BootArtifactPath(arch, version, file string) string {
	return fmt.Sprintf("/boot-artifacts/%s/%s/%s", arch, version, file)
}

// ImagePath is the path of an InfraEnv's file: /images/<uid>/<version>/<file>.
// The InfraEnv's UID, not its name, keeps URLs short enough for the ISO's
// kernel-argument area.
func ImagePath(uid, version, file string) string {
	return fmt.Sprintf("/images/%s/%s/%s", uid, version, file)
}

// URLs are the signed URLs of one InfraEnv's content.
type URLs struct {
	ISO, FullISO, MinimalISO     string
	Kernel, Initrd, Rootfs, IPXE string
	Ignition                     string
}

func newURLs(s Settings, image osimage.Key, uid, version, token string) URLs {
	at := func(base, file string) string {
		return strings.TrimSuffix(base, "/") + ImagePath(uid, version, file) + "?token=" + token
	}
	artifact := func(file string) string {
		return strings.TrimSuffix(s.ImageServiceHTTPURL, "/") + BootArtifactPath(image.Arch, image.Version, file)
	}
	isoBase := s.ImageServiceURL
	if s.ISOOverHTTP {
		isoBase = s.ImageServiceHTTPURL
	}
	return URLs{
		ISO:        at(isoBase, FileISO),
		FullISO:    at(isoBase, FileFullISO),
		MinimalISO: at(isoBase, FileMinimalISO),
		// Stock iPXE speaks plain HTTP only, and CoreOS checks the root
		// filesystem against a digest in its initramfs, not against TLS.
		Kernel: artifact(FileKernel),
		Initrd: at(s.ImageServiceHTTPURL, FileInitrd),
		Rootfs: artifact(FileRootfs),
		IPXE:   at(s.ImageServiceHTTPURL, FileIPXE),
		// The Ignition holds the registration token: HTTPS only.
		Ignition: at(s.ImageServiceURL, FileIgnition),
	}
}

// IPXEScript boots the discovery image.
func (o *Output) IPXEScript() string {
	return fmt.Sprintf("#!ipxe\ninitrd --name initrd %s\nkernel %s %s\nboot\n", o.URLs.Initrd, o.URLs.Kernel, o.PXEKargs)
}

// IPXEChainScript is the BootOrderControl script: it asks again with the
// booting MAC, so the service can send an installed host to its disk.
func (o *Output) IPXEChainScript() string {
	return fmt.Sprintf("#!ipxe\nchain %s&mac=${net0/mac}\n", o.URLs.IPXE)
}

// IPXEExitScript makes iPXE give up network boot, so firmware boots the disk.
const IPXEExitScript = "#!ipxe\necho agentboot: this host is installed; booting from disk\nexit\n"
