package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/agentboot/agentboot/test/netns"
)

// A storm client plays a UEFI machine from power-on to its kernel, with
// the retransmission timers of the real ones: DHCP as EDK2's PXE (4, 8, 16
// and 32 s), TFTP as its MTFTP (4 s, 6 tries, blksize 1468 and windowsize
// 4 as OVMF asks), HTTP as iPXE (one kept-alive connection; a 503 retried
// after its Retry-After). Its DHCP requests set the broadcast flag, as
// UDP sockets cannot take a unicast to an address they do not have yet:
// both servers then broadcast their answers, which each client's socket
// filters by its MAC in the kernel.
type bootClient struct {
	i   int
	ns  *netns.NS
	mac net.HardwareAddr
}

var (
	dhcpTimeouts = []time.Duration{4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second}
	tftpTimeout  = 4 * time.Second
	tftpTries    = 6
	bootDeadline = 5 * time.Minute
	castagnoli   = crc32.MakeTable(crc32.Castagnoli)
)

func newSum() hash.Hash32 { return crc32.New(castagnoli) }

// stormMAC is client i's MAC (its eth0's, set when the veth is made).
func stormMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0xb0, 0x07, byte(i >> 16), byte(i >> 8), byte(i)}
}

// newBootClient opens client i's namespace and brings its link up.
func newBootClient(i int, name string) (*bootClient, error) {
	ns, err := netns.Open(name)
	if err != nil {
		return nil, err
	}
	c := &bootClient{i: i, ns: ns, mac: stormMAC(i)}
	return c, ns.Do(func() error {
		return ifioctl(func(fd int, ifr *unix.Ifreq) error {
			if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
				return err
			}
			ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
			return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
		})
	})
}

// ifioctl runs fn with a socket and eth0's ifreq, in the calling thread's
// namespace.
func ifioctl(fn func(fd int, ifr *unix.Ifreq) error) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("eth0")
	if err != nil {
		return err
	}
	return fn(fd, ifr)
}

// setAddr gives eth0 ip/mask (0.0.0.0 removes its address).
func setAddr(ip, mask net.IP) error {
	return ifioctl(func(fd int, ifr *unix.Ifreq) error {
		if err := ifr.SetInet4Addr(ip.To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
			return fmt.Errorf("set address %s: %w", ip, err)
		}
		if ip.Equal(net.IPv4zero) {
			return nil
		}
		if err := ifr.SetInet4Addr(mask.To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
			return fmt.Errorf("set netmask %s: %w", mask, err)
		}
		return nil
	})
}

// reset removes the address the last round leased.
func (c *bootClient) reset() error {
	return c.ns.Do(func() error { return setAddr(net.IPv4zero, nil) })
}

// bootResult is one client's boot.
type bootResult struct {
	total                         time.Duration
	phases                        [5]time.Duration
	dhcpRetx, tftpRetx, httpRetry int
	err                           error
}

// dhcpConn is a DHCP client's socket on eth0, taking only answers to mac.
func dhcpConn(mac net.HardwareAddr) (*net.UDPConn, error) {
	conn, err := server4.NewIPv4UDPConn("eth0", &net.UDPAddr{Port: dhcpv4.ClientPort})
	if err != nil {
		return nil, err
	}
	// The filter sees the UDP datagram: chaddr is 28 bytes into the
	// DHCP message, after the 8-byte UDP header.
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 36, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: binary.BigEndian.Uint32(mac[0:4]), SkipFalse: 3},
		bpf.LoadAbsolute{Off: 40, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(binary.BigEndian.Uint16(mac[4:6])), SkipFalse: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err == nil {
		err = ipv4.NewPacketConn(conn).SetBPF(prog)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// options are what UEFI PXE firmware (or iPXE) puts in its requests.
func (c *bootClient) options(ipxe bool) []dhcpv4.Modifier {
	uuid := append([]byte{0}, bytes.Repeat([]byte{byte(c.i)}, 16)...)
	mods := []dhcpv4.Modifier{
		dhcpv4.WithBroadcast(true),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 3, 16}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, uuid),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionBootfileName, dhcpv4.OptionVendorSpecificInformation, dhcpv4.OptionClassIdentifier),
	}
	if ipxe {
		mods = append(mods, dhcpv4.WithUserClass("iPXE", false),
			// iPXE's encapsulated options: it speaks HTTP.
			dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{0x13, 1, 1}))
	}
	return mods
}

