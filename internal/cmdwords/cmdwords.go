// Package cmdwords splits command lines the way the Linux kernel splits its
// own (and systemd an ExecStart=): words separated by spaces or tabs
// outside double quotes, the quotes kept. The discovery renderer and the
// dev OS image's init both use it, so they cannot disagree.
package cmdwords

import "strings"

// Split splits s into words on spaces and tabs outside double quotes.
func Split(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case (r == ' ' || r == '\t' || r == '\n') && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
