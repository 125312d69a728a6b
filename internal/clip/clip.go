// Package clip shortens text that goes into a status field, an event, a
// log line or an error, where a peer or a tenant wrote it and its length is
// theirs to choose. It cuts at a character boundary (never leaving half of a
// UTF-8 sequence, which JSON would store as U+FFFD) and says that it cut.
package clip

import "unicode/utf8"

// ellipsis ends a cut text.
const ellipsis = "…"

// Text is s cut to at most n bytes, ending in "…" when it was cut.
func Text(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < len(ellipsis) {
		return ""
	}
	n -= len(ellipsis)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + ellipsis
}
