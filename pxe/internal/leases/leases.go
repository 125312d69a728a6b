// Package leases allocates addresses for the authoritative DHCP server and
// keeps every lease it acknowledged in a file, written before the
// acknowledgement leaves, so that a restart never hands an address out
// twice.
package leases

import (
	"encoding/json"
	"errors"
	"fmt"
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
	acked    map[string]Lease // by MAC
	offered  map[string]Lease // by MAC
	declined map[netip.Addr]time.Time
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
	db := &DB{cfg: cfg, acked: map[string]Lease{}, offered: map[string]Lease{}, declined: map[netip.Addr]time.Time{}}
	if cfg.File == "" {
		return db, nil
	}
	raw, err := os.ReadFile(cfg.File)
	if errors.Is(err, os.ErrNotExist) {
		return db, nil
	}
	if err != nil {
		return nil, err
	}
	var list []Lease
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("lease file %s: %w", cfg.File, err)
	}
	for _, l := range list {
		db.acked[l.MAC] = l
	}
	return db, nil
}

// inUse reports whether ip is bound to a MAC other than mac.
func (db *DB) inUse(ip netip.Addr, mac string) bool {
	now := db.cfg.Now()
	if until, ok := db.declined[ip]; ok && now.Before(until) {
		return true
	}
	for m, r := range db.cfg.Reservations {
		if r == ip && m != mac {
			return true
		}
	}
	for _, set := range []map[string]Lease{db.acked, db.offered} {
		for m, l := range set {
			if l.IP == ip && m != mac && now.Before(l.Expiry) {
				return true
			}
		}
	}
	return false
}

// Offer picks an address for mac: its reservation, its current lease, the
// address it asks for if free, else the lowest free one; it holds the
// address for the client until OfferHold passes.
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
	if !ok && requested.IsValid() && db.cfg.Pool.Contains(requested) && !db.inUse(requested, mac) {
		ip, ok = requested, true
	}
	for a := db.cfg.Pool.First; !ok && a.Compare(db.cfg.Pool.Last) <= 0; a = a.Next() {
		if !db.inUse(a, mac) {
			ip, ok = a, true
		}
	}
	if !ok {
		return netip.Addr{}, ErrPoolExhausted
	}
	db.offered[mac] = Lease{MAC: mac, IP: ip, Expiry: now.Add(db.cfg.OfferHold)}
	return ip, nil
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
	l := Lease{MAC: mac, IP: ip, Expiry: db.cfg.Now().Add(d), Hostname: hostname}
	prev, had := db.acked[mac]
	db.acked[mac] = l
	delete(db.offered, mac)
	if err := db.persist(); err != nil {
		if had {
			db.acked[mac] = prev
		} else {
			delete(db.acked, mac)
		}
		return Lease{}, err
	}
	return l, nil
}

// Release frees mac's address.
func (db *DB) Release(mac string, ip netip.Addr) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if l, ok := db.acked[mac]; ok && l.IP == ip {
		delete(db.acked, mac)
		return db.persist()
	}
	return nil
}

// Decline takes an address a client found in use out of the pool for a
// while.
func (db *DB) Decline(mac string, ip netip.Addr) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.declined[ip] = db.cfg.Now().Add(db.cfg.DeclineHold)
	delete(db.offered, mac)
	if l, ok := db.acked[mac]; ok && l.IP == ip {
		delete(db.acked, mac)
		return db.persist()
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

// persist writes the acknowledged leases (expired ones included: an address
// is only reused once its lease has run out) atomically and durably.
func (db *DB) persist() error {
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
	return atomicfile.Write(db.cfg.File, data, 0o644)
}
