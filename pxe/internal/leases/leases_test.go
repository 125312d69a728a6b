package leases

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLeases(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	file := filepath.Join(t.TempDir(), "leases.json")
	a := netip.MustParseAddr
	cfg := Config{
		Pool:         Pool{First: a("198.18.0.100"), Last: a("198.18.0.102")},
		Reservations: map[string]netip.Addr{"52:54:00:00:00:99": a("198.18.0.50")},
		File:         file,
		Now:          clock,
	}
	db, err := Open(cfg)
	require.NoError(t, err)

	ip, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, a("198.18.0.100"), ip)
	ip2, err := db.Offer("52:54:00:00:00:02", a("198.18.0.100"))
	require.NoError(t, err)
	require.Equal(t, a("198.18.0.101"), ip2, "an offered address is held for its client")
	res, err := db.Offer("52:54:00:00:00:99", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, a("198.18.0.50"), res, "reservations win")

	_, err = db.Ack("52:54:00:00:00:01", ip, time.Hour, "one")
	require.NoError(t, err)
	_, err = db.Ack("52:54:00:00:00:02", ip, time.Hour, "two")
	require.ErrorContains(t, err, "leased to another client")
	_, err = db.Ack("52:54:00:00:00:02", a("198.18.1.1"), time.Hour, "two")
	require.ErrorContains(t, err, "outside the pool")
	_, err = db.Ack("52:54:00:00:00:99", a("198.18.0.101"), time.Hour, "")
	require.ErrorContains(t, err, "reserved")

	// A restart keeps the acknowledged lease: nobody else gets the address.
	db, err = Open(cfg)
	require.NoError(t, err)
	require.Len(t, db.Leases(), 1)
	other, err := db.Offer("52:54:00:00:00:03", a("198.18.0.100"))
	require.NoError(t, err)
	require.NotEqual(t, a("198.18.0.100"), other)
	again, err := db.Offer("52:54:00:00:00:01", netip.Addr{})
	require.NoError(t, err)
	require.Equal(t, a("198.18.0.100"), again, "a returning client gets its address back")

	// Declined addresses stay out of the pool for a while.
	require.NoError(t, db.Decline("52:54:00:00:00:03", other))
	_, err = db.Offer("52:54:00:00:00:04", netip.Addr{})
	require.NoError(t, err)
	_, err = db.Offer("52:54:00:00:00:05", netip.Addr{})
	require.ErrorIs(t, err, ErrPoolExhausted)

	// Expired leases and offers free their addresses.
	now = now.Add(2 * time.Hour)
	_, err = db.Offer("52:54:00:00:00:05", netip.Addr{})
	require.NoError(t, err)

	require.NoError(t, db.Release("52:54:00:00:00:01", a("198.18.0.100")))
	db, err = Open(cfg)
	require.NoError(t, err)
	require.Empty(t, db.Leases())

	_, err = Open(Config{Pool: Pool{First: a("198.18.0.9"), Last: a("198.18.0.1")}})
	require.Error(t, err)
}
