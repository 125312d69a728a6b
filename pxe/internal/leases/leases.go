// Package leases allocates addresses for the authoritative DHCP server and
// keeps every lease it acknowledged on disk, written before the
// acknowledgement leaves, so that a restart never hands an address out
// twice.
//
// The lease file is a JSON array of leases. Each acknowledgement or release
// since it was written is a line appended to the journal next to it
// (File+".journal") and synced: one sync per acknowledgement, where
// rewriting the whole file took two and grew with the number of leases.
// Open replays the journal and folds it into the file, and so does the DB
// whenever the journal grows past twice the leases.
package leases

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/agentboot/agentboot/internal/atomicfile"
)

// Lease binds an address to a MAC address until Expiry.
type Lease struct {
	MAC      string     `json:"mac"`
	IP       netip.Addr `json:"ip"`
	Expiry   time.Time  `json:"expiry"`
	Hostname string     `json:"hostname,omitempty"`
}

// Pool is the range addresses are handed out from.
type Pool struct {
	First, Last netip.Addr
}

// Contains reports whether ip is in the pool.
func (p Pool) Contains(ip netip.Addr) bool {
	return p.First.Compare(ip) <= 0 && ip.Compare(p.Last) <= 0
}

func (p Pool) size() uint32 { return u32(p.Last) - u32(p.First) + 1 }

