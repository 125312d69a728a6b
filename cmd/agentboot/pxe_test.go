package main

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/pxe"
)

func parsePXEFlags(t *testing.T, args string) (pxe.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("pxe", flag.ContinueOnError)
	var p pxeFlags
	p.register(fs, "")
	require.NoError(t, fs.Parse(strings.Fields(args)))
	return p.config("", logr.Discard())
}

func TestPXEFlags(t *testing.T) {
	base := "--interface br0 --boot-script-url http://198.18.0.1:8080/boot.ipxe "
	cfg, err := parsePXEFlags(t, base)
	require.NoError(t, err)
	require.Equal(t, pxe.ProxyDHCP, cfg.Mode)
	// Relays apply in proxy mode too: a site's relay forwards to its DHCP
	// server and to the PXE service.
	cfg, err = parsePXEFlags(t, base+"--dhcp-relays 198.18.6.1,198.18.9.1")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("198.18.6.1"), netip.MustParseAddr("198.18.9.1")}, cfg.Relays)
	cfg, err = parsePXEFlags(t, base+"--secure-boot")
	require.NoError(t, err)
	require.Equal(t, "/usr/lib/shim/shimx64.efi.signed", cfg.ShimBinary, "Debian's, by default")
	require.Equal(t, "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed", cfg.SignedGRUBBinary)
	cfg, err = parsePXEFlags(t, base+"--secure-boot --shim-binary /opt/shim.efi")
	require.NoError(t, err)
	require.Equal(t, "/opt/shim.efi", cfg.ShimBinary)

	cfg, err = parsePXEFlags(t, base+"--mode authoritative --server-ip 198.18.0.1 --pool 198.18.0.100-198.18.0.150 --router 198.18.0.254 "+
		"--dns 198.18.0.53,198.18.0.54 --reservation 52:54:00:AA:00:01=198.18.0.20 --reservation 52-54-00-aa-00-02=198.18.0.21")
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("198.18.0.100"), cfg.PoolStart)
	require.Equal(t, netip.MustParseAddr("198.18.0.150"), cfg.PoolEnd)
	require.Len(t, cfg.DNS, 2)
	require.Equal(t, map[string]netip.Addr{
		"52:54:00:aa:00:01": netip.MustParseAddr("198.18.0.20"),
		"52:54:00:aa:00:02": netip.MustParseAddr("198.18.0.21"),
	}, cfg.Reservations)

	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(good, []byte("0123456789abcdef-token\n"), 0o600))
	require.NoError(t, os.WriteFile(short, []byte("abc\n"), 0o600))
	cfg, err = parsePXEFlags(t, base+"--metrics-token-file "+good)
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef-token", cfg.MetricsToken)

	auth := base + "--mode authoritative --pool 198.18.0.100-198.18.0.150 "
	for args, want := range map[string]string{
		base + "--metrics-token-file " + short:                                                         "--metrics-token-file: " + short + " holds no usable token",
		base + "--metrics-token-file " + filepath.Join(dir, "none"):                                    "--metrics-token-file: open " + filepath.Join(dir, "none"),
		"--boot-script-url http://x/boot.ipxe":                                                         "--interface: required",
		"--interface br0":                                                                              "--boot-script-url: required",
		base + "--pool 198.18.0.2-198.18.0.3":                                                          "--pool: only applies in authoritative mode",
		base + "--reservation 52:54:00:00:00:01=198.18.0.2":                                            "--reservation: only applies",
		base + "--server-ip 2001:db8::1":                                                               `--server-ip: "2001:db8::1" is not an IPv4 address`,
		base + "--mode authoritative":                                                                  "--pool: required in authoritative mode",
		base + "--mode authoritative --pool 198.18.0.9":                                                `want first-last`,
		base + "--mode authoritative --pool 198.18.0.9-198.18.0.2":                                     "ends before it starts",
		auth + "--dns 198.18.0.53,nope":                                                                `--dns: "nope" is not an IPv4 address`,
		auth + "--reservation 52:54:00:00:00:01":                                                       "want MAC=IP",
		auth + "--reservation zz=198.18.0.2":                                                           `"zz" is not an Ethernet MAC address`,
		auth + "--reservation 52:54:00:00:00:01=198.18.0.2 --reservation 52:54:00:00:00:01=198.18.0.3": "reserved twice",
		auth + "--reservation 52:54:00:00:00:01=198.18.0.2 --reservation 52:54:00:00:00:02=198.18.0.2": "198.18.0.2 is reserved for both",
		auth + "--lease-time 10s":                                                                      "shorter than a minute",
		"--interface br0 --boot-script-url ftp://x/boot.ipxe":                                          "not a plain http:// URL",
		base + "--dhcp-new-clients-per-second 0":                                                       "--dhcp-new-clients-per-second: 0: want more than 0",
		base + "--dhcp-new-clients-per-second -5":                                                      "--dhcp-new-clients-per-second: -5: want more than 0",
		base + "--dhcp-new-clients-burst 0":                                                            "--dhcp-new-clients-burst: 0: want at least 1",
		base + "--dhcp-relays 198.18.6.1,relay":                                                        `--dhcp-relays: "relay" is not an IPv4 address`,
		base + "--shim-binary /opt/shim.efi":                                                           "--shim-binary: only applies with --secure-boot",
		base + "--signed-grub-binary /opt/grub.efi":                                                    "--signed-grub-binary: only applies with --secure-boot",
	} {
		_, err := parsePXEFlags(t, args)
		require.ErrorContains(t, err, want, args)
	}
}
