package gossip

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// ParseKey reads the cluster key (Config.SecretKey) from the bytes of a key
// file. A file of exactly 16, 24 or 32 bytes is the raw key (AES-128, -192
// or -256; head -c 32 /dev/urandom > gossip.key): it is taken as is, never
// trimmed, since any byte, whitespace included, can be part of a random
// key. Any other file is one line of text, with one trailing newline
// (\n or \r\n) allowed: the key in hex (32, 48 or 64 digits; openssl rand
// -hex 32) or in standard padded base64 (openssl rand -base64 32). Every
// member must be given the same file.
func ParseKey(b []byte) ([]byte, error) {
	switch len(b) {
	case 16, 24, 32:
		return bytes.Clone(b), nil
	}
	text := b
	if t, ok := bytes.CutSuffix(text, []byte("\n")); ok {
		text = t
		if t, ok := bytes.CutSuffix(text, []byte("\r")); ok {
			text = t
		}
	}
	if bytes.ContainsAny(text, "\r\n") {
		// encoding/base64 skips line breaks; a key is one line.
		return nil, fmt.Errorf("gossip: key file of %d bytes has more than one line: want exactly 16, 24 or 32 raw bytes, or the key in hex or base64 on one line", len(b))
	}
	if k, err := hex.DecodeString(string(text)); err == nil && keyLen(len(k)) {
		return k, nil
	}
	if k, err := base64.StdEncoding.Strict().DecodeString(string(text)); err == nil && keyLen(len(k)) {
		return k, nil
	}
	return nil, fmt.Errorf("gossip: key file of %d bytes: want exactly 16, 24 or 32 raw bytes (head -c 32 /dev/urandom > gossip.key), "+
		"or a 16-, 24- or 32-byte key in hex or base64 on one line (openssl rand -base64 32 > gossip.key)", len(b))
}

func keyLen(n int) bool { return n == 16 || n == 24 || n == 32 }
