package leases

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var a = netip.MustParseAddr

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func open(t *testing.T, cfg Config) *DB {
	t.Helper()
	db, err := Open(cfg)
	require.NoError(t, err)
	return db
}

func TestOfferAckRestart(t *testing.T) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{
		Pool:         Pool{First: a("198.18.0.100"), Last: a("198.18.0.102")},
		Reservations: map[string]netip.Addr{"52:54:00:00:00:99": a("198.18.0.50")},
		File:         filepath.Join(t.TempDir(), "leases.json"),
		Now:          c.Now,
	}
	db := open(t, cfg)

	ip, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.True(t, cfg.Pool.Contains(ip))
	again, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, ip, again, "a retransmitted DISCOVER gets the same offer")
	ip2, err := db.Offer("52:54:00:00:00:02", ip)
	require.NoError(t, err)
	require.NotEqual(t, ip, ip2, "an offered address is held for its client")
	res, err := db.Offer("52:54:00:00:00:99", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, a("198.18.0.50"), res, "reservations win")

	_, err = db.Ack("52:54:00:00:00:01", ip, time.Hour, "one")
	require.NoError(t, err)
	_, err = db.Ack("52:54:00:00:00:02", ip, time.Hour, "two")
	require.ErrorContains(t, err, "leased to another client")
	_, err = db.Ack("52:54:00:00:00:02", a("198.18.1.1"), time.Hour, "two")
	require.ErrorContains(t, err, "outside the pool")
	_, err = db.Ack("52:54:00:00:00:99", ip2, time.Hour, "")
	require.ErrorContains(t, err, "reserved")
	_, err = db.Ack("52:54:00:00:00:99", a("198.18.0.50"), time.Hour, "")
	require.NoError(t, err, "a reservation may lie outside the pool")

	// A restart keeps the acknowledged leases: nobody else gets the address.
	db = open(t, cfg)
	require.Len(t, db.Leases(), 2)
	for i := range 3 {
		other, err := db.Offer(fmt.Sprintf("52:54:00:00:01:%02x", i), ip)
		if err == nil {
			require.NotEqual(t, ip, other)
		}
	}
	back, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, ip, back, "a returning client gets its address back")

	// Release frees it, on disk too.
	require.NoError(t, db.Release("52:54:00:00:00:01", ip))
	db = open(t, cfg)
	require.Len(t, db.Leases(), 1)
}

func TestDeclineExhaustionExpiry(t *testing.T) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	db := open(t, Config{Pool: Pool{First: a("198.18.0.100"), Last: a("198.18.0.103")}, Now: c.Now})
	one, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.NoError(t, db.Decline("52:54:00:00:00:01", one), "a quarter of a pool of 4")
	offered := map[string]netip.Addr{}
	for _, mac := range []string{"52:54:00:00:00:02", "52:54:00:00:00:03", "52:54:00:00:00:04"} {
		ip, err := db.Offer(mac, netip.Addr{})
		require.NoError(t, err)
		require.NotEqual(t, one, ip, "a declined address stays out of the pool")
		offered[mac] = ip
		c.now = c.now.Add(time.Second) // offers in order
	}
	// An offer is no promise: with every free address offered, the one
	// offered longest ago goes to the next client (DISCOVERs from ever new
	// MACs cannot empty the pool).
	five, err := db.Offer("52:54:00:00:00:05", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, offered["52:54:00:00:00:02"], five)
	_, err = db.Ack("52:54:00:00:00:02", five, time.Hour, "")
	require.ErrorContains(t, err, "another client", "its offer went to 52:54:00:00:00:05")
	// Leases are a promise: with every address leased or declined, nothing.
	for mac, ip := range map[string]netip.Addr{"52:54:00:00:00:05": five, "52:54:00:00:00:03": offered["52:54:00:00:00:03"], "52:54:00:00:00:04": offered["52:54:00:00:00:04"]} {
		_, err = db.Ack(mac, ip, time.Hour, "")
		require.NoError(t, err)
	}
	_, err = db.Offer("52:54:00:00:00:06", netip.Addr{})
	require.ErrorIs(t, err, ErrPoolExhausted)

	// Offers and declines run out; an expired lease's address goes to
	// another client, whose lease then replaces it.
	c.now = c.now.Add(2 * time.Hour)
	got := map[netip.Addr]bool{}
	for _, mac := range []string{"52:54:00:00:00:07", "52:54:00:00:00:08", "52:54:00:00:00:09", "52:54:00:00:00:0a"} {
		ip, err := db.Offer(mac, netip.Addr{})
		require.NoError(t, err)
		got[ip] = true
		_, err = db.Ack(mac, ip, time.Hour, "")
		require.NoError(t, err)
	}
	require.Len(t, got, 4)
	require.Len(t, db.Leases(), 4, "the expired leases were replaced")

	// A pool of fewer than 4 takes no DECLINE at all: the quarter is
	// never rounded up, so made-up DECLINEs cannot take a small pool.
	small := open(t, Config{Pool: Pool{First: a("198.18.1.1"), Last: a("198.18.1.3")}, Now: c.Now})
	ip, err := small.Offer("52:54:00:00:01:01", netip.Addr{})
	require.NoError(t, err)
	require.ErrorContains(t, small.Decline("52:54:00:00:01:01", ip), "0 addresses")
}

