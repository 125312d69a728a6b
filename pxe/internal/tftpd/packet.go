package tftpd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// TFTP opcodes (RFC 1350, RFC 2347).
const (
	opRRQ   = 1
	opWRQ   = 2
	opDATA  = 3
	opACK   = 4
	opERROR = 5
	opOACK  = 6
)

// TFTP error codes (RFC 1350, RFC 2347).
const (
	errUndefined = 0
	errNotFound  = 1
	errAccess    = 2
	errIllegalOp = 4
	errOptions   = 8
)

// request is a parsed read or write request.
type request struct {
	write    bool
	filename string
	mode     string // lower case: octet, netascii, mail
	// options in the order the client sent them, names in lower case;
	// a repeated name keeps its first value.
	options []option
}

type option struct{ name, value string }

// errMalformed marks a packet that is not a TFTP request.
var errMalformed = errors.New("malformed request")

// parseRequest parses an RRQ or WRQ: opcode, file name, mode and option
// pairs, each string NUL-terminated (RFC 1350, RFC 2347). Some firmware pads
// requests with extra NULs; empty option names are skipped, and a trailing
// option name without a value is ignored.
func parseRequest(p []byte) (request, error) {
	var r request
	if len(p) < 2 {
		return r, fmt.Errorf("%w: %d bytes", errMalformed, len(p))
	}
	switch op := binary.BigEndian.Uint16(p); op {
	case opRRQ:
	case opWRQ:
		r.write = true
	default:
		return r, fmt.Errorf("%w: opcode %d", errMalformed, op)
	}
	fields := bytes.Split(p[2:], []byte{0})
	// A NUL-terminated list splits into the strings and one empty tail.
	if len(fields) < 3 || len(fields[len(fields)-1]) != 0 {
		return r, fmt.Errorf("%w: file name and mode must each end with a NUL byte", errMalformed)
	}
	fields = fields[:len(fields)-1]
	r.filename, r.mode = string(fields[0]), strings.ToLower(string(fields[1]))
	if r.mode == "" {
		return r, fmt.Errorf("%w: no transfer mode", errMalformed)
	}
	for i := 2; i+1 < len(fields); i += 2 {
		name := strings.ToLower(string(fields[i]))
		if name == "" {
			i-- // padding: realign on the next string
			continue
		}
		if r.option(name) == "" {
			r.options = append(r.options, option{name, string(fields[i+1])})
		}
	}
	return r, nil
}

// option returns the value of the named option, or "".
func (r request) option(name string) string {
	for _, o := range r.options {
		if o.name == name {
			return o.value
		}
	}
	return ""
}

// negotiated is what the server accepted of a request's options.
type negotiated struct {
	blksize, windowsize int
	timeoutSeconds      int  // 0: the server's own
	tsize               bool // answer with the transfer size
}

// negotiate picks the options the server accepts (RFC 2347): blksize
// (RFC 2348) capped at maxBlksize, windowsize (RFC 7440) capped at
// maxWindow, timeout and tsize (RFC 2349). Values out of their RFC
// ranges, and unknown options, are left out of the acknowledgement, as
// RFC 2347 asks; the transfer then runs with the defaults.
func negotiate(r request, maxBlksize, maxWindow int) negotiated {
	n := negotiated{blksize: 512, windowsize: 1}
	if v, err := strconv.Atoi(r.option("blksize")); err == nil && v >= 8 && v <= 65464 {
		n.blksize = min(v, maxBlksize)
	}
	if v, err := strconv.Atoi(r.option("windowsize")); err == nil && v >= 1 && v <= 65535 {
		n.windowsize = min(v, maxWindow)
	}
	if v, err := strconv.Atoi(r.option("timeout")); err == nil && v >= 1 && v <= 255 {
		n.timeoutSeconds = v
	}
	n.tsize = r.option("tsize") == "0"
	return n
}

// appendOACK appends the option acknowledgement for n, in the order the
// client sent its options, or nothing when no option was accepted.
func appendOACK(b []byte, r request, n negotiated, size int) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint16(b, opOACK)
	accepted := false
	for _, o := range r.options {
		var v int
		switch {
		case o.name == "blksize" && n.blksize != 512:
			v = n.blksize
		case o.name == "windowsize" && n.windowsize != 1:
			v = n.windowsize
		case o.name == "timeout" && n.timeoutSeconds != 0:
			v = n.timeoutSeconds
		case o.name == "tsize" && n.tsize:
			v = size
		default:
			continue
		}
		b = append(append(b, o.name...), 0)
		b = append(strconv.AppendInt(b, int64(v), 10), 0)
		accepted = true
	}
	if !accepted {
		return b[:start]
	}
	return b
}

// appendError appends an ERROR packet.
func appendError(b []byte, code uint16, msg string) []byte {
	b = binary.BigEndian.AppendUint16(b, opERROR)
	b = binary.BigEndian.AppendUint16(b, code)
	return append(append(b, msg...), 0)
}

// toNetascii converts content for netascii mode (RFC 764 via RFC 1350):
// LF becomes CR LF, and a bare CR becomes CR NUL.
func toNetascii(data []byte) []byte {
	out := make([]byte, 0, len(data)+len(data)/16)
	for _, c := range data {
		switch c {
		case '\n':
			out = append(out, '\r', '\n')
		case '\r':
			out = append(out, '\r', 0)
		default:
			out = append(out, c)
		}
	}
	return out
}

// clientAddress reports whether a request's source can be a client's: no
// client sends from port 0, a broadcast, multicast or unspecified address,
// and answering such a source would reflect packets at a forged address.
func clientAddress(ap netip.AddrPort) bool {
	a := ap.Addr()
	return ap.Port() != 0 && (a.IsGlobalUnicast() || a.IsLoopback())
}
