// Command pxe benchmarks agentboot's PXE service against dnsmasq on the same
// machine in the same run (make bench-pxe, root): the DISCOVER→OFFER rate in
// ProxyDHCP and authoritative mode, and TFTP throughput of undionly.kpxe
// and ipxe.efi, each server alternating with the other for every repeat.
// The servers run in one network namespace and the load in another, joined
// by a veth pair on 198.18.0.0/16; the load generators are this program
// re-executed inside the client namespace. Real clients check the same
// paths: tftp-hpa fetches the binaries, busybox udhcpc runs whole DHCP
// exchanges.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
	"golang.org/x/net/ipv4"

	"github.com/agentboot/agentboot/test/netns"
	"github.com/agentboot/agentboot/test/testenv"
)

const (
	prefix   = "agentboot-bench-"
	serverIP = "198.18.0.1"
	clientIP = "198.18.0.2"
	tftpDir  = "/usr/lib/ipxe"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "dhcp-load":
			loadMain(os.Args[2:], dhcpLoad)
			return
		case "tftp-load":
			loadMain(os.Args[2:], tftpLoad)
			return
		case "storm-run", "serve-static":
			run := map[string]func([]string) error{"storm-run": stormRun, "serve-static": serveStatic}[os.Args[1]]
			if err := run(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "bench-storm:", err)
				os.Exit(1)
			}
			return
		}
	}
	var o options
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "how long each measurement runs")
	flag.IntVar(&o.repeats, "repeats", 3, "measurements per point (the median is reported)")
	flag.IntVar(&o.window, "window", 64, "DHCP transactions in flight")
	flag.IntVar(&o.macs, "macs", 20000, "distinct client MACs the DHCP load cycles through")
	flag.StringVar(&o.tftpClients, "tftp-clients", "1,8", "concurrent TFTP transfers")
	flag.IntVar(&o.realRuns, "real-client-runs", 20, "runs of tftp-hpa and udhcpc against each server")
	flag.StringVar(&o.only, "only", "", "run only dhcp, tftp or real (clients)")
	flag.BoolVar(&o.tftpSinglePort, "tftp-single-port", false, "run both TFTP servers in single-port mode (every transfer on port 69)")
	flag.IntVar(&o.storm, "storm", 0, "instead: a boot storm of this many clients, each in its own network namespace, against agentboot and against dnsmasq with a static HTTP server (storm.go); -repeats rounds of each")
	flag.Parse()
	if o.storm < 0 || o.repeats < 1 {
		fmt.Fprintf(os.Stderr, "bench-pxe: -storm %d and -repeats %d: want a number of clients (0: no storm) and at least one repeat\n", o.storm, o.repeats)
		os.Exit(2)
	}
	if o.storm > 0 {
		if err := storm(o); err != nil {
			fmt.Fprintln(os.Stderr, "bench-storm:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-pxe:", err)
		os.Exit(1)
	}
}

type options struct {
	duration    time.Duration
	repeats     int
	window      int
	macs        int
	tftpClients string
	realRuns    int
	only        string
	// tftpSinglePort runs both TFTP servers with every transfer on port 69.
	tftpSinglePort bool
	// storm is the boot storm's clients (0: the other measures).
	storm int
}

// lab is the two namespaces and what runs in them.
type lab struct {
	server, client *netns.NS
	dir            string
	agentboot      string
	self           string
	tftpSinglePort bool
}

