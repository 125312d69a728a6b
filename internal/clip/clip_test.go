package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for name, tc := range map[string]struct {
		s    string
		n    int
		want string
	}{
		"short enough":           {"abc", 3, "abc"},
		"cut":                    {"abcdefgh", 6, "abc…"},
		"not inside a character": {"ab€€", 7, "ab…"}, // € is 3 bytes: "ab€" is 5, and … needs 3 more
		"a character that fits":  {"ab€€x", 8, "ab€…"},
		"too small for …":        {"abcdef", 2, ""},
		"room for … only":        {"abcdef", 3, "…"},
		"nothing":                {"", 0, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got := Text(tc.s, tc.n)
			if got != tc.want {
				t.Fatalf("Text(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
		})
	}
}

func FuzzText(f *testing.F) {
	f.Add("ab€€", 7)
	f.Add(strings.Repeat("é", 100), 33)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		got := Text(s, n)
		if len(got) > n {
			t.Fatalf("Text(%q, %d) = %q: %d bytes", s, n, got, len(got))
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("Text(%q, %d) = %q: cut inside a character", s, n, got)
		}
		if len(s) <= n && got != s {
			t.Fatalf("Text(%q, %d) = %q: cut what fit", s, n, got)
		}
	})
}
