// Package sanitize decides how a released host's disks are erased before the
// host can be bound again: from the level the admin set and what each device
// reports it can do, the method that leaves no previous data readable through
// the block device, and how the result is verified. It decides only; the
// on-host agent erases and the service keeps the host quarantined until the
// evidence is in. It is shared by both, so it must stay free of Kubernetes
// and of I/O.
package sanitize

import "fmt"

// Level is how thoroughly disks are erased.
type Level string

// Levels.
const (
	// None erases nothing.
	None Level = "none"
	// Metadata removes partition tables and file system, RAID and LVM
	// signatures: the next installation starts clean, but the data stays
	// on the disk for anyone reading the block device.
	Metadata Level = "metadata"
	// Erase leaves no previous data readable through the block device on
	// any disk: the default.
	Erase Level = "erase"
)

// ParseLevel reads a level as an admin writes it.
func ParseLevel(s string) (Level, error) {
	switch l := Level(s); l {
	case None, Metadata, Erase:
		return l, nil
	case "":
		return Erase, nil
	}
	return "", fmt.Errorf("disk sanitization level %q: want none, metadata or erase", s)
}

// Device is what the agent found out about one disk.
type Device struct {
	// BootMedium: the host booted from it (a BMC's virtual media, a USB
	// stick); it is never erased.
	BootMedium bool
	// Empty: a drive without a medium (a card reader, a BMC's virtual
	// floppy with nothing inserted): nothing to erase.
	Empty bool
	// NoCapacity: a fixed disk that reports no capacity (an NVMe
	// namespace whose format was cut off, a disk formatted with a sector
	// size the kernel does not take): nothing can be read or written, but
	// what it held may come back once it is formatted again.
	NoCapacity bool
	// Kept: the admin marked it to keep.
	Kept bool
	// ReadOnly devices cannot be erased.
	ReadOnly bool
	// WriteZeroes: the device zeroes ranges itself (NVMe Write Zeroes,
	// SCSI WRITE SAME, virtio-blk write-zeroes), often by deallocating
	// them. Unlike a discard (TRIM, UNMAP, Deallocate), which a device may
	// ignore in part and whose "reads back zeros" bits many drives get
	// wrong, the command guarantees zeros.
	WriteZeroes bool
	// NVMe sanitize actions the controller supports (SANICAP).
	NVMeSanitizeCrypto, NVMeSanitizeBlock bool
	// NVMeFormatCrypto and NVMeFormatUserData: Format NVM with secure
	// erase settings 2 and 1 (FNA).
	NVMeFormatCrypto, NVMeFormatUserData bool
	// ATA security feature set: supported, and the enhanced erase; Frozen
	// (the firmware locked it at boot) makes it unusable until a power
	// cycle.
	ATASecurityErase, ATAEnhancedErase, ATAFrozen bool
}

// Method is how one disk is erased.
type Method string

// Methods, from the fastest.
const (
	Skip Method = "skip"
	// Unerasable: the device holds data it cannot be made to erase; the
	// host stays quarantined until an administrator removes the disk or
	// marks it to keep.
	Unerasable         Method = "unerasable"
	WipeMetadata       Method = "wipe-metadata"
	NVMeSanitizeCrypto Method = "nvme-sanitize-crypto"
	NVMeFormatCrypto   Method = "nvme-format-crypto"
	NVMeSanitizeBlock  Method = "nvme-sanitize-block"
	WriteZeroes        Method = "write-zeroes"
	ATAEnhancedErase   Method = "ata-enhanced-security-erase"
	ATASecurityErase   Method = "ata-security-erase"
	NVMeFormatUserData Method = "nvme-format-user-data"
	Overwrite          Method = "overwrite"
)

// Verification is how an erase is checked afterwards.
type Verification string