func run(o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, ports 67 and 69): sudo make bench-pxe")
	}
	for _, tool := range []string{"ip", "dnsmasq", "tftp", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install the Debian packages in .ci/packages", tool)
		}
	}
	dir, err := os.MkdirTemp("", "agentboot-bench-pxe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l := &lab{dir: dir, agentboot: filepath.Join(dir, "agentboot"), tftpSinglePort: o.tftpSinglePort}
	if l.self, err = os.Executable(); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-o", l.agentboot, "./cmd/agentboot")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build agentboot: %v: %s", err, out)
	}
	netns.RemoveStale(prefix)
	id := prefix + strconv.Itoa(os.Getpid())
	if l.server, err = netns.New(id + "-server"); err != nil {
		return err
	}
	defer l.server.Close()
	if l.client, err = netns.New(id + "-client"); err != nil {
		return err
	}
	defer l.client.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		l.client.Close()
		l.server.Close()
		os.Exit(130)
	}()
	for _, step := range []func() error{
		func() error {
			return l.server.IP("link", "add", "s0", "type", "veth", "peer", "name", "c0", "netns", l.client.Name)
		},
		func() error { return l.server.IP("addr", "add", serverIP+"/16", "dev", "s0") },
		func() error { return l.server.IP("link", "set", "s0", "up") },
		func() error { return l.client.IP("addr", "add", clientIP+"/16", "dev", "c0") },
		func() error { return l.client.IP("link", "set", "c0", "up") },
	} {
		if err := step(); err != nil {
			return err
		}
	}

	fmt.Printf("bench-pxe: agentboot pxe vs dnsmasq %s, %d × %s per point (median), %d cores\n\n",
		dnsmasqVersion(), o.repeats, o.duration, runtime.NumCPU())
	fmt.Println("| measure | agentboot | dnsmasq | ratio (target ≥ 1) |")
	fmt.Println("|---|---|---|---|")
	for _, mode := range []string{"proxy", "authoritative"} {
		if o.only != "" && o.only != "dhcp" {
			break
		}
		res := map[string][]float64{}
		for r := 0; r < o.repeats; r++ {
			for _, name := range []string{"agentboot", "dnsmasq"} {
				var out loadResult
				err := l.withServer(name, mode, func() error {
					var err error
					out, err = l.load("dhcp-load", fmt.Sprint(o.duration), fmt.Sprint(o.window), fmt.Sprint(o.macs), mode)
					return err
				})
				if err != nil {
					return fmt.Errorf("%s %s: %w", name, mode, err)
				}
				if out.Errors > 0 {
					return fmt.Errorf("%s %s: %d wrong answers: %s", name, mode, out.Errors, out.FirstError)
				}
				res[name] = append(res[name], out.Rate)
			}
		}
		a, d := median(res["agentboot"]), median(res["dnsmasq"])
		fmt.Printf("| DHCP %s: DISCOVER→OFFER | %.0f/s | %.0f/s | %.2f |\n", mode, a, d, a/d)
	}
	for _, file := range []string{"undionly.kpxe", "ipxe.efi"} {
		if o.only != "" && o.only != "tftp" {
			break
		}
		for _, clients := range strings.Split(o.tftpClients, ",") {
			res := map[string][]float64{}
			for r := 0; r < o.repeats; r++ {
				for _, name := range []string{"agentboot", "dnsmasq"} {
					var out loadResult
					err := l.withServer(name, "proxy", func() error {
						var err error
						out, err = l.load("tftp-load", fmt.Sprint(o.duration), clients, file)
						return err
					})
					if err != nil {
						return fmt.Errorf("%s TFTP: %w", name, err)
					}
					if out.Errors > 0 {
						return fmt.Errorf("%s TFTP %s: %d failed transfers: %s", name, file, out.Errors, out.FirstError)
					}
					res[name] = append(res[name], out.Rate)
				}
			}
			a, d := median(res["agentboot"]), median(res["dnsmasq"])
			ports := ""
			if o.tftpSinglePort {
				ports = ", single port"
			}
			fmt.Printf("| TFTP %s, %s client(s), blksize 1468%s | %.1f MB/s | %.1f MB/s | %.2f |\n", file, clients, ports, a/1e6, d/1e6, a/d)
		}
	}
	if o.only != "" && o.only != "real" {
		return nil
	}
	return l.realClients(o.realRuns)
}

