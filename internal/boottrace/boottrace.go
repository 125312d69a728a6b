// Package boottrace records each MAC's way through agentboot's boot path
// (docs/trace.md): the PXE service and the image service observe hops,
// the image service gathers them in a Journal and its Writer keeps one
// BootTrace per MAC in the cluster; Diagnose reads a trace, with the
// host's Agent, as where the host stopped and the likely reason.
//
// Everything in a trace is what a host on the boot network was seen to
// do: a host can make the PXE service see any MAC. Traces are bounded
// (hops per MAC, texts, MACs pending, traces of MACs nothing claims) and
// never decide anything.
package boottrace

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	"github.com/agentboot/agentboot/internal/agentwire"
	"github.com/agentboot/agentboot/internal/bootpath"
	"github.com/agentboot/agentboot/internal/clip"
)

// The hops a trace records, in boot order. The rest of the path
// (registration, inventory, heartbeats) is the Agent's own record.
const (
	// DHCP: a DHCP request from the MAC, answered with a boot file or not.
	DHCP     = "dhcp"
	BootFile = bootpath.BootFile
	// BootScript: the iPXE script or GRUB configuration for the MAC.
	BootScript = bootpath.BootScript
	Kernel     = bootpath.Kernel
	Initrd     = bootpath.Initrd
	RootFS     = bootpath.RootFS
	ISO        = bootpath.ISO
)

// Hops lists them in boot order.
var Hops = []string{DHCP, BootFile, BootScript, Kernel, Initrd, RootFS, ISO}

// Sources, the services that observe.
const (
	SourcePXE          = "pxe"
	SourceImageService = "image-service"
)

// Limits on what an observation carries.
const (
	MaxOutcome = 512
	MaxDetail  = 256
	// MaxBatch is the most observations one post carries.
	MaxBatch = 1000
	// MaxBatchBytes bounds a post's body.
	MaxBatchBytes = 512 << 10
)

// Observation is one hop of one MAC as a service saw it, possibly several
// times (Count) between First and At.
type Observation struct {
	MAC     string    `json:"mac"`
	Hop     string    `json:"hop"`
	At      time.Time `json:"at"`
	OK      bool      `json:"ok"`
	Outcome string    `json:"outcome,omitempty"`
	Detail  string    `json:"detail,omitempty"`
	// Count is how many times it was seen (1 when zero).
	Count int64 `json:"count,omitempty"`
}

// Batch is what the PXE service posts to the image service.
type Batch struct {
	Observations []Observation `json:"observations"`
}

// Check normalizes o (the MAC in lower case with colons, texts clipped, a
// time from a clock that is off replaced by now) and says what is wrong
// with what cannot be.
func (o *Observation) Check(now time.Time) error {
	o.MAC = strings.ToLower(strings.ReplaceAll(o.MAC, "-", ":"))
	if !agentwire.MACForm.MatchString(o.MAC) {
		return fmt.Errorf("mac %q: want six hexadecimal bytes separated by colons", clip.Text(o.MAC, 40))
	}
	if !slices.Contains(Hops, o.Hop) {
		return fmt.Errorf("hop %q: want one of %s", clip.Text(o.Hop, 40), strings.Join(Hops, ", "))
	}
	if o.Count < 0 || o.Count > 1_000_000 {
		return fmt.Errorf("count %d: want 0 to 1000000", o.Count)
	}
	if o.Count == 0 {
		o.Count = 1
	}
	if o.At.IsZero() || o.At.Before(now.Add(-time.Hour)) || o.At.After(now.Add(time.Minute)) {
		o.At = now
	}
	o.Outcome = clip.Text(printable(o.Outcome), MaxOutcome)
	o.Detail = clip.Text(printable(o.Detail), MaxDetail)
	return nil
}

// printable replaces control characters (a host's vendor class, a boot
// loader's arch: a terminal showing `agentboot trace` must not obey them).
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
}

// Name is the BootTrace's name for a MAC.
func Name(mac string) string { return "mac-" + Label(mac) }

// Label is the MAC as the value of v1alpha1.MACLabel.
func Label(mac string) string { return strings.ReplaceAll(strings.ToLower(mac), ":", "-") }

// ErrJournalFull is returned for a MAC the journal has no room for.
var ErrJournalFull = errors.New("too many MACs waiting to be written")

// Journal gathers observations by MAC and hop until the Writer writes them.
// It holds at most MaxMACs MACs: a flood of made-up MACs is dropped (and
// counted), never an unbounded memory.
type Journal struct {
	// MaxMACs bounds the MACs pending (default 20000).
	MaxMACs int

	mu      sync.Mutex
	pending map[string]map[string]*v1alpha1.BootTraceHop
	dropped int64
}