func (p Pool) at(i uint32) netip.Addr {
	v := u32(p.First) + i
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Config of a DB.
type Config struct {
	Pool Pool
	// Reservations always give these MACs these addresses (which may lie
	// outside the pool).
	Reservations map[string]netip.Addr
	// File persists acknowledged leases; empty keeps them in memory only.
	File string
	// OfferHold is how long an offered address is kept for its client.
	OfferHold time.Duration
	// DeclineHold keeps an address a client found in use out of the pool.
	DeclineHold time.Duration
	Now         func() time.Time
}

// DB is the lease database. It is safe for concurrent use.
type DB struct {
	cfg      Config
	mu       sync.Mutex
	acked    map[string]Lease     // by MAC
	offered  map[string]Lease     // by MAC
	owner    map[netip.Addr]owner // who holds each acked or offered address
	reserved map[netip.Addr]string
	declined map[netip.Addr]time.Time
	// sweepAt is the number of offers at which expired ones are dropped.
	sweepAt int
	// journalLines counts the changes appended since the last compaction.
	journalLines int
	// torn is set when a failed append could not be cut off again.
	torn bool
}

// owner is the MAC an address is acked or offered to.
type owner struct {
	acked, offered string
}

// ErrPoolExhausted is returned when no address is free.
var ErrPoolExhausted = errors.New("no free address in the pool")

// Open loads the lease file, if there is one.
func Open(cfg Config) (*DB, error) {
	if !cfg.Pool.First.Is4() || !cfg.Pool.Last.Is4() || cfg.Pool.Last.Compare(cfg.Pool.First) < 0 {
		return nil, fmt.Errorf("pool %s-%s is not an IPv4 range", cfg.Pool.First, cfg.Pool.Last)
	}
	if cfg.OfferHold == 0 {
		cfg.OfferHold = time.Minute
	}
	if cfg.DeclineHold == 0 {
		cfg.DeclineHold = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	db := &DB{
		cfg: cfg, acked: map[string]Lease{}, offered: map[string]Lease{}, owner: map[netip.Addr]owner{},
		reserved: map[netip.Addr]string{}, declined: map[netip.Addr]time.Time{}, sweepAt: 1024,
	}
	for mac, ip := range cfg.Reservations {
		if other, dup := db.reserved[ip]; dup {
			return nil, fmt.Errorf("%s is reserved for both %s and %s", ip, other, mac)
		}
		db.reserved[ip] = mac
	}
	if cfg.File == "" {
		return db, nil
	}
	if err := db.load(); err != nil {
		return nil, fmt.Errorf("lease file %s: %w", cfg.File, err)
	}
	if err := db.replay(); err != nil {
		return nil, fmt.Errorf("lease journal %s: %w", db.journal(), err)
	}
	if err := db.compact(); err != nil {
		return nil, err
	}
	return db, nil
}

// load reads the lease file, if there is one.
func (db *DB) load() error {
	raw, err := os.ReadFile(db.cfg.File)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var list []Lease
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	for i, l := range list {
		if err := check(l); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		if o := db.owner[l.IP]; o.acked != "" {
			return fmt.Errorf("%s is leased to both %s and %s", l.IP, o.acked, l.MAC)
		}
		if prev, dup := db.acked[l.MAC]; dup {
			db.unown(prev.IP, func(o *owner) { o.acked = "" })
		}
		db.acked[l.MAC] = l
		db.own(l.IP, func(o *owner) { o.acked = l.MAC })
	}
	return nil
}

// check refuses a lease that is not a MAC and an IPv4 address.
func check(l Lease) error {
	hw, err := net.ParseMAC(l.MAC)
	if err != nil || len(hw) != 6 || hw.String() != l.MAC || !l.IP.Is4() {
		return fmt.Errorf("(%q, %s) is not a MAC and an IPv4 address", l.MAC, l.IP)
	}
	return nil
}

func (db *DB) own(ip netip.Addr, set func(*owner)) {
	o := db.owner[ip]
	set(&o)
	db.owner[ip] = o
}

func (db *DB) unown(ip netip.Addr, clear func(*owner)) {
	o, ok := db.owner[ip]
	if !ok {
		return
	}
	clear(&o)
	if o == (owner{}) {
		delete(db.owner, ip)
	} else {
		db.owner[ip] = o
	}
}

// inUse reports whether ip is bound to a MAC other than mac.
func (db *DB) inUse(ip netip.Addr, mac string) bool {
	now := db.cfg.Now()
	if until, ok := db.declined[ip]; ok {
		if now.Before(until) {
			return true
		}
		delete(db.declined, ip)
	}
	if m, ok := db.reserved[ip]; ok && m != mac {
		return true
	}
	o, ok := db.owner[ip]
	if !ok {
		return false
	}
	if o.acked != "" && o.acked != mac && now.Before(db.acked[o.acked].Expiry) {
		return true
	}
	return o.offered != "" && o.offered != mac && now.Before(db.offered[o.offered].Expiry)
}

// Offer picks an address for mac: its reservation, its current (or last)
// lease, the address it asks for if free, else a free one found from a
// position given by its MAC, so a client tends to get the same address even
// without its lease; it holds the address for the client for OfferHold.
func (db *DB) Offer(mac string, requested netip.Addr) (netip.Addr, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	now := db.cfg.Now()
	ip, ok := db.cfg.Reservations[mac]
	if !ok {
		if l, had := db.acked[mac]; had && !db.inUse(l.IP, mac) {
			ip, ok = l.IP, true
		}
	}
	if !ok {
		if l, had := db.offered[mac]; had && !db.inUse(l.IP, mac) {
			ip, ok = l.IP, true
		}
	}
	if !ok && requested.IsValid() && db.cfg.Pool.Contains(requested) && !db.inUse(requested, mac) {
		ip, ok = requested, true
	}
	if !ok {
		h := fnv.New32a()
		h.Write([]byte(mac))
		size := db.cfg.Pool.size()
		start := h.Sum32() % size
		for i := uint32(0); i < size; i++ {
			if a := db.cfg.Pool.at((start + i) % size); !db.inUse(a, mac) {
				ip, ok = a, true
				break
			}
		}
	}
	if !ok {
		// Offers are no promise: the address offered longest ago goes to
		// this client, so DISCOVERs from ever new MACs cannot empty the
		// pool; only acknowledged leases can.
		ip, ok = db.oldestOffer(mac)
	}
	if !ok {
		return netip.Addr{}, ErrPoolExhausted
	}
	if o := db.owner[ip]; o.offered != "" && o.offered != mac {
		db.dropOffer(o.offered)
	}
	db.dropOffer(mac)
	db.offered[mac] = Lease{MAC: mac, IP: ip, Expiry: now.Add(db.cfg.OfferHold)}
	db.own(ip, func(o *owner) { o.offered = mac })
	if len(db.offered) >= db.sweepAt {
		db.sweepOffers(now)
	}
	return ip, nil
}

// oldestOffer is the pool address offered longest ago to another client
// and not acknowledged to anyone, declined or reserved.
func (db *DB) oldestOffer(mac string) (netip.Addr, bool) {
	var best Lease
	found := false
	now := db.cfg.Now()
	for m, l := range db.offered {
		o := db.owner[l.IP]
		if m == mac || !db.cfg.Pool.Contains(l.IP) || o.acked != "" && now.Before(db.acked[o.acked].Expiry) {
			continue
		}
		if _, r := db.reserved[l.IP]; r {
			continue
		}
		if until, d := db.declined[l.IP]; d && now.Before(until) {
			continue
		}
		if !found || l.Expiry.Before(best.Expiry) {
			best, found = l, true
		}
	}
	return best.IP, found
}

func (db *DB) dropOffer(mac string) {
	if l, ok := db.offered[mac]; ok {
		delete(db.offered, mac)
		db.unown(l.IP, func(o *owner) {
			if o.offered == mac {
				o.offered = ""
			}
		})
	}
}

// sweepOffers drops expired offers; it runs each time the offers double,
// so a flood of DISCOVERs from ever new MACs costs constant time each.
func (db *DB) sweepOffers(now time.Time) {
	for mac, l := range db.offered {
		if !now.Before(l.Expiry) {
			db.dropOffer(mac)
		}
	}
	db.sweepAt = max(1024, 2*len(db.offered))
}

// Ack binds ip to mac for d when the address may be its: reserved for it,
// offered to it, already its, or free in the pool. The lease is on disk
// before Ack returns.
func (db *DB) Ack(mac string, ip netip.Addr, d time.Duration, hostname string) (Lease, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if r, ok := db.cfg.Reservations[mac]; ok && r != ip {
		return Lease{}, fmt.Errorf("%s is reserved %s, not %s", mac, r, ip)
	}
	if _, reserved := db.cfg.Reservations[mac]; !reserved && !db.cfg.Pool.Contains(ip) {
		return Lease{}, fmt.Errorf("%s is outside the pool", ip)
	}
	if db.inUse(ip, mac) {
		return Lease{}, fmt.Errorf("%s is leased to another client", ip)
	}
	now := db.cfg.Now()
	prev, had := db.acked[mac]
	_, reserved := db.cfg.Reservations[mac]
	offer, offered := db.offered[mac]
	switch {
	case had && prev.IP == ip:
		if prev.Expiry.Sub(now) >= d/2 && prev.Hostname == hostname {
			// A renewal while half the lease is left: nothing to write.
			// A client's renewals, or anyone's with its MAC, cost no
			// disk sync until then.
			return prev, nil
		}
	case reserved, offered && offer.IP == ip && now.Before(offer.Expiry):
	default:
		// Not offered to this client and not its lease: an INIT-REBOOT
		// of a client we do not know, or a made-up REQUEST. Nothing is
		// written for it.
		return Lease{}, fmt.Errorf("%s was not offered to %s and is not its lease", ip, mac)
	}
	l := Lease{MAC: mac, IP: ip, Expiry: now.Add(d), Hostname: hostname}
	displaced, wasDisplaced := db.acked[db.owner[ip].acked]
	db.setAcked(mac, l)
	if err := db.persist(entry{Op: opAck, Lease: l}); err != nil {
		db.removeAcked(mac)
		if had {
			db.setAcked(mac, prev)
		}
		if wasDisplaced && displaced.MAC != mac {
			db.setAcked(displaced.MAC, displaced)
		}
		return Lease{}, err
	}
	db.dropOffer(mac)
	return l, nil
}

func (db *DB) setAcked(mac string, l Lease) {
	db.removeAcked(mac)
	if o := db.owner[l.IP]; o.acked != "" && o.acked != mac {
		// Another client's expired lease of this address ends here.
		delete(db.acked, o.acked)
	}
	db.acked[mac] = l
	db.own(l.IP, func(o *owner) { o.acked = mac })
}

func (db *DB) removeAcked(mac string) {
	if l, ok := db.acked[mac]; ok {
		delete(db.acked, mac)
		db.unown(l.IP, func(o *owner) {
			if o.acked == mac {
				o.acked = ""
			}
		})
	}
}

// Known reports whether mac holds a lease or a reservation: a client the
// server already serves, which a flood of new MACs must not crowd out.
func (db *DB) Known(mac string) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	if _, ok := db.cfg.Reservations[mac]; ok {
		return true
	}
	l, ok := db.acked[mac]
	return ok && db.cfg.Now().Before(l.Expiry)
}

// LeaseOf returns mac's current lease.
func (db *DB) LeaseOf(mac string) (Lease, bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	l, ok := db.acked[mac]
	return l, ok && db.cfg.Now().Before(l.Expiry)
}

// Release frees mac's address.
func (db *DB) Release(mac string, ip netip.Addr) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.dropAcked(mac, ip)
}

