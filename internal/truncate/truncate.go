// Package truncate owns the one way the repository shortens a string it
// quotes, logs or sends on (an untrusted name in an error, a NACK detail,
// a refused heartbeat's reason): to at most a number of bytes, never
// splitting a UTF-8 character. A cut that split one would put an invalid
// sequence into a log line, and into a protobuf string field, which the
// protobuf runtime refuses to marshal.
//
// The bound is in bytes, as every limit it serves is; a string within it
// is returned as it is, invalid UTF-8 included. The cut backs off to the
// start of the character the bound falls in, so it removes at most
// utf8.UTFMax-1 bytes more than a plain byte cut would.
//
// Concurrency: pure functions, no package state; safe from any goroutine.
package truncate

import "unicode/utf8"

// String returns s cut to at most n bytes at a character boundary: s
// itself when len(s) <= n, "" when n <= 0. When s is valid UTF-8 so is the
// result. In invalid input, a byte that is not a continuation byte counts
// as a character boundary, and where none is found within utf8.UTFMax-1
// bytes of the bound the cut is made at n.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	for i := n; i >= 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i]
		}
	}
	return s[:n]
}

// Marked is String(s, n) followed by mark when s was cut (mark is not
// counted in n); s itself when it fits.
func Marked(s string, n int, mark string) string {
	if len(s) <= n {
		return s
	}
	return String(s, n) + mark
}