// exchange is DISCOVER, OFFER, REQUEST, ACK; a NAK starts it again (RFC
// 2131 4.4.1), counted as a retransmission, up to 4 times.
func (c *bootClient) exchange(conn *net.UDPConn, ipxe bool, r *bootResult) (*dhcpv4.DHCPv4, error) {
	for try := 0; ; try++ {
		ack, err := c.exchangeOnce(conn, ipxe, r)
		var nak errNAK
		if !errors.As(err, &nak) || try == 4 {
			return ack, err
		}
		r.dhcpRetx++
	}
}

type errNAK string

func (e errNAK) Error() string { return "NAK: " + string(e) }

func (c *bootClient) exchangeOnce(conn *net.UDPConn, ipxe bool, r *bootResult) (*dhcpv4.DHCPv4, error) {
	disc, err := dhcpv4.NewDiscovery(c.mac, c.options(ipxe)...)
	if err != nil {
		return nil, err
	}
	offer, err := transact(conn, disc, dhcpv4.MessageTypeOffer, r)
	if err != nil {
		return nil, fmt.Errorf("DISCOVER: %w", err)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, c.options(ipxe)...)
	if err != nil {
		return nil, err
	}
	ack, err := transact(conn, req, dhcpv4.MessageTypeAck, r)
	if err != nil {
		return nil, fmt.Errorf("REQUEST: %w", err)
	}
	return ack, nil
}

// transact sends msg until an answer of type want comes, with the
// firmware's timeouts.
func transact(conn *net.UDPConn, msg *dhcpv4.DHCPv4, want dhcpv4.MessageType, r *bootResult) (*dhcpv4.DHCPv4, error) {
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}
	buf := make([]byte, 1500)
	for try, timeout := range dhcpTimeouts {
		if try > 0 {
			r.dhcpRetx++
		}
		if _, err := conn.WriteTo(msg.ToBytes(), dst); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(timeout)
		for {
			_ = conn.SetReadDeadline(deadline)
			n, _, err := conn.ReadFrom(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return nil, err
			}
			m, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || m.OpCode != dhcpv4.OpcodeBootReply || m.TransactionID != msg.TransactionID {
				continue
			}
			switch m.MessageType() {
			case want:
				return m, nil
			case dhcpv4.MessageTypeNak:
				return nil, errNAK(m.Message())
			}
		}
	}
	return nil, fmt.Errorf("no %s after %d tries", want, len(dhcpTimeouts))
}

var (
	ipxeEFIOnce sync.Once
	ipxeEFI     []byte
	ipxeEFIErr  error
)

// boot powers the client on when start closes and runs its boot to the
// kernel, on a thread of its own in its namespace.
func (c *bootClient) boot(start <-chan struct{}, files *stormFiles) (r bootResult) {
	ipxeEFIOnce.Do(func() { ipxeEFI, ipxeEFIErr = os.ReadFile(filepath.Join(tftpDir, "ipxe.efi")) })
	if r.err = ipxeEFIErr; r.err != nil {
		return r
	}
	// On a thread switched into the namespace, and back after: a thread
	// that ended in it would take with it the processes started from it
	// (Pdeathsig).
	err := c.ns.Do(func() error {
		r = c.bootIn(start, files)
		return nil
	})
	if err != nil && r.err == nil {
		r.err = err
	}
	return r
}