// Offers are spread by MAC and stay cheap in a large pool full of offers.
func TestLargePool(t *testing.T) {
	db := open(t, Config{Pool: Pool{First: a("198.18.0.1"), Last: a("198.18.255.254")}})
	seen := map[netip.Addr]string{}
	for i := range 50000 {
		mac := fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff)
		ip, err := db.Offer(mac, netip.Addr{})
		require.NoError(t, err)
		if prev, dup := seen[ip]; dup {
			t.Fatalf("%s offered to %s and %s", ip, prev, mac)
		}
		seen[ip] = mac
	}
	fresh := open(t, Config{Pool: Pool{First: a("198.18.0.1"), Last: a("198.18.255.254")}})
	ip, err := fresh.Offer("02:00:00:00:00:00", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:00:00", seen[ip], "the same MAC lands on the same address")
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	pool := Pool{First: a("198.18.0.1"), Last: a("198.18.0.9")}
	_, err := Open(Config{Pool: Pool{First: a("198.18.0.9"), Last: a("198.18.0.1")}})
	require.ErrorContains(t, err, "is not an IPv4 range")
	_, err = Open(Config{Pool: pool, Reservations: map[string]netip.Addr{"52:54:00:00:00:01": a("198.18.0.5"), "52:54:00:00:00:02": a("198.18.0.5")}})
	require.ErrorContains(t, err, "198.18.0.5 is reserved for both")
	for name, content := range map[string]string{
		"garbage":   `not json`,
		"bad MAC":   `[{"mac":"zz","ip":"198.18.0.2","expiry":"2026-01-01T00:00:00Z"}]`,
		"IPv6":      `[{"mac":"52:54:00:00:00:01","ip":"2001:db8::1","expiry":"2026-01-01T00:00:00Z"}]`,
		"duplicate": `[{"mac":"52:54:00:00:00:01","ip":"198.18.0.2","expiry":"2026-01-01T00:00:00Z"},{"mac":"52:54:00:00:00:02","ip":"198.18.0.2","expiry":"2026-01-01T00:00:00Z"}]`,
	} {
		f := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(f, []byte(content), 0o644))
		_, err := Open(Config{Pool: pool, File: f})
		require.ErrorContains(t, err, f, name)
	}
	// A journal that cannot be written fails the ACK, and the lease is not
	// granted (a directory in its place stops even root).
	file := filepath.Join(dir, "leases.json")
	db := open(t, Config{Pool: pool, File: file})
	require.NoError(t, os.Remove(file+".journal"))
	require.NoError(t, os.Mkdir(file+".journal", 0o755))
	_, err = grant(db, "52:54:00:00:00:01", a("198.18.0.2"), time.Hour, "")
	require.ErrorContains(t, err, "lease journal")
	require.Empty(t, db.Leases())

	// A lease file that cannot be written is refused at start, not at the
	// first ACK.
	_, err = Open(Config{Pool: pool, File: filepath.Join(dir, "missing", "leases.json")})
	require.ErrorContains(t, err, "lease file")
}

const (
	mac1 = "52:54:00:00:00:01"
	mac2 = "52:54:00:00:00:02"
)

