//go:build bench

// Package sanitize measures the agent's disk erase methods on the VM lab's
// disks: the discovery OS under qemu (no root: user-mode network) erases
// one disk of each kind the lab has with `agent sanitize`, after the
// baseline measured on the same disk in the same boot: what an admin
// wipes a disk with by hand, `dd if=/dev/zero bs=4M oflag=direct`.
package sanitize

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/test/hosted"
	"github.com/agentboot/agentboot/test/stack"
	"github.com/agentboot/agentboot/test/vm"
)

var (
	gib     = flag.Int("gib", 2, "size of each disk, GiB")
	repeats = flag.Int("repeats", 3, "runs of each measurement; the best counts")
)

var s *stack.Stack

func TestMain(m *testing.M) {
	// qemu's user network reaches the host's loopback at 10.0.2.2.
	stack.MainWith(m, stack.Options{AdvertiseHost: "10.0.2.2"}, &s)
}

// disk is one of the lab's kinds of disk.
type disk struct {
	// dev is the device in the guest, as a shell word.
	dev, kind string
	// drive and device are qemu's arguments for it, %s the image.
	drive, device string
	// method is the agent's --method; empty for its own choice.
	method string
}

// The lab's disks are thin (discard=unmap,detect-zeroes=unmap, test/vm):
// what a guest zeroes becomes a hole in the image. The kernel numbers NVMe
// controllers in the order they finish probing: a namespace is found by
// its controller's serial (ns, in the script).
var disks = []disk{
	{"/dev/vda", "virtio-blk (Write Zeroes)", "file=%s,if=none,id=d0,format=raw,discard=unmap,detect-zeroes=unmap", "virtio-blk-pci,drive=d0", ""},
	{"/dev/vdb", "virtio-blk without Write Zeroes", "file=%s,if=none,id=d1,format=raw,discard=unmap,detect-zeroes=unmap", "virtio-blk-pci,drive=d1,write-zeroes=off,discard=off", ""},
	{"$(ns bench-nvme0)", "NVMe", "file=%s,if=none,id=d2,format=raw,discard=unmap,detect-zeroes=unmap", "nvme,serial=bench-nvme0,drive=d2", ""},
	{"$(ns bench-nvme1)", "NVMe, format (forced)", "file=%s,if=none,id=d3,format=raw,discard=unmap,detect-zeroes=unmap", "nvme,serial=bench-nvme1,drive=d3", "nvme-format-user-data"},
	{"/dev/sda", "ATA (IDE)", "file=%s,if=none,id=d4,format=raw,discard=unmap,detect-zeroes=unmap", "ide-hd,drive=d4,bus=ide.0", ""},
}

