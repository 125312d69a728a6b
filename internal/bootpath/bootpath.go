// Package bootpath names the hops of a host's way from power-on to a
// registered Agent, each served by one of agentboot's components, and
// counts them (agentboot_boot_path_total{hop}): summed over the
// components, the counts are the funnel of the pool's boots.
package bootpath

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The hops, in the order a host meets them.
const (
	// DHCPOffer: the PXE service offered a network-boot client its boot
	// file.
	DHCPOffer = "dhcp_offer"
	// BootFile: the PXE service sent a file whole over TFTP.
	BootFile = "boot_file"
	// BootScript: the image service served a host's iPXE script or GRUB
	// configuration that boots discovery.
	BootScript = "boot_script"
	// Kernel, Initrd, RootFS, ISO: the image service sent the file whole.
	Kernel = "kernel"
	Initrd = "initrd"
	RootFS = "rootfs"
	ISO    = "iso"
	// Registered: the agent API registered the host (a new session).
	Registered = "registered"
	// Inventory: the agent API took the host's inventory.
	Inventory = "inventory"
)

// Hops lists them.
var Hops = []string{DHCPOffer, BootFile, BootScript, Kernel, Initrd, RootFS, ISO, Registered, Inventory}

// NewCounter returns the counter of hops, for a component with a registry
// of its own (the PXE service).
func NewCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_boot_path_total",
		Help: "Hops of the boot path served, by hop: " + strings.Join(Hops, ", ") + ".",
	}, []string{"hop"})
}

var (
	shared     *prometheus.CounterVec
	sharedOnce sync.Once
)

// Count counts a hop served by a component that reports to
// controller-runtime's registry (the image service, the agent API).
func Count(hop string) {
	sharedOnce.Do(func() {
		shared = NewCounter()
		metrics.Registry.MustRegister(shared)
	})
	shared.WithLabelValues(hop).Inc()
}
