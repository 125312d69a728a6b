package inventory

import (
	"fmt"
	"strconv"
	"strings"
)

// Arm CPUs name themselves by implementer and part number (MIDR_EL1), not
// by a model string: the names of the server and common cores, as the
// Linux kernel's cputype.h and Arm's technical reference manuals give them.
var armImplementers = map[uint64]string{
	0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
	0x4e: "NVIDIA", 0x50: "Applied Micro", 0x51: "Qualcomm", 0x61: "Apple", 0xc0: "Ampere",
}

var armParts = map[uint64]map[uint64]string{
	0x41: {
		0xd03: "Cortex-A53", 0xd07: "Cortex-A57", 0xd08: "Cortex-A72", 0xd0b: "Cortex-A76",
		0xd0c: "Neoverse-N1", 0xd40: "Neoverse-V1", 0xd49: "Neoverse-N2", 0xd4f: "Neoverse-V2",
		0xd84: "Neoverse-V3", 0xd8e: "Neoverse-N3",
	},
	0x43: {0x0af: "ThunderX2", 0x0b8: "ThunderX3"},
	0x46: {0x001: "A64FX"},
	0x48: {0xd01: "Kunpeng 920"},
	0x50: {0x000: "X-Gene"},
	0xc0: {0xac3: "AmpereOne", 0xac4: "AmpereOne AC04"},
}

// ArmCPUName names an Arm CPU from cpuinfo's "CPU implementer" and "CPU
// part" (hexadecimal): "Ampere AmpereOne", or what is known of an
// unlisted one ("Arm CPU part 0xd99"; implementer 0 is a software model,
// such as qemu's "max" CPU).
func ArmCPUName(implementer, part string) string {
	impl, err := strconv.ParseUint(strings.TrimSpace(implementer), 0, 8)
	if err != nil {
		return ""
	}
	p, perr := strconv.ParseUint(strings.TrimSpace(part), 0, 12)
	vendor, known := armImplementers[impl]
	if !known {
		if impl == 0 {
			vendor = "software-defined Arm"
		} else {
			vendor = fmt.Sprintf("Arm implementer 0x%02x", impl)
		}
	}
	if perr != nil {
		return vendor + " CPU"
	}
	if name, ok := armParts[impl][p]; ok {
		if vendor == "Arm" || strings.HasPrefix(name, vendor) {
			return name
		}
		return vendor + " " + name
	}
	return fmt.Sprintf("%s CPU part 0x%03x", vendor, p)
}
