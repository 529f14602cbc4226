package gossip

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"testing"
)

// A raw key is taken byte for byte, whitespace included (it used to be
// TrimSpace'd, which changed keys that begin or end with a space or a
// newline byte and refused them as too short); text keys in hex or base64
// may end with one newline.
func TestParseKey(t *testing.T) {
	raw := bytes.Repeat([]byte{0xa7}, 32)
	raw[0], raw[31] = '\n', ' ' // a random key may begin or end with any byte
	k16 := []byte("0123456789abcdef")
	cases := []struct {
		name string
		file []byte
		want []byte
	}{
		{"raw 32 bytes with whitespace at the ends", raw, raw},
		{"raw 16 bytes", k16, k16},
		{"raw 24 bytes", bytes.Repeat([]byte{0}, 24), bytes.Repeat([]byte{0}, 24)},
		{"hex with newline", []byte(hex.EncodeToString(raw) + "\n"), raw},
		{"hex with CRLF", []byte(hex.EncodeToString(k16) + "\r\n"), k16},
		{"base64 with newline", []byte(base64.StdEncoding.EncodeToString(raw) + "\n"), raw},
		{"base64 without newline", []byte(base64.StdEncoding.EncodeToString(raw)), raw},
		{"raw 31 bytes", raw[:31], nil},
		{"raw 33 bytes", append(bytes.Clone(raw), 1), nil},
		{"hex of 20 bytes", []byte(hex.EncodeToString(make([]byte, 20)) + "\n"), nil},
		{"base64 with spaces around", []byte("  " + base64.StdEncoding.EncodeToString(raw) + "  \n"), nil},
		{"two newlines", []byte(base64.StdEncoding.EncodeToString(raw) + "\n\n"), nil},
		{"empty", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKey(tc.file)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("ParseKey accepted %q as %x", tc.file, got)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("ParseKey = %x, %v; want %x", got, err, tc.want)
			}
		})
	}
}

// FuzzParseKey: any file either yields a key memberlist accepts (16, 24 or
// 32 bytes) or an error, never a panic.
func FuzzParseKey(f *testing.F) {
	f.Add([]byte("0123456789abcdef"))
	f.Add([]byte(hex.EncodeToString(make([]byte, 32)) + "\n"))
	f.Add([]byte(base64.StdEncoding.EncodeToString(make([]byte, 24)) + "\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 4096 {
			return
		}
		k, err := ParseKey(b)
		if err == nil && !keyLen(len(k)) {
			t.Fatalf("key of %d bytes from %q", len(k), b)
		}
	})
}