// Acknowledgements and releases since the lease file was written are
// replayed from the journal; a last line cut short by a crash is ignored,
// a bad line anywhere else is refused with its number.
func TestJournal(t *testing.T) {
	pool := Pool{First: a("198.18.0.1"), Last: a("198.18.0.9")}
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Pool: pool, File: filepath.Join(t.TempDir(), "leases.json"), Now: c.Now}
	journal := cfg.File + ".journal"
	db := open(t, cfg)
	_, err := grant(db, mac1, a("198.18.0.2"), time.Hour, "one")
	require.NoError(t, err)
	_, err = grant(db, mac2, a("198.18.0.3"), time.Hour, "two")
	require.NoError(t, err)
	require.NoError(t, db.Release(mac1, a("198.18.0.2")))
	raw, err := os.ReadFile(journal)
	require.NoError(t, err)
	require.Equal(t, 3, bytes.Count(raw, []byte("\n")), "one line per change: %s", raw)
	snapshot, err := os.ReadFile(cfg.File)
	require.NoError(t, err)
	require.JSONEq(t, "[]", string(snapshot), "the lease file is written when the journal is folded in")

	// A crash in the middle of the next append.
	require.NoError(t, os.WriteFile(journal, append(bytes.Clone(raw), `{"op":"ack","lease":{"mac":"52:54:00:00:00:0`...), 0o644))
	db = open(t, cfg)
	require.Equal(t, []Lease{{MAC: mac2, IP: a("198.18.0.3"), Expiry: c.now.Add(time.Hour), Hostname: "two"}}, db.Leases())
	raw, err = os.ReadFile(journal)
	require.NoError(t, err)
	require.Empty(t, raw, "Open folds the journal into the lease file")

	// A crash after the lease file was written but before the journal was
	// emptied: replaying it again changes nothing.
	_, err = grant(db, mac1, a("198.18.0.4"), time.Hour, "one again")
	require.NoError(t, err)
	require.NoError(t, db.Release(mac2, a("198.18.0.3")))
	raw, err = os.ReadFile(journal)
	require.NoError(t, err)
	db = open(t, cfg)
	want := db.Leases()
	require.Len(t, want, 1)
	require.NoError(t, os.WriteFile(journal, raw, 0o644))
	require.Equal(t, want, open(t, cfg).Leases())

	// A drop names the address it dropped: one of another address (a
	// hand-edited journal) leaves the lease alone.
	require.NoError(t, os.WriteFile(journal, []byte(`{"op":"drop","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.9"}}`+"\n"), 0o644))
	require.Equal(t, want, open(t, cfg).Leases())

	for name, line := range map[string]string{
		"not JSON":      "{",
		"unknown op":    `{"op":"grant","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.2","expiry":"2026-01-01T00:00:00Z"}}`,
		"bad MAC":       `{"op":"ack","lease":{"mac":"52-54-00-00-00-01","ip":"198.18.0.2","expiry":"2026-01-01T00:00:00Z"}}`,
		"unknown field": `{"op":"ack","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.2"},"extra":1}`,
		"two glued":     `{"op":"drop","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.4"}}{"op":"drop","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.4"}}`,
	} {
		require.NoError(t, os.WriteFile(journal, []byte(line+"\n"+`{"op":"drop","lease":{"mac":"52:54:00:00:00:01","ip":"198.18.0.4"}}`+"\n"), 0o644))
		_, err := Open(cfg)
		require.ErrorContains(t, err, "lease journal "+journal+": line 1", name)
	}
}

// After an append that failed and could not be cut off, the journal may
// end in half a line: the next change is not glued to it but written with
// every lease to a fresh lease file and journal.
func TestTornJournalIsRewritten(t *testing.T) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Pool: Pool{First: a("198.18.0.1"), Last: a("198.18.0.9")}, File: filepath.Join(t.TempDir(), "leases.json"), Now: c.Now}
	db := open(t, cfg)
	_, err := grant(db, mac1, a("198.18.0.2"), time.Hour, "")
	require.NoError(t, err)
	f, err := os.OpenFile(cfg.File+".journal", os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"op":"ack","lease":{"mac":"52:54`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	db.torn = true
	_, err = grant(db, mac2, a("198.18.0.3"), time.Hour, "")
	require.NoError(t, err)
	raw, err := os.ReadFile(cfg.File + ".journal")
	require.NoError(t, err)
	require.Empty(t, raw, "folded into the lease file")
	_, err = grant(db, mac1, a("198.18.0.2"), 2*time.Hour, "")
	require.NoError(t, err)
	require.Equal(t, db.Leases(), open(t, cfg).Leases())
	require.Len(t, db.Leases(), 2)
}

// The journal is folded into the lease file as it grows, so it stays
// short however many changes there are.
func TestJournalStaysShort(t *testing.T) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Pool: Pool{First: a("198.18.0.1"), Last: a("198.18.0.9")}, File: filepath.Join(t.TempDir(), "leases.json"), Now: c.Now}
	db := open(t, cfg)
	for i := range 1000 {
		ip := a(fmt.Sprintf("198.18.0.%d", 1+i%9))
		_, err := grant(db, mac1, ip, time.Hour, "")
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, db.Release(mac1, ip))
		}
	}
	raw, err := os.ReadFile(cfg.File + ".journal")
	require.NoError(t, err)
	require.LessOrEqual(t, bytes.Count(raw, []byte("\n")), 256)
	require.Equal(t, db.Leases(), open(t, cfg).Leases())
	require.Equal(t, a("198.18.0.1"), db.Leases()[0].IP, "the last ACK (i=999) was of 198.18.0.1")
}

