package stack

import (
	"fmt"
	"time"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// LargeServerInventory is the inventory of a large 2-socket server, as the
// agent reports one: 2 × 64 cores with SMT and the x86 flags of a current
// server CPU, 24 NVMe data disks and 2 boot SSDs with every identifier
// filled, 8 NICs (3 dual-port 25G, 2 onboard 1G) each with 2 IPv4 and
// 3 IPv6 addresses, and 8 GPUs. It sets agentwire.MaxStoredInventoryBytes and
// exercises the limits in tests.
func LargeServerInventory(now time.Time) *agentwire.Inventory {
	flags := []string{"fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "sep", "mtrr", "pge", "mca", "cmov", "pat", "pse36", "clflush", "mmx", "fxsr", "sse", "sse2", "ht", "syscall", "nx", "mmxext", "fxsr_opt", "pdpe1gb", "rdtscp", "lm", "constant_tsc", "rep_good", "nopl", "nonstop_tsc", "cpuid", "extd_apicid", "aperfmperf", "rapl", "pni", "pclmulqdq", "monitor", "ssse3", "fma", "cx16", "pcid", "sse4_1", "sse4_2", "x2apic", "movbe", "popcnt", "aes", "xsave", "avx", "f16c", "rdrand", "lahf_lm", "cmp_legacy", "svm", "extapic", "cr8_legacy", "abm", "sse4a", "misalignsse", "3dnowprefetch", "osvw", "ibs", "skinit", "wdt", "tce", "topoext", "perfctr_core", "perfctr_nb", "bpext", "perfctr_llc", "mwaitx", "cpb", "cat_l3", "cdp_l3", "invpcid_single", "hw_pstate", "ssbd", "mba", "perfmon_v2", "ibrs", "ibpb", "stibp", "ibrs_enhanced", "vmmcall", "fsgsbase", "bmi1", "avx2", "smep", "bmi2", "erms", "invpcid", "cqm", "rdt_a", "avx512f", "avx512dq", "rdseed", "adx", "smap", "avx512ifma", "clflushopt", "clwb", "avx512cd", "sha_ni", "avx512bw", "avx512vl", "xsaveopt", "xsavec", "xgetbv1", "xsaves", "cqm_llc", "cqm_occup_llc", "cqm_mbm_total", "cqm_mbm_local", "avx512_bf16", "clzero", "irperf", "xsaveerptr", "rdpru", "wbnoinvd", "amd_ppin", "cppc", "arat", "npt", "lbrv", "svm_lock", "nrip_save", "tsc_scale", "vmcb_clean", "flushbyasid", "decodeassists", "pausefilter", "pfthreshold", "avic", "v_vmsave_vmload", "vgif", "x2avic", "v_spec_ctrl", "vnmi", "avx512vbmi", "umip", "pku", "ospke", "avx512_vbmi2", "gfni", "vaes", "vpclmulqdq", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "la57", "rdpid", "overflow_recov", "succor", "smca", "fsrm", "flush_l1d"}
	inv := &agentwire.Inventory{
		ReportTime:   &now,
		Hostname:     "worker-r12-u07.rack12.datacenter-east.example.com",
		BmcAddress:   "10.20.12.107",
		BmcV6Address: "2001:db8:20:12::107",
		Memory:       agentwire.Memory{PhysicalBytes: 2 << 40, UsableBytes: 2<<40 - 8<<30},
		CPU:          agentwire.CPU{Count: 256, ClockMegahertz: 2450, Flags: flags, ModelName: "Example EPYC-class 9754 128-Core Processor", Architecture: "x86_64"},
		Boot:         agentwire.Boot{CurrentBootMode: "uefi", PxeInterface: "eno1", SecureBootState: "enabled"},
		SystemVendor: agentwire.SystemVendor{Manufacturer: "Example Systems Inc.", ProductName: "ES-R2900 Gen11 2U 2-Socket Rack Server", SerialNumber: "ESX2900G11-0012345678"},
		Virtualization: &agentwire.Virtualization{Verdict: agentwire.VirtSupported, Reason: "KVM runs a guest: AMD-V with nested paging, SEV-SNP available",
			KVMDevicePresent: true, KVMUsable: true},
	}
	for i := range 24 {
		inv.Disks = append(inv.Disks, agentwire.Disk{
			ID: fmt.Sprintf("/dev/disk/by-id/nvme-EXAMPLE_NVME_3T84_ESN%010d", 4000000000+i), Name: fmt.Sprintf("nvme%dn1", i), Path: fmt.Sprintf("/dev/nvme%dn1", i),
			ByPath: fmt.Sprintf("/dev/disk/by-path/pci-0000:%02x:00.0-nvme-1", 0x41+i), ByID: fmt.Sprintf("/dev/disk/by-id/nvme-EXAMPLE_NVME_3T84_ESN%010d", 4000000000+i),
			DriveType: "SSD", Vendor: "Example", Model: "EXAMPLE NVME 3T84 PCIe Gen5 U.2", Serial: fmt.Sprintf("ESN%010d", 4000000000+i),
			Wwn: fmt.Sprintf("eui.36344730%08x0025384500000001", i), SizeBytes: 3_840_755_982_336,
			InstallationEligibility: agentwire.InstallationEligibility{Eligible: true, NotEligibleReasons: []string{}},
		})
	}
	for i := range 2 {
		inv.Disks = append(inv.Disks, agentwire.Disk{
			ID: fmt.Sprintf("/dev/disk/by-id/wwn-0x5002538f4%07x", i), Name: fmt.Sprintf("sd%c", 'a'+i), Path: fmt.Sprintf("/dev/sd%c", 'a'+i),
			ByPath: fmt.Sprintf("/dev/disk/by-path/pci-0000:c1:00.0-ata-%d", i+1), ByID: fmt.Sprintf("/dev/disk/by-id/ata-EXAMPLE_BOOT_SSD_480G_S%09d", 700000000+i),
			DriveType: "SSD", Vendor: "ATA", Model: "EXAMPLE BOOT SSD 480G M.2", Serial: fmt.Sprintf("S%09d", 700000000+i),
			Wwn: fmt.Sprintf("0x5002538f4%07x", i), Hctl: fmt.Sprintf("%d:0:0:0", i), SizeBytes: 480_103_981_056, Bootable: true,
			InstallationEligibility: agentwire.InstallationEligibility{Eligible: true, NotEligibleReasons: []string{}},
		})
	}
	for i := range 8 {
		name, speed, product := fmt.Sprintf("ens%df%d", 1+i/2, i%2), int64(25000), "MT2894 Family [ConnectX-6 Lx]"
		if i >= 6 {
			name, speed, product = fmt.Sprintf("eno%d", i-5), 1000, "NetXtreme BCM5720 Gigabit Ethernet PCIe"
		}
		inv.Interfaces = append(inv.Interfaces, agentwire.Interface{
			Name: name, MacAddress: fmt.Sprintf("b8:3f:d2:%02x:%02x:%02x", i, 0x10+i, 0x20+i),
			IPV4Addresses: []string{fmt.Sprintf("10.12.%d.107/24", i), fmt.Sprintf("172.20.%d.107/22", i)},
			IPV6Addresses: []string{fmt.Sprintf("2001:db8:12:%d::107/64", i), fmt.Sprintf("fd00:12:%d::107/64", i), fmt.Sprintf("fe80::ba3f:d2ff:fe%02x:%02x%02x/64", i, 0x10+i, 0x20+i)},
			Mtu:           9000, SpeedMbps: speed, HasCarrier: true, Vendor: "0x15b3", Product: product, Biosdevname: fmt.Sprintf("p%dp%d", 1+i/2, 1+i%2),
			ClientID: fmt.Sprintf("ff:00:00:00:%02x:00:01:00:01:2c:5e:4a:1b:b8:3f:d2:%02x:%02x:%02x", i, i, 0x10+i, 0x20+i),
			Flags:    []string{"up", "broadcast", "multicast", "running", "lower_up"},
		})
	}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, agentwire.GPU{Address: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10), Vendor: "NVIDIA Corporation", VendorID: "10de", DeviceID: "2330",
			Name: "GH100 [H100 SXM5 80GB]"})
	}
	return inv
}