func TestBenchSanitize(t *testing.T) {
	size := int64(*gib) << 30
	args := []string{}
	for i, d := range disks {
		p := filepath.Join(t.TempDir(), fmt.Sprintf("disk%d.raw", i))
		f, err := os.Create(p)
		require.NoError(t, err)
		require.NoError(t, f.Truncate(size))
		// Data where every method must reach it: the first and last MiB and
		// the middle.
		for _, off := range []int64{0, size / 2, size - 4096} {
			_, err := f.WriteAt([]byte("AGENTBOOT-BENCH-DATA"), off)
			require.NoError(t, err)
		}
		require.NoError(t, f.Close())
		args = append(args, "-drive", fmt.Sprintf(d.drive, p), "-device", d.device)
	}
	// On each disk in turn, the baseline then the agent, repeated (each
	// run on its own disk, so that the figures are one disk at a time);
	// then the metadata level on the first.
	var script strings.Builder
	script.WriteString("up() { cut -d' ' -f1 /proc/uptime; }\n")
	script.WriteString(`ns() { echo /dev/$(grep -l "$1" /sys/class/nvme/nvme*/serial | cut -d/ -f5)n1; }` + "\n")
	for range *repeats {
		for i, d := range disks {
			fmt.Fprintf(&script, `a=$(up); dd if=/dev/zero of=%s bs=4M oflag=direct 2>/dev/null; b=$(up); echo "bench-dd %d $a $b"`+"\n", d.dev, i)
			method := ""
			if d.method != "" {
				method = " --method " + d.method
			}
			fmt.Fprintf(&script, "/usr/local/bin/agent sanitize%s --disk %s\n", method, d.dev)
		}
	}
	fmt.Fprintf(&script, "/usr/local/bin/agent sanitize --level metadata --disk %s\necho bench-exit=$?\nreboot -f\n", disks[0].dev)
	override := hosted.IgnitionConfig(t, map[string]any{
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/usr/local/bin/bench.sh", "mode": 0o755,
			"contents": map[string]any{"source": "data:;base64," + base64.StdEncoding.EncodeToString([]byte(script.String()))},
		}}},
		"systemd": map[string]any{"units": []any{map[string]any{
			"name": "bench.service", "enabled": true,
			"contents": "[Service]\nExecStart=/bin/sh /usr/local/bin/bench.sh\n[Install]\nWantedBy=multi-user.target\n",
		}}},
	})
	ie := s.CreateInfraEnv(t, "bench", "sanitize", func(ie *v1beta1.InfraEnv) { ie.Spec.IgnitionConfigOverride = string(override) })
	iso := s.Download(t, ie.Status.ISODownloadURL)
	v := vm.Start(t, vm.Options{Name: "bench-sanitize", CDROM: iso, Boot: "d", Net: "user", MemoryMB: 1024, Extra: args})
	_, err := v.WaitFor(t.Context(), regexp.MustCompile(`bench-exit=\d+`), time.Duration(*gib)*10*time.Minute)
	require.NoError(t, err, "serial log:\n%s", v.Tail(40))
	log := v.Log()
	require.Contains(t, log, "bench-exit=0", "serial log:\n%s", v.Tail(40))

	best := func(m map[int]float64, k int, v float64) {
		if old, ok := m[k]; !ok || v < old {
			m[k] = v
		}
	}
	baseline := map[int]float64{}
	for _, m := range regexp.MustCompile(`bench-dd (\d+) ([\d.]+) ([\d.]+)`).FindAllStringSubmatch(log, -1) {
		i, _ := strconv.Atoi(m[1])
		a, _ := strconv.ParseFloat(m[2], 64)
		b, _ := strconv.ParseFloat(m[3], 64)
		best(baseline, i, b-a)
	}
	var evidence []agentwire.DiskSanitization
	for _, line := range regexp.MustCompile(`\{"disk":[^\n]*\}`).FindAllString(log, -1) {
		var ev agentwire.DiskSanitization
		require.NoError(t, json.Unmarshal([]byte(line), &ev), "%s", line)
		require.Empty(t, ev.Error, "%s", line)
		t.Logf("%s %s %d bytes %.3fs", ev.Disk, ev.Method, ev.Bytes, ev.DurationSeconds)
		evidence = append(evidence, ev)
	}
	require.Len(t, evidence, len(disks)**repeats+1, "one report per erase")
	// The reports come in the script's order: disk after disk, run after
	// run.
	agent := map[int]float64{}
	method := map[int]string{}
	for k, ev := range evidence[:len(evidence)-1] {
		i := k % len(disks)
		best(agent, i, ev.DurationSeconds/(float64(ev.Bytes)/(1<<30)))
		method[i] = ev.Method
	}

	fmt.Printf("\nagent sanitize on the lab's disks, %d GiB each, qemu %s, one boot, best of %d (dd: if=/dev/zero bs=4M oflag=direct)\n",
		*gib, strings.Join(vm.Accelerators(), ","), *repeats)
	fmt.Printf("%-34s %-22s %12s %12s %14s\n", "disk", "method", "s/GiB", "dd s/GiB", "dd/agent")
	for i, d := range disks {
		perGiB, dd := agent[i], baseline[i]/float64(*gib)
		require.Positive(t, dd, "no baseline for %s", d.kind)
		require.Positive(t, perGiB, "no erase of %s", d.kind)
		if d.method != "" {
			require.Equal(t, d.method, method[i], d.kind)
		}
		fmt.Printf("%-34s %-22s %12.2f %12.2f %13.1fx\n", d.kind, method[i], perGiB, dd, dd/perGiB)
	}
	md := evidence[len(evidence)-1]
	fmt.Printf("%-34s %-22s %11.3fs for the disk (%d MiB written)\n", disks[0].kind, md.Method, md.DurationSeconds, md.Bytes>>20)
	fmt.Println("seconds exclude the read-back check, which reads 16 MiB and 2 MiB per region whatever the size;")
	fmt.Println("the format's include reading 16 MiB and writing 18 MiB before the command, which its check compares against")
}
