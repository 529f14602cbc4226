package election

import (
	"errors"
	"net"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// FuzzCheckEndpoint: endpoints come from flags and config files. Any input
// is either accepted as something with a host and a valid port, or refused
// with ErrInvalidConfig; never a panic.
func FuzzCheckEndpoint(f *testing.F) {
	for _, s := range []string{"127.0.0.1:2379", "http://127.0.0.1:2379", "https://[::1]:2379", "etcd-0:2379",
		"", ":", "http://", "https://:1", "unix:///tmp/x", "127.0.0.1:99999", "http://u:p@h:1/x?y#z", "[::1", "%zz://a:1"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, ep string, tlsOn bool) {
		if len(ep) > 512 {
			return
		}
		err := checkEndpoint(ep, tlsOn)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("checkEndpoint(%q) = %v, not ErrInvalidConfig", ep, err)
			}
			return
		}
		hp := ep
		if i := strings.Index(ep, "://"); i >= 0 {
			hp = ep[i+3:]
			if strings.HasPrefix(ep, "http://") == tlsOn {
				t.Fatalf("accepted %q with tls=%v", ep, tlsOn)
			}
		}
		hp = strings.TrimSuffix(hp, "/")
		if h, p, err := net.SplitHostPort(hp); err != nil || h == "" || p == "" || p == "0" {
			t.Fatalf("accepted %q: host %q port %q err %v", ep, h, p, err)
		}
	})
}

// FuzzPrefixAndFence: any configured prefix normalises to one ending in
// "/" (idempotently), and overlapsPrefix agrees with HasPrefix for single
// keys and with a brute-force check for prefix ranges.
func FuzzPrefixAndFence(f *testing.F) {
	for _, s := range [][2]string{{"/a/el", "/a/el/x"}, {"", DefaultPrefix + "k"}, {"/a/el/", "/a/"}, {"x", "x/"}, {"/a/\xff", "/a/\xff/\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		p := normalizePrefix(prefix)
		if !strings.HasSuffix(p, "/") || normalizePrefix(p) != p {
			t.Fatalf("normalizePrefix(%q) = %q", prefix, p)
		}
		if got, want := overlapsPrefix(key, "", p), strings.HasPrefix(key, p); got != want {
			t.Fatalf("single key %q vs %q: %v, want %v", key, p, got, want)
		}
		// A prefix range over key overlaps p iff one prefix contains the other.
		got := overlapsPrefix(key, clientv3.GetPrefixRangeEnd(key), p)
		want := strings.HasPrefix(key, p) || strings.HasPrefix(p, key)
		if !allFF(key) && got != want {
			t.Fatalf("prefix range %q vs %q: %v, want %v", key, p, got, want)
		}
	})
}

// allFF reports whether every byte of s is 0xff (including s == ""): such
// keys have no prefix range end (etcd reads "from key on").
func allFF(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != 0xff {
			return false
		}
	}
	return true
}