// Verifications.
const (
	// NotVerified: nothing was erased (Skip).
	NotVerified Verification = ""
	// ReadsZero: sampled blocks across the disk, and its first and last
	// MiB, all read back as zeros.
	ReadsZero Verification = "sampled-reads-zero"
	// ReadsChanged: the drive reported the command complete; random data
	// written just before the erase to the first and last MiB and to
	// sampled blocks no longer reads back in any logical block; blocks of
	// the previous data read just before at other sampled places do not
	// read back as they were; and where the erased random data reads as
	// one repeated byte, so do those blocks. (A cryptographic erase leaves
	// noise, a user-data erase or an ATA erase zeros, ones or the maker's
	// pattern: the standards promise only that the data is gone.)
	ReadsChanged Verification = "sampled-reads-changed"
	// MetadataReadsZero: the first and last MiB of the disk and of each
	// partition, where partition tables and the signatures of file
	// systems, RAID and LVM live, read back as zeros.
	MetadataReadsZero Verification = "metadata-regions-read-zero"
)

// Plan is what happens to one disk, and why.
type Plan struct {
	Method Method
	Verify Verification
	Why    string
}

// verification is how each method's result is checked.
var verification = map[Method]Verification{
	WipeMetadata:       MetadataReadsZero,
	NVMeSanitizeCrypto: ReadsChanged,
	NVMeFormatCrypto:   ReadsChanged,
	NVMeSanitizeBlock:  ReadsChanged,
	WriteZeroes:        ReadsZero,
	ATAEnhancedErase:   ReadsChanged,
	ATASecurityErase:   ReadsChanged,
	NVMeFormatUserData: ReadsChanged,
	Overwrite:          ReadsZero,
}

// Methods lists every method, from the fastest.
func Methods() []Method {
	return []Method{Skip, Unerasable, WipeMetadata, NVMeSanitizeCrypto, NVMeFormatCrypto, NVMeSanitizeBlock,
		WriteZeroes, ATAEnhancedErase, ATASecurityErase, NVMeFormatUserData, Overwrite}
}

// VerificationOf is how a disk erased by m is checked; NotVerified for
// Skip, Unerasable and a method this package does not know.
func VerificationOf(m Method) Verification { return verification[m] }

// ErasesEveryBlock reports whether m reaches every block of the disk (it
// gives the erase level), as opposed to sparing the disk or wiping its
// metadata only. Such an erase can take hours: the agent disarms every
// disk before the first starts, and weighs progress by their bytes.
func (m Method) ErasesEveryBlock() bool {
	return verification[m] != NotVerified && m != WipeMetadata
}

// Gives reports whether a disk erased by m meets level. Skip and
// Unerasable never do: a spared disk is judged by why it was spared.
func Gives(m Method, level Level) bool {
	switch {
	case m == WipeMetadata:
		return level == Metadata
	case m.ErasesEveryBlock():
		return level == Metadata || level == Erase
	}
	return false
}

// Offers reports whether dev can be erased by m: the device supports the
// command (and, for the ATA security erase, the firmware has not frozen
// it). Every writable disk can be overwritten.
func Offers(dev Device, m Method) bool {
	switch m {
	case NVMeSanitizeCrypto:
		return dev.NVMeSanitizeCrypto
	case NVMeFormatCrypto:
		return dev.NVMeFormatCrypto
	case NVMeSanitizeBlock:
		return dev.NVMeSanitizeBlock
	case WriteZeroes:
		return dev.WriteZeroes
	case ATAEnhancedErase:
		return dev.ATASecurityErase && dev.ATAEnhancedErase && !dev.ATAFrozen
	case ATASecurityErase:
		return dev.ATASecurityErase && !dev.ATAFrozen
	case NVMeFormatUserData:
		return dev.NVMeFormatUserData
	case Overwrite:
		return true
	}
	return false
}

