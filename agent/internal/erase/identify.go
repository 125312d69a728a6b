package erase

import (
	"encoding/binary"
	"errors"
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
}

// parseNVMeController reads the NVMe base specification's Identify
// Controller data structure: OACS at bytes 257:256, FNA at byte 524,
// SANICAP at bytes 331:328.
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
	}, nil
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
