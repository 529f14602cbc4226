package truncate

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"héllo", 2, "h"},  // é is 2 bytes at 1..2
		{"héllo", 3, "hé"}, // the bound falls after é
		{"a€b", 2, "a"},    // € is 3 bytes at 1..3
		{"a€b", 3, "a"},
		{"a€b", 4, "a€"},
		{"😀x", 3, ""}, // 4-byte character at 0..3
		{"😀x", 4, "😀"},
		{"\x80\x80\x80\x80\x80", 2, "\x80\x80"}, // no boundary near the bound: a byte cut
		{"\xffabc", 2, "\xffa"},
	} {
		if got := String(tc.s, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestMarked(t *testing.T) {
	if got := Marked("abcdef", 3, "…"); got != "abc…" {
		t.Errorf("got %q", got)
	}
	if got := Marked("abc", 3, "…"); got != "abc" {
		t.Errorf("fits: got %q", got)
	}
	if got := Marked("ab€", 3, "..."); got != "ab..." {
		t.Errorf("got %q", got)
	}
}

// FuzzTruncate: the result is a prefix of the input of at most n bytes
// (the input itself when it fits); valid UTF-8 input gives valid UTF-8,
// cut no more than utf8.UTFMax-1 bytes short of the bound; Marked is
// String plus the mark exactly when the input was cut.
func FuzzTruncate(f *testing.F) {
	for _, s := range []string{"", "abc", "héllo wörld", "a€b", "😀😀😀", "\xff\x80\x80", strings.Repeat("ж", 40)} {
		for _, n := range []int{-1, 0, 1, 2, 3, 4, 7, 64} {
			f.Add(s, n)
		}
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		got := String(s, n)
		if !strings.HasPrefix(s, got) {
			t.Fatalf("String(%q, %d) = %q: not a prefix", s, n, got)
		}
		if len(s) <= n && got != s {
			t.Fatalf("String(%q, %d) = %q: cut a string that fits", s, n, got)
		}
		if len(got) > max(n, 0) {
			t.Fatalf("String(%q, %d) = %q: %d bytes, over the bound", s, n, got, len(got))
		}
		if utf8.ValidString(s) {
			if !utf8.ValidString(got) {
				t.Fatalf("String(%q, %d) = %q: invalid UTF-8 from valid input", s, n, got)
			}
			if n > 0 && len(s) > n && len(got) <= n-utf8.UTFMax {
				t.Fatalf("String(%q, %d) = %q: cut further than one character", s, n, got)
			}
		}
		m := Marked(s, n, "…")
		if len(s) <= n {
			if m != s {
				t.Fatalf("Marked(%q, %d) = %q, want the input", s, n, m)
			}
		} else if m != got+"…" {
			t.Fatalf("Marked(%q, %d) = %q, want %q", s, n, m, got+"…")
		}
	})
}