// grant acknowledges ip to mac as after an OFFER of it, as a client's
// DHCPREQUEST in SELECTING state is (white-box: the offer is placed
// directly, wherever the pool's spread would have put it).
func grant(db *DB, mac string, ip netip.Addr, d time.Duration, hostname string) (Lease, error) {
	db.mu.Lock()
	if l, ok := db.acked[mac]; !ok || l.IP != ip {
		db.dropOffer(mac)
		db.offered[mac] = Lease{MAC: mac, IP: ip, Expiry: db.cfg.Now().Add(db.cfg.OfferHold)}
		db.own(ip, func(o *owner) { o.offered = mac })
	}
	db.mu.Unlock()
	return db.Ack(mac, ip, d, hostname)
}

// What a host on the boot network can do to the pool with made-up packets:
// DECLINE only what it was offered or leased, and at most a quarter of the
// pool at once; REQUEST only what it was offered or holds, and renew
// without a disk write while half its lease is left.
func TestSpoofedPacketsCannotDrainThePool(t *testing.T) {
	c := &clock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Pool: Pool{First: a("198.18.0.1"), Last: a("198.18.0.100")}, File: filepath.Join(t.TempDir(), "leases.json"), Now: c.Now}
	db := open(t, cfg)
	victim, err := db.Offer(mac1, netip.Addr{})
	require.NoError(t, err)
	_, err = db.Ack(mac1, victim, time.Hour, "victim")
	require.NoError(t, err)

	// A REQUEST for a free address nobody offered it: refused.
	free := a("198.18.0.77")
	if free == victim {
		free = a("198.18.0.78")
	}
	_, err = db.Ack(mac2, free, time.Hour, "")
	require.ErrorContains(t, err, free.String()+" was not offered to "+mac2+" and is not its lease")

	// DECLINE of someone else's address, or of one outside the pool.
	require.ErrorContains(t, db.Decline(mac2, victim), "neither offered nor leased to "+mac2)
	require.ErrorContains(t, db.Decline(mac2, a("10.0.0.1")), "not in the pool")
	require.Len(t, db.Leases(), 1, "the victim keeps its lease")

	// DECLINEs from ever new MACs, each of its own offer: a quarter of the
	// pool at most.
	declined := 0
	for i := range 100 {
		mac := fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)
		ip, err := db.Offer(mac, netip.Addr{})
		require.NoError(t, err)
		if db.Decline(mac, ip) == nil {
			declined++
		}
	}
	require.Equal(t, 25, declined)
	_, err = db.Offer("02:00:00:00:ff:ff", netip.Addr{})
	require.NoError(t, err, "75 addresses remain")

	// A REQUEST for an address never offered is refused and writes nothing.
	journal := func() int {
		raw, err := os.ReadFile(cfg.File + ".journal")
		require.NoError(t, err)
		return bytes.Count(raw, []byte("\n"))
	}
	before := journal()
	for i := range 50 {
		_, err := db.Ack(fmt.Sprintf("02:00:00:01:00:%02x", i), a(fmt.Sprintf("198.18.0.%d", 30+i)), time.Hour, "")
		require.Error(t, err, "never offered to this MAC (free, or offered to another)")
	}
	// Renewals (the victim's, or anyone's with its MAC) write nothing
	// while half the lease is left, then one line.
	for range 50 {
		l, err := db.Ack(mac1, victim, time.Hour, "victim")
		require.NoError(t, err)
		require.Equal(t, victim, l.IP)
	}
	require.Equal(t, before, journal(), "no write for made-up REQUESTs or early renewals")
	c.now = c.now.Add(31 * time.Minute)
	l, err := db.Ack(mac1, victim, time.Hour, "victim")
	require.NoError(t, err)
	require.Equal(t, c.now.Add(time.Hour), l.Expiry)
	require.Equal(t, before+1, journal())
}