// Decline takes an address a client found in use out of the pool for a
// while: only an address of the pool offered or leased to that client, and
// only while fewer than a quarter of the pool (rounded down) are declined,
// so that DECLINEs, from one MAC or many, cannot empty the pool.
func (db *DB) Decline(mac string, ip netip.Addr) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	now := db.cfg.Now()
	offer, offered := db.offered[mac]
	lease, leased := db.acked[mac]
	switch {
	case !db.cfg.Pool.Contains(ip):
		return fmt.Errorf("%s is not in the pool", ip)
	case !(offered && offer.IP == ip) && !(leased && lease.IP == ip):
		return fmt.Errorf("%s was neither offered nor leased to %s", ip, mac)
	}
	for a, until := range db.declined {
		if !now.Before(until) {
			delete(db.declined, a)
		}
	}
	// A quarter of the pool at most, never rounded up: with a floor, made-up
	// DECLINEs emptied pools smaller than 64 addresses.
	if limit := int(db.cfg.Pool.size() / 4); len(db.declined) >= limit {
		db.dropOffer(mac)
		return fmt.Errorf("%d addresses are declined already, a quarter of the pool (%d addresses) at most: %s stays in the pool", len(db.declined), limit, ip)
	}
	db.declined[ip] = now.Add(db.cfg.DeclineHold)
	db.dropOffer(mac)
	return db.dropAcked(mac, ip)
}