// Add merges an observation checked by Check, seen by source.
func (j *Journal) Add(source string, o Observation) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.pending == nil {
		j.pending = map[string]map[string]*v1alpha1.BootTraceHop{}
	}
	hops := j.pending[o.MAC]
	if hops == nil {
		max := j.MaxMACs
		if max <= 0 {
			max = 20000
		}
		if len(j.pending) >= max {
			j.dropped++
			return ErrJournalFull
		}
		hops = map[string]*v1alpha1.BootTraceHop{}
		j.pending[o.MAC] = hops
	}
	at := metav1.NewTime(o.At.UTC().Truncate(time.Second))
	merge(hops, &v1alpha1.BootTraceHop{Hop: o.Hop, Source: source, OK: o.OK, Outcome: o.Outcome, Detail: o.Detail, First: at, Last: at, Count: o.Count})
	return nil
}

// Dropped is how many observations were given up: of new MACs that found
// the journal full, and of made-up MACs past the writer's limit.
func (j *Journal) Dropped() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.dropped
}

// Len is how many MACs are pending.
func (j *Journal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending)
}

// take removes and returns up to n MACs' pending hops.
func (j *Journal) take(n int) map[string][]v1alpha1.BootTraceHop {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := map[string][]v1alpha1.BootTraceHop{}
	for mac, hops := range j.pending {
		if len(out) >= n {
			break
		}
		for _, h := range hops {
			out[mac] = append(out[mac], *h)
		}
		delete(j.pending, mac)
	}
	return out
}

// drop counts observations given up.
func (j *Journal) drop(n int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dropped += int64(n)
}

// putBack returns hops that could not be written, unless the journal
// filled meanwhile.
func (j *Journal) putBack(mac string, hops []v1alpha1.BootTraceHop) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.pending == nil {
		j.pending = map[string]map[string]*v1alpha1.BootTraceHop{}
	}
	cur := j.pending[mac]
	if cur == nil {
		max := j.MaxMACs
		if max <= 0 {
			max = 20000
		}
		if len(j.pending) >= max {
			j.dropped += int64(len(hops))
			return
		}
		cur = map[string]*v1alpha1.BootTraceHop{}
		j.pending[mac] = cur
	}
	for i := range hops {
		merge(cur, &hops[i])
	}
}

// merge folds h into hops: the earliest First, the latest Last, the
// counts added, and what the latest sighting said.
func merge(hops map[string]*v1alpha1.BootTraceHop, h *v1alpha1.BootTraceHop) {
	cur := hops[h.Hop]
	if cur == nil {
		c := *h
		hops[h.Hop] = &c
		return
	}
	if h.First.Before(&cur.First) {
		cur.First = h.First
	}
	if !h.Last.Before(&cur.Last) {
		cur.Last, cur.Source, cur.OK, cur.Outcome, cur.Detail = h.Last, h.Source, h.OK, h.Outcome, h.Detail
	}
	cur.Count += h.Count
}

// Apply folds pending hops into a trace's status, seen now.
func Apply(st *v1alpha1.BootTraceStatus, mac string, hops []v1alpha1.BootTraceHop) {
	byHop := map[string]*v1alpha1.BootTraceHop{}
	for _, h := range st.Hops {
		merge(byHop, &h)
	}
	for i := range hops {
		merge(byHop, &hops[i])
	}
	st.MACAddress = mac
	st.Hops = nil
	for _, name := range Hops {
		if h := byHop[name]; h != nil {
			st.Hops = append(st.Hops, *h)
		}
	}
	st.LastHop, st.LastSeen = "", nil
	for i := range st.Hops {
		h := &st.Hops[i]
		if st.LastSeen == nil || !h.Last.Before(st.LastSeen) {
			last := h.Last
			st.LastHop, st.LastSeen = h.Hop, &last
		}
	}
}

// Addresses remembers which MAC each client address belongs to, as the
// MAC's DHCP or boot script request showed it, for the requests that name
// no MAC (a TFTP transfer, a kernel download). It holds at most MaxAddrs
// for an hour each: when full, the expired go, and a new address is not
// remembered while the known ones are live (a flood of addresses cannot
// evict them).
type Addresses struct {
	mu sync.Mutex
	m  map[string]addrMAC
}

type addrMAC struct {
	mac string
	at  time.Time
}

// Limits of Addresses.
const (
	MaxAddrs = 50000
	AddrTTL  = time.Hour
)

// Put remembers that addr is mac's, seen now.
func (a *Addresses) Put(addr, mac string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]addrMAC{}
	}
	if _, ok := a.m[addr]; !ok && len(a.m) >= MaxAddrs {
		for k, e := range a.m {
			if now.Sub(e.at) > AddrTTL {
				delete(a.m, k)
			}
		}
		if len(a.m) >= MaxAddrs {
			return
		}
	}
	a.m[addr] = addrMAC{mac: mac, at: now}
}

// MAC is addr's MAC, or "" when none is known.
func (a *Addresses) MAC(addr string, now time.Time) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[addr]
	if !ok || now.Sub(e.at) > AddrTTL {
		return ""
	}
	return e.mac
}
