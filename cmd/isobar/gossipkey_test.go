package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/regional/gossip"
)

// With mTLS on, gossip without a key is refused before anything starts,
// and the message says how to make a key. (Before, --gossip-key-file was
// optional with mTLS: gossip ran unencrypted and open.)
func TestGossipWithMTLSNeedsKey(t *testing.T) {
	tls := []string{"--tls-cert", "absent.pem", "--tls-key", "absent-key.pem", "--tls-ca", "absent-ca.pem"}
	for _, args := range [][]string{
		append([]string{"regional", "--region", "r1", "--listen", "127.0.0.1:1", "--metrics-listen", "-", "--gossip-listen", "127.0.0.1:0"}, tls...),
		append([]string{"global", "--name", "g1", "--listen", "127.0.0.1:1", "--etcd-endpoints", "127.0.0.1:1", "--gossip-listen", "127.0.0.1:0"}, tls...),
	} {
		t.Run(args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			out := stderr.String()
			if code != 2 || !strings.Contains(out, "--gossip-key-file is required with mTLS") || !strings.Contains(out, "head -c 32 /dev/urandom > gossip.key") {
				t.Fatalf("exit %d, stderr %q; want 2 asking for --gossip-key-file and saying how to make one", code, out)
			}
		})
	}
}

// A raw key file is used byte for byte: a key whose last byte is a newline
// (or a space) is not trimmed into a 31-byte key that memberlist refuses.
func TestGossipKeyFileRawBytes(t *testing.T) {
	dir := t.TempDir()
	key := append(bytes.Repeat([]byte{0x5a}, 31), '\n')
	path := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(path, key, 0o600); err != nil {
		t.Fatal(err)
	}
	node, err := startGossip(t.Context(), gossip.Config{Role: gossip.RoleRegional, Region: "r1"}, "127.0.0.1:0", nil, path, gossipTLS{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("a 32-byte raw key ending in a newline byte: %v", err)
	}
	node.Stop()
	if err := os.WriteFile(path, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = startGossip(t.Context(), gossip.Config{Role: gossip.RoleRegional, Region: "r1"}, "127.0.0.1:0", nil, path, gossipTLS{}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--gossip-key-file") || !strings.Contains(err.Error(), "head -c 32") {
		t.Fatalf("a 6-byte key file: %v; want an error naming the flag and how to make a key", err)
	}
}

// With mTLS and a key, a regional member starts with its identity bound:
// a certificate of another region is refused at start.
func TestGossipStartsWithIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.IssueTo(dir, certs.Identity{Kind: certs.KindRegion, Name: "r1"}.Leaf(nil, []net.IP{net.IPv4(127, 0, 0, 1)}), false)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsf := gossipTLS{cert, key, filepath.Join(dir, "ca.pem")}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	node, err := startGossip(ctx, gossip.Config{Role: gossip.RoleRegional, Region: "r1"}, "127.0.0.1:0", nil, keyFile, tlsf, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("regional r1 with its certificate: %v", err)
	}
	node.Stop()
	if _, err := startGossip(ctx, gossip.Config{Role: gossip.RoleRegional, Region: "r2"}, "127.0.0.1:0", nil, keyFile, tlsf, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.Contains(err.Error(), "--role regional --region r2") {
		t.Fatalf("regional r2 with r1's certificate: %v; want a refusal saying which certificate to issue", err)
	}
}
