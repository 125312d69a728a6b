package erase

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes of the identify data the parsers read.
const (
	nvmeIdentifySize = 4096
	ataIdentifySize  = 512
)

var errShortIdentify = errors.New("identify data too short")

// nvmeController is what Identify Controller (CNS 01h) says about erasing.
type nvmeController struct {
	formatNVM      bool // OACS bit 1: Format NVM is supported
	formatCrypto   bool // FNA bit 2: a format can erase cryptographically
	sanitizeCrypto bool // SANICAP bit 0
	sanitizeBlock  bool // SANICAP bit 1
	sanitizeOver   bool // SANICAP bit 2 (overwrite; not used: an overwrite is no faster here)
	// A format of one namespace formats every namespace of the NVM
	// subsystem (FNA bit 0), or its secure erase erases them all (FNA
	// bit 1).
	formatAll, eraseAll bool
	// namespaces is the highest namespace ID the NVM subsystem may have
	// (NN): 1 means this namespace can be its only one.
	namespaces uint32
}

// formatsOnlyOne reports whether a Format NVM sent to one namespace
// erases that namespace alone: the subsystem formats namespaces one by
// one, or it can have only one. Otherwise it could erase another
// namespace: a disk to keep, or the boot medium.
func (c nvmeController) formatsOnlyOne() bool {
	return !c.formatAll && !c.eraseAll || c.namespaces == 1
}

// parseNVMeController reads the NVMe base specification's Identify
// Controller data structure: OACS at bytes 257:256, SANICAP at bytes
// 331:328, NN at bytes 519:516, FNA at byte 524.
func parseNVMeController(id []byte) (nvmeController, error) {
	if len(id) < nvmeIdentifySize {
		return nvmeController{}, errShortIdentify
	}
	oacs := binary.LittleEndian.Uint16(id[256:258])
	fna := id[524]
	sanicap := binary.LittleEndian.Uint32(id[328:332])
	return nvmeController{
		formatNVM:      oacs&(1<<1) != 0,
		formatCrypto:   oacs&(1<<1) != 0 && fna&(1<<2) != 0,
		sanitizeCrypto: sanicap&(1<<0) != 0,
		sanitizeBlock:  sanicap&(1<<1) != 0,
		sanitizeOver:   sanicap&(1<<2) != 0,
		formatAll:      fna&(1<<0) != 0,
		eraseAll:       fna&(1<<1) != 0,
		namespaces:     binary.LittleEndian.Uint32(id[516:520]),
	}, nil
}

// nvmeNamespace is how a namespace is formatted now (Identify Namespace,
// CNS 00h), which a Format NVM that erases must keep.
type nvmeNamespace struct {
	lbaf     uint8 // the LBA format in use, 0 to 63
	extended bool  // metadata travels at the end of each block (MSET)
	pi       uint8 // protection information type, 0 for none
	piFirst  bool  // protection information in the first bytes of the metadata (PIL)
}

// parseNVMeNamespace reads Identify Namespace: NLBAF at byte 25, FLBAS at
// byte 26 (format index bits 3:0 and, for more than 16 formats, 6:5;
// MSET bit 4), DPS at byte 29 (type bits 2:0, PIL bit 3).
func parseNVMeNamespace(id []byte) (nvmeNamespace, error) {
	if len(id) < nvmeIdentifySize {
		return nvmeNamespace{}, errShortIdentify
	}
	nlbaf, flbas, dps := id[25], id[26], id[29]
	n := nvmeNamespace{
		lbaf:     flbas&0x0f | (flbas>>5&0x03)<<4,
		extended: flbas&(1<<4) != 0,
		pi:       dps & 0x07,
		piFirst:  dps&(1<<3) != 0,
	}
	// NLBAF is zero-based: a namespace in a format it does not list is a
	// reply not to act on.
	if n.lbaf > nlbaf {
		return nvmeNamespace{}, fmt.Errorf("identify namespace: LBA format %d in use, but only %d listed", n.lbaf, int(nlbaf)+1)
	}
	if n.pi > 3 {
		return nvmeNamespace{}, fmt.Errorf("identify namespace: protection information type %d", n.pi)
	}
	return n, nil
}

// parseFormatProgress reads the Format Progress Indicator of Identify
// Namespace (byte 32): bit 7 says the drive keeps one, bits 6:0 the
// percentage of the namespace that remains to be formatted.
func parseFormatProgress(id []byte) (float64, bool) {
	if len(id) < nvmeIdentifySize || id[32]&0x80 == 0 {
		return 0, false
	}
	return 1 - float64(min(id[32]&0x7f, 100))/100, true
}

// Secure erase settings of Format NVM (SES).
const (
	sesUserData = 1
	sesCrypto   = 2
)

// formatCDW10 is Format NVM's command dword 10 that keeps the namespace as
// it is formatted and erases with ses: LBAF bits 3:0 and 13:12, MSET bit
// 4, PI bits 7:5, PIL bit 8, SES bits 11:9.
func (n nvmeNamespace) formatCDW10(ses uint32) uint32 {
	v := uint32(n.lbaf&0x0f) | uint32(n.lbaf>>4)<<12 | uint32(n.pi)<<5 | (ses&0x7)<<9
	if n.extended {
		v |= 1 << 4
	}
	if n.piFirst {
		v |= 1 << 8
	}
	return v
}

// ataIdentity is what IDENTIFY DEVICE says about erasing.
type ataIdentity struct {
	securitySupported bool // word 128 bit 0 (and word 82 bit 1)
	securityEnabled   bool // word 128 bit 1: a user password is set
	securityLocked    bool // word 128 bit 2
	securityFrozen    bool // word 128 bit 3
	enhancedErase     bool // word 128 bit 5
}

// parseATAIdentify reads the ACS IDENTIFY DEVICE data: 256 little-endian
// words (security in words 82 and 128).
func parseATAIdentify(id []byte) (ataIdentity, error) {
	if len(id) < ataIdentifySize {
		return ataIdentity{}, errShortIdentify
	}
	word := func(n int) uint16 { return binary.LittleEndian.Uint16(id[2*n : 2*n+2]) }
	w82, w128 := word(82), word(128)
	// Word 82 is valid only when it is neither 0000h nor FFFFh.
	supported := w82 != 0 && w82 != 0xffff && w82&(1<<1) != 0 && w128&1 != 0
	return ataIdentity{
		securitySupported: supported,
		securityEnabled:   supported && w128&(1<<1) != 0,
		securityLocked:    supported && w128&(1<<2) != 0,
		securityFrozen:    supported && w128&(1<<3) != 0,
		enhancedErase:     supported && w128&(1<<5) != 0,
	}, nil
}