// dropAcked forgets mac's lease of ip and persists that, keeping the lease
// when the file cannot be written.
func (db *DB) dropAcked(mac string, ip netip.Addr) error {
	l, ok := db.acked[mac]
	if !ok || l.IP != ip {
		return nil
	}
	db.removeAcked(mac)
	if err := db.persist(entry{Op: opDrop, Lease: Lease{MAC: mac, IP: ip}}); err != nil {
		db.setAcked(mac, l)
		return err
	}
	return nil
}

// Leases returns the acknowledged leases, sorted by address.
func (db *DB) Leases() []Lease {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make([]Lease, 0, len(db.acked))
	for _, l := range db.acked {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out
}

// entry is a line of the journal: a lease acknowledged, or dropped
// (released or declined).
type entry struct {
	Op    string `json:"op"`
	Lease Lease  `json:"lease"`
}

const (
	opAck  = "ack"
	opDrop = "drop"
)

func (db *DB) journal() string { return db.cfg.File + ".journal" }

// persist appends a change to the journal and syncs it. A failed write is
// cut off again, so the journal never holds half a line before a whole one.
func (db *DB) persist(e entry) error {
	if db.cfg.File == "" {
		return nil
	}
	if db.torn {
		// The journal may end in half a line, which the next line
		// would be glued to: write all leases afresh instead (they
		// include this change already), or acknowledge nothing.
		if err := db.compact(); err != nil {
			return err
		}
		db.torn = false
		return nil
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	// Opened each time, not created: compact made it, and made its name
	// durable in the directory.
	f, err := os.OpenFile(db.journal(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("lease journal: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("lease journal: %w", err)
	}
	if _, err = f.Write(append(line, '\n')); err == nil {
		err = f.Sync()
	}
	if err != nil {
		if terr := f.Truncate(st.Size()); terr != nil {
			db.torn = true
		}
		return fmt.Errorf("lease journal %s: %w", db.journal(), err)
	}
	db.journalLines++
	if db.journalLines > max(256, 2*len(db.acked)) {
		// The change is on disk already; a fold that fails is tried
		// again after the next change.
		_ = db.compact()
	}
	return nil
}

// replay applies the journal's changes in order. A last line without its
// newline is a write that never finished, whose acknowledgement was never
// sent: it is ignored.
func (db *DB) replay() error {
	raw, err := os.ReadFile(db.journal())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	lines := bytes.Split(raw, []byte{'\n'})
	for i, line := range lines[:len(lines)-1] { // the rest after the last newline is torn or empty
		var e entry
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) > 0 {
			// Two changes glued together, say: the second would be lost.
			return fmt.Errorf("line %d: %d bytes after the change", i+1, len(rest))
		}
		if err := check(e.Lease); err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		switch e.Op {
		case opAck:
			db.setAcked(e.Lease.MAC, e.Lease)
		case opDrop:
			if cur, ok := db.acked[e.Lease.MAC]; ok && cur.IP == e.Lease.IP {
				db.removeAcked(e.Lease.MAC)
			}
		default:
			return fmt.Errorf("line %d: operation %q: want ack or drop", i+1, e.Op)
		}
	}
	return nil
}

// compact writes the acknowledged leases (expired ones included: a
// returning client gets its address back while nobody else took it) to the
// lease file, atomically and durably, then empties the journal. A crash in
// between replays a journal whose changes the file holds already, which
// changes nothing.
func (db *DB) compact() error {
	if db.cfg.File == "" {
		return nil
	}
	list := make([]Lease, 0, len(db.acked))
	for _, l := range db.acked {
		list = append(list, l)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].IP.Less(list[j].IP) })
	data, err := json.MarshalIndent(list, "", " ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(db.cfg.File, data, 0o644); err != nil {
		return fmt.Errorf("lease file: %w", err)
	}
	if err := atomicfile.Write(db.journal(), nil, 0o644); err != nil {
		return fmt.Errorf("lease journal: %w", err)
	}
	db.journalLines = 0
	return nil
}