// withServer runs one server in the server namespace for the duration of fn.
func (l *lab) withServer(name, mode string, fn func() error) error {
	var args []string
	switch name {
	case "agentboot":
		args = []string{l.agentboot, "pxe", "--interface", "s0", "--mode", mode, "--log-format", "text",
			"--boot-script-url", "http://" + serverIP + ":8080/boot.ipxe",
			"--tftp-dir", tftpDir, "--tftp-addr", serverIP + ":69", "--http-addr", serverIP + ":8070",
			// The load's 20000 MACs are all new clients, which agentboot
			// limits together (50/s) against floods of made-up MACs:
			// lifted, to measure packet handling as dnsmasq's is.
			"--dhcp-new-clients-per-second", "10000000"}
		if l.tftpSinglePort {
			args = append(args, "--tftp-single-port")
		}
		if mode == "authoritative" {
			args = append(args, "--pool", "198.18.1.0-198.18.255.254", "--lease-file", filepath.Join(l.dir, "agentboot-leases.json"))
		}
	case "dnsmasq":
		// The same answers: ipxe.efi to UEFI PXE clients, TFTP from the
		// same directory; no logging of routine operation and no ping
		// before an offer, like agentboot.
		args = []string{"dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0", "--interface=s0", "--bind-interfaces",
			"--enable-tftp", "--tftp-root=" + tftpDir, "--dhcp-leasefile=" + filepath.Join(l.dir, "dnsmasq.leases"), "--no-ping",
			"--dhcp-lease-max=200000", "--quiet-dhcp", "--quiet-tftp"}
		if l.tftpSinglePort {
			// dnsmasq 2.90's single-port mode cannot send with
			// --bind-interfaces ("failed to send packet: Network is
			// unreachable"); the namespace has no other interface to
			// keep it off.
			args = slices.DeleteFunc(append(args, "--tftp-single-port"), func(a string) bool { return a == "--bind-interfaces" })
		}
		if mode == "proxy" {
			args = append(args, "--dhcp-range=198.18.0.0,proxy,255.255.0.0", `--pxe-service=X86-64_EFI,"Network boot",ipxe.efi`)
		} else {
			args = append(args, "--dhcp-range=198.18.1.0,198.18.255.254,255.255.0.0,12h", "--dhcp-boot=ipxe.efi,,"+serverIP)
		}
	}
	logFile := filepath.Join(l.dir, name+"-"+mode+".log")
	out, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := l.server.Command(context.Background(), args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = os.Remove(filepath.Join(l.dir, "agentboot-leases.json"))
		_ = os.Remove(filepath.Join(l.dir, "dnsmasq.leases"))
	}()
	// Ready when a DISCOVER gets an OFFER.
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Many MACs: agentboot limits each to 5 packets a second.
		res, err := l.load("dhcp-load", "100ms", "1", "20000", mode)
		if err == nil && res.Errors > 0 {
			err = errors.New(res.FirstError)
		}
		if err == nil {
			break
		}
		select {
		case err := <-done:
			data, _ := os.ReadFile(logFile)
			return fmt.Errorf("%s exited: %v: %s", name, err, data)
		default:
		}
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(logFile)
			return fmt.Errorf("%s never answered a DISCOVER as expected (%v): %s", name, err, data)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fn()
}

// loadResult is what a load generator prints.
type loadResult struct {
	Rate       float64 // offers or bytes per second
	Count      int64
	Errors     int64
	FirstError string
}

// load runs this program as a load generator inside the client namespace.
func (l *lab) load(args ...string) (loadResult, error) {
	var res loadResult
	cmd := l.client.Command(context.Background(), l.self, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return res, fmt.Errorf("%s: %v: %s", args[0], err, stderr.String())
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("%s printed %q: %w", args[0], out, err)
	}
	if res.Count == 0 {
		return res, fmt.Errorf("%s: no answers (%d errors, the first: %s)", args[0], res.Errors, res.FirstError)
	}
	return res, nil
}

