// Package tftpd is the PXE service's TFTP server: read only, it serves the
// iPXE binaries by exact name from an allowlist (no paths, no directory
// listing, no uploads) and speaks RFC 1350 with the blksize, tsize and
// timeout options (RFC 2347-2349) and windowsize (RFC 7440). It owns its
// sockets and nothing else; the listening socket is the caller's.
//
// Every transfer runs from one event loop (loop_linux.go says why), each on
// a socket of its own connected to its client, or all on the listening
// socket in single-port mode. A request it cannot serve gets an error
// packet; a packet that is no request, or a request beyond the transfer
// limits, is dropped and counted (agentboot_tftp_dropped_total), and a
// client that stops answering is given up after the retries.
package tftpd