// Force is Choose with the method of the erase level given: for an admin
// trying a drive's own command by hand (agent sanitize --method), and for
// the lab, whose devices also offer faster methods. A disk Choose spares,
// refuses or only wipes the metadata of gets Choose's plan; one that does
// not offer m is Unerasable, saying so.
func Force(level Level, dev Device, m Method) Plan {
	p := Choose(level, dev)
	if !p.Method.ErasesEveryBlock() {
		return p
	}
	if !m.ErasesEveryBlock() {
		return Plan{Method: Unerasable, Why: fmt.Sprintf("%q is not a method of the erase level", m)}
	}
	if !Offers(dev, m) {
		return Plan{Method: Unerasable, Why: fmt.Sprintf("the device does not offer %s (it would get %s)", m, p.Method)}
	}
	return Plan{Method: m, Verify: VerificationOf(m), Why: fmt.Sprintf("%s was asked for (the device would get %s)", m, p.Method)}
}

// Choose picks the method for dev at level: the fastest one that gives the
// level's guarantee on that device.
func Choose(level Level, dev Device) Plan {
	switch {
	case level == None:
		return Plan{Method: Skip, Why: "the sanitization level is none"}
	case dev.Empty:
		return Plan{Method: Skip, Why: "the device holds no medium"}
	case dev.BootMedium:
		return Plan{Method: Skip, Why: "the host booted from this device"}
	case dev.Kept:
		return Plan{Method: Skip, Why: "the admin marked this disk to keep"}
	case dev.NoCapacity:
		return Plan{Method: Unerasable, Why: "the disk reports no capacity (an NVMe namespace whose format was cut off, a disk formatted with a sector size the kernel does not take), and what it held may come back once it is formatted again: format it (with a secure erase), remove it, or mark it to keep"}
	case dev.ReadOnly:
		return Plan{Method: Unerasable, Why: "the device is read-only, so what it holds cannot be erased: remove it, or mark it to keep"}
	case level == Metadata:
		return Plan{Method: WipeMetadata, Verify: MetadataReadsZero, Why: "the sanitization level is metadata"}
	}
	// A cryptographic erase changes the media key: seconds, and it also
	// covers blocks the drive remapped or keeps in reserve.
	if dev.NVMeSanitizeCrypto {
		return Plan{Method: NVMeSanitizeCrypto, Verify: ReadsChanged, Why: "the NVMe controller supports a cryptographic sanitize"}
	}
	if dev.NVMeFormatCrypto {
		return Plan{Method: NVMeFormatCrypto, Verify: ReadsChanged, Why: "the NVMe controller supports a cryptographic erase on format"}
	}
	if dev.NVMeSanitizeBlock {
		return Plan{Method: NVMeSanitizeBlock, Verify: ReadsChanged, Why: "the NVMe controller supports a block-erase sanitize"}
	}
	// The device zeroing (often deallocating) its blocks itself is as
	// fast as a discard, and unlike a discard it guarantees zeros.
	if dev.WriteZeroes {
		return Plan{Method: WriteZeroes, Verify: ReadsZero, Why: "the device zeroes blocks itself (Write Zeroes)"}
	}
	if dev.ATASecurityErase && !dev.ATAFrozen {
		if dev.ATAEnhancedErase {
			return Plan{Method: ATAEnhancedErase, Verify: ReadsChanged, Why: "the drive supports the ATA enhanced security erase"}
		}
		return Plan{Method: ATASecurityErase, Verify: ReadsChanged, Why: "the drive supports the ATA security erase"}
	}
	if dev.NVMeFormatUserData {
		return Plan{Method: NVMeFormatUserData, Verify: ReadsChanged, Why: "the NVMe controller supports a user-data erase on format"}
	}
	why := "no erase command the device offers guarantees it, so every block is written with zeros"
	if dev.ATASecurityErase && dev.ATAFrozen {
		why = "the drive's ATA security erase is frozen by the firmware, so every block is written with zeros"
	}
	return Plan{Method: Overwrite, Verify: ReadsZero, Why: why}
}

// Stronger is the stronger of two levels as recorded on an Agent (an empty
// or unknown one counts as none).
func Stronger(a, b string) string {
	rank := map[string]int{string(Metadata): 1, string(Erase): 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}