func loadMain(args []string, fn func([]string) (loadResult, error)) {
	res, err := fn(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

// dhcpLoad keeps window DISCOVERs of UEFI PXE clients in flight, cycling
// through macs client MACs, and counts OFFERs carrying ipxe.efi: args are
// duration, window, macs and the mode.
func dhcpLoad(args []string) (loadResult, error) {
	var res loadResult
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return res, err
	}
	window, _ := strconv.Atoi(args[1])
	nmacs, _ := strconv.Atoi(args[2])
	proxy := args[3] == "proxy"
	conn, err := server4.NewIPv4UDPConn("c0", &net.UDPAddr{Port: dhcpv4.ClientPort})
	if err != nil {
		return res, err
	}
	defer conn.Close()
	_ = conn.SetReadBuffer(8 << 20)
	_ = conn.SetWriteBuffer(8 << 20)
	packets := make([][]byte, nmacs)
	for i := range packets {
		mac := net.HardwareAddr{0x02, 0xbe, 0x00, byte(i >> 16), byte(i >> 8), byte(i)}
		p, err := dhcpv4.NewDiscovery(mac,
			dhcpv4.WithBroadcast(true),
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
			dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64)),
			dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 3, 16}),
			dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, bytes.Repeat([]byte{byte(i)}, 16)...)),
			dhcpv4.WithRequestedOptions(dhcpv4.OptionBootfileName, dhcpv4.OptionVendorSpecificInformation, dhcpv4.OptionClassIdentifier))
		if err != nil {
			return res, err
		}
		packets[i] = p.ToBytes()
	}
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}
	pc := ipv4.NewPacketConn(conn)

	// sent[xid&mask] is when transaction xid left (0: none in flight).
	const mask = 1<<16 - 1
	var (
		sent     [mask + 1]atomic.Int64
		slots    = make(chan struct{}, window)
		counting atomic.Bool
		count    atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
		stop     = make(chan struct{})
	)
	fail := func(msg string) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, msg)
	}
	go func() { // receiver
		msgs := make([]ipv4.Message, 64)
		for i := range msgs {
			msgs[i].Buffers = [][]byte{make([]byte, 1500)}
		}
		for {
			n, err := pc.ReadBatch(msgs, 0)
			if err != nil {
				return
			}
			for _, m := range msgs[:n] {
				b := m.Buffers[0][:m.N]
				if len(b) < 240 || b[0] != 2 {
					continue
				}
				xid := uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
				if sent[xid&mask].Swap(0) == 0 {
					continue // a late answer to a transaction given up
				}
				if msg := checkOffer(b, proxy); msg != "" {
					fail(msg)
				} else if counting.Load() {
					count.Add(1)
				}
				<-slots
			}
		}
	}()
	go func() { // give up on lost transactions
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				for i := range sent {
					if at := sent[i].Load(); at != 0 && now.UnixNano()-at > int64(time.Second) && sent[i].CompareAndSwap(at, 0) {
						<-slots
					}
				}
			}
		}
	}()
	warmup := min(time.Second, d)
	start := time.Now()
	var measureStart time.Time
	var xid uint32
	out := make([]ipv4.Message, 0, 32)
	for i := 0; ; {
		now := time.Now()
		if !counting.Load() && now.Sub(start) >= warmup {
			measureStart = now
			counting.Store(true)
		}
		if counting.Load() && now.Sub(measureStart) >= d {
			break
		}
		// Send as many as there are free slots, at least one.
		select {
		case slots <- struct{}{}:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		out = out[:0]
		for {
			xid++
			p := bytes.Clone(packets[i%nmacs])
			i++
			p[4], p[5], p[6], p[7] = byte(xid>>24), byte(xid>>16), byte(xid>>8), byte(xid)
			sent[xid&mask].Store(time.Now().UnixNano())
			out = append(out, ipv4.Message{Buffers: [][]byte{p}, Addr: dst})
			if len(out) == cap(out) {
				break
			}
			select {
			case slots <- struct{}{}:
				continue
			default:
			}
			break
		}
		for off := 0; off < len(out); {
			n, err := pc.WriteBatch(out[off:], 0)
			if err != nil {
				return res, err
			}
			off += n
		}
	}
	elapsed := time.Since(measureStart)
	close(stop)
	res.Count = count.Load()
	res.Rate = float64(res.Count) / elapsed.Seconds()
	res.Errors = errs.Load()
	if v := firstErr.Load(); v != nil {
		res.FirstError = v.(string)
	}
	return res, nil
}

// checkOffer returns what is wrong with an answer, or "".
func checkOffer(b []byte, proxy bool) string {
	m, err := dhcpv4.FromBytes(b)
	if err != nil {
		return "unparsable answer: " + err.Error()
	}
	if m.MessageType() != dhcpv4.MessageTypeOffer {
		return "answer is a " + m.MessageType().String()
	}
	file := m.BootFileNameOption()
	if file == "" {
		file = m.BootFileName
	}
	switch {
	case proxy && m.ClassIdentifier() != "PXEClient":
		return fmt.Sprintf("ProxyDHCP offer with vendor class %q, want PXEClient", m.ClassIdentifier())
	case proxy && file == "":
		// dnsmasq's ProxyDHCP offer to UEFI clients names no file: the
		// client asks again on port 4011.
	case file != "ipxe.efi":
		return fmt.Sprintf("boot file %q, want ipxe.efi", file)
	}
	if proxy != m.YourIPAddr.IsUnspecified() {
		return fmt.Sprintf("offered address %s in %s mode", m.YourIPAddr, map[bool]string{true: "proxy", false: "authoritative"}[proxy])
	}
	return ""
}