func (c *bootClient) bootIn(start <-chan struct{}, files *stormFiles) (r bootResult) {
	conn, err := dhcpConn(c.mac)
	if err != nil {
		r.err = err
		return r
	}
	defer conn.Close()
	<-start
	t0 := time.Now()
	mark := t0
	phase := func(i int) {
		now := time.Now()
		r.phases[i] = now.Sub(mark)
		mark = now
	}
	fail := func(what string, err error) bootResult {
		r.err = fmt.Errorf("client %d (%s), %s: %w", c.i, c.mac, what, err)
		return r
	}

	ack, err := c.exchange(conn, false, &r)
	if err != nil {
		return fail("DHCP", err)
	}
	ip, mask := ack.YourIPAddr, ack.SubnetMask()
	if mask == nil {
		return fail("DHCP", fmt.Errorf("ACK without a subnet mask"))
	}
	if err := setAddr(ip, net.IP(mask)); err != nil {
		return fail("DHCP", err)
	}
	file := ack.BootFileNameOption()
	if file == "" {
		file = ack.BootFileName
	}
	next := ack.ServerIPAddr
	if file != "ipxe.efi" || next.IsUnspecified() {
		return fail("DHCP", fmt.Errorf("ACK names boot file %q on %s, want ipxe.efi and a next server", file, next))
	}
	phase(0)

	got, err := tftpGet(ip, next, file, &r)
	if err != nil {
		return fail("TFTP", err)
	}
	if !bytes.Equal(got, ipxeEFI) {
		return fail("TFTP", fmt.Errorf("%d bytes of %s that differ from the file's %d", len(got), file, len(ipxeEFI)))
	}
	phase(1)

	ack, err = c.exchange(conn, true, &r)
	if err != nil {
		return fail("DHCP (iPXE)", err)
	}
	script := ack.BootFileNameOption()
	if script == "" {
		script = ack.BootFileName
	}
	if !strings.HasPrefix(script, "http://") {
		return fail("DHCP (iPXE)", fmt.Errorf("ACK names boot file %q, want a boot script's URL", script))
	}
	phase(2)

	h := &httpClient{local: ip, r: &r}
	defer h.close()
	var body bytes.Buffer
	if _, err := h.get(script, &body); err != nil {
		return fail("boot script", err)
	}
	initrd, kernel, err := scriptFiles(body.String())
	if err != nil {
		return fail("boot script", err)
	}
	phase(3)
	for _, f := range []struct {
		url  string
		want served
	}{{initrd, files.initrd}, {kernel, files.kernel}} {
		sum := newSum()
		n, err := h.get(f.url, sum)
		if err != nil {
			return fail("GET "+f.url, err)
		}
		if n != f.want.size || sum.Sum32() != f.want.sum {
			return fail("GET "+f.url, fmt.Errorf("%d bytes that differ from the file's %d", n, f.want.size))
		}
	}
	phase(4)
	r.total = time.Since(t0)
	return r
}

// probe asks for an offer (a MAC of its own, in this client's namespace)
// until the server answers.
func (c *bootClient) probe() error {
	return c.ns.Do(func() error {
		mac := net.HardwareAddr{0x02, 0xb0, 0x08, 0, 0, 1}
		conn, err := dhcpConn(mac)
		if err != nil {
			return err
		}
		defer conn.Close()
		p := &bootClient{i: -1, mac: mac}
		disc, err := dhcpv4.NewDiscovery(mac, p.options(false)...)
		if err != nil {
			return err
		}
		buf := make([]byte, 1500)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := conn.WriteTo(disc.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}); err != nil {
				return err
			}
			_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if n, _, err := conn.ReadFrom(buf); err == nil {
				if m, err := dhcpv4.FromBytes(buf[:n]); err == nil && m.MessageType() == dhcpv4.MessageTypeOffer {
					return nil
				}
			}
		}
		return errors.New("no OFFER in 15 s")
	})
}

// tftpGet fetches file from server as EDK2's MTFTP does.
func tftpGet(local, server net.IP, file string, r *bootResult) ([]byte, error) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: local})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rrq := []byte{0, 1}
	for _, s := range []string{file, "octet", "blksize", "1468", "windowsize", "4", "tsize", "0"} {
		rrq = append(append(rrq, s...), 0)
	}
	var (
		peer      *net.UDPAddr
		last      = rrq // what to send again on a timeout
		blksize   = 512
		window    = 1
		next      = uint16(1)
		sinceAck  = 0
		data      []byte
		buf       = make([]byte, 65536)
		timeouts  = 0
		serverTID = &net.UDPAddr{IP: server, Port: 69}
	)
	send := func(p []byte) error {
		last = p
		to := peer
		if to == nil {
			to = serverTID
		}
		_, err := conn.WriteToUDP(p, to)
		return err
	}
	ack := func(block uint16) error { return send([]byte{0, 4, byte(block >> 8), byte(block)}) }
	if err := send(rrq); err != nil {
		return nil, err
	}
	for {
		_ = conn.SetReadDeadline(time.Now().Add(tftpTimeout))
		n, from, err := conn.ReadFromUDP(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			timeouts++
			if timeouts >= tftpTries {
				return nil, fmt.Errorf("no answer after %d tries (%d bytes in)", tftpTries, len(data))
			}
			r.tftpRetx++
			if err := send(last); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if peer == nil {
			peer = from
		} else if !from.IP.Equal(peer.IP) || from.Port != peer.Port {
			continue // not the transfer's server port
		}
		p := buf[:n]
		if len(p) < 4 {
			return nil, fmt.Errorf("%d-byte packet", len(p))
		}
		switch binary.BigEndian.Uint16(p) {
		case 6: // OACK
			opts := strings.Split(string(p[2:]), "\x00")
			for i := 0; i+1 < len(opts); i += 2 {
				v, _ := strconv.Atoi(opts[i+1])
				switch strings.ToLower(opts[i]) {
				case "blksize":
					blksize = v
				case "windowsize":
					window = v
				}
			}
			timeouts = 0
			if err := ack(0); err != nil {
				return nil, err
			}
		case 3: // DATA
			block := binary.BigEndian.Uint16(p[2:])
			if block != next {
				// Lost or reordered: acknowledge what arrived in order,
				// and the server goes on from there.
				if block-next < 0x8000 {
					sinceAck = 0
					if err := ack(next - 1); err != nil {
						return nil, err
					}
				}
				continue
			}
			timeouts = 0
			data = append(data, p[4:]...)
			next++
			sinceAck++
			if len(p)-4 < blksize {
				return data, ack(block)
			}
			if sinceAck >= window {
				sinceAck = 0
				if err := ack(block); err != nil {
					return nil, err
				}
			}
		case 5: // ERROR
			return nil, fmt.Errorf("TFTP error %d: %s", binary.BigEndian.Uint16(p[2:]), strings.TrimRight(string(p[4:]), "\x00"))
		}
	}
}

// httpClient is iPXE's HTTP: one connection kept alive from the boot
// address, dialled again when the server closes it.
type httpClient struct {
	local net.IP
	r     *bootResult
	conn  net.Conn
	br    *bufio.Reader
	host  string
}

func (h *httpClient) close() {
	if h.conn != nil {
		h.conn.Close()
		h.conn = nil
	}
}

// get fetches u into w, retrying a 503 after its Retry-After (5 s without
// one, as iPXE) up to 10 times, and returns the bytes written.
func (h *httpClient) get(u string, w io.Writer) (int64, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return 0, err
	}
	for retry := 0; ; retry++ {
		if h.conn == nil || h.host != pu.Host {
			h.close()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: h.local}, Timeout: 30 * time.Second}
			if h.conn, err = d.Dial("tcp", pu.Host); err != nil {
				return 0, err
			}
			h.br, h.host = bufio.NewReaderSize(h.conn, 64<<10), pu.Host
		}
		_ = h.conn.SetDeadline(time.Now().Add(bootDeadline))
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("User-Agent", "iPXE/1.21.1")
		if err := req.Write(h.conn); err != nil {
			h.close()
			return 0, err
		}
		resp, err := http.ReadResponse(h.br, req)
		if err != nil {
			h.close()
			return 0, err
		}
		if resp.StatusCode == http.StatusServiceUnavailable && retry < 10 {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				h.close()
			}
			wait := 5 * time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
				wait = time.Duration(s) * time.Second
			}
			h.r.httpRetry++
			time.Sleep(wait)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			h.close()
			return 0, fmt.Errorf("%s: %q", resp.Status, b)
		}
		n, err := io.Copy(w, resp.Body)
		resp.Body.Close()
		if resp.Close {
			h.close()
		}
		if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
			err = fmt.Errorf("%d of %d bytes", n, resp.ContentLength)
		}
		return n, err
	}
}