// tftpLoad fetches file with clients concurrent transfers (blksize 1468)
// for the duration and reports bytes per second: args are duration,
// clients and the file.
func tftpLoad(args []string) (loadResult, error) {
	var res loadResult
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return res, err
	}
	clients, _ := strconv.Atoi(args[1])
	want, err := os.ReadFile(filepath.Join(tftpDir, args[2]))
	if err != nil {
		return res, err
	}
	var (
		total, errs atomic.Int64
		firstErr    atomic.Value
		wg          sync.WaitGroup
	)
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tftp.NewClient(serverIP + ":69")
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			c.SetBlockSize(1468)
			c.SetTimeout(2 * time.Second)
			var buf bytes.Buffer
			for time.Since(start) < d {
				buf.Reset()
				wt, err := c.Receive(args[2], "octet")
				if err == nil {
					_, err = wt.WriteTo(&buf)
				}
				if err == nil && !bytes.Equal(buf.Bytes(), want) {
					err = fmt.Errorf("got %d bytes that differ from %s", buf.Len(), args[2])
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				total.Add(int64(buf.Len()))
			}
		}()
	}
	wg.Wait()
	res.Count = total.Load()
	res.Rate = float64(res.Count) / time.Since(start).Seconds()
	res.Errors = errs.Load()
	if v := firstErr.Load(); v != nil {
		res.FirstError = v.(string)
	}
	return res, nil
}

// realClients runs tftp-hpa and busybox udhcpc against each server.
func (l *lab) realClients(runs int) error {
	want, err := os.ReadFile(filepath.Join(tftpDir, "ipxe.efi"))
	if err != nil {
		return err
	}
	script := filepath.Join(l.dir, "udhcpc.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && echo \"ip=$ip siaddr=$siaddr boot_file=$boot_file bootfile=$bootfile\" >\"$UDHCPC_OUT\"\nexit 0\n"), 0o755); err != nil {
		return err
	}
	times := map[string]map[string][]time.Duration{}
	for _, name := range []string{"agentboot", "dnsmasq"} {
		times[name] = map[string][]time.Duration{}
		err := l.withServer(name, "authoritative", func() error {
			for i := 0; i < runs; i++ {
				dst := filepath.Join(l.dir, "tftp-got")
				_ = os.Remove(dst)
				t0 := time.Now()
				if out, err := l.client.Command(context.Background(), "tftp", "-m", "binary", serverIP, "-c", "get", "ipxe.efi", dst).CombinedOutput(); err != nil {
					return fmt.Errorf("tftp-hpa: %v: %s", err, out)
				}
				times[name]["tftp"] = append(times[name]["tftp"], time.Since(t0))
				got, err := os.ReadFile(dst)
				if err != nil || !bytes.Equal(got, want) {
					return fmt.Errorf("tftp-hpa fetched %d bytes of ipxe.efi that differ (%v)", len(got), err)
				}

				outFile := filepath.Join(l.dir, "udhcpc.out")
				_ = os.Remove(outFile)
				cmd := l.client.Command(context.Background(), "busybox", "udhcpc", "-i", "c0", "-f", "-q", "-n", "-t", "3", "-T", "2", "-s", script,
					"-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007", "-O", "bootfile")
				cmd.Env = append(os.Environ(), "UDHCPC_OUT="+outFile)
				t0 = time.Now()
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("udhcpc: %v: %s", err, out)
				}
				times[name]["udhcpc"] = append(times[name]["udhcpc"], time.Since(t0))
				got, err = os.ReadFile(outFile)
				if err != nil || !bytes.Contains(got, []byte("ip=198.18.")) || !bytes.Contains(got, []byte("file=ipxe.efi")) {
					return fmt.Errorf("udhcpc got %q (%v), want an address of the pool and ipxe.efi", got, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, what := range []string{"tftp", "udhcpc"} {
		a, d := medianDuration(times["agentboot"][what]), medianDuration(times["dnsmasq"][what])
		label := map[string]string{"tftp": "tftp-hpa: fetch ipxe.efi (blksize 512), median", "udhcpc": "busybox udhcpc: DISCOVER to bound (authoritative), median"}[what]
		fmt.Printf("| %s of %d | %s | %s | %.2f |\n", label, runs, a.Round(100*time.Microsecond), d.Round(100*time.Microsecond), float64(d)/float64(a))
	}
	return nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func medianDuration(v []time.Duration) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func dnsmasqVersion() string {
	out, _ := exec.Command("dnsmasq", "--version").Output()
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return "?"
}
