package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/regional"
)

// TestStatusOperatorOverTLS: a controller run with TLS serves its debug
// pages over HTTPS to operators only (issue 22 item 8); isobar status keeps
// working with --tls-cert/--tls-key/--tls-ca (an operator certificate), and
// says what to present without one.
func TestStatusOperatorOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	issue := func(id certs.Identity, ips ...net.IP) (string, string) {
		c, k, err := ca.IssueTo(dir, id.Leaf(nil, ips), false)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	srvCert, srvKey := issue(certs.Identity{Kind: certs.KindRegion, Name: "r1"}, net.ParseIP("127.0.0.1"))
	opCert, opKey := issue(certs.Identity{Kind: certs.KindOperator, Name: "alice"})
	caFile := filepath.Join(dir, certs.CACertFile)

	cfg := regional.DefaultConfig("r1")
	cfg.Listen, cfg.HTTPListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLS = regional.TLSFiles{Cert: srvCert, Key: srvKey, CA: caFile}
	c, err := regional.New(cfg, regional.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "-c", c.HTTPAddr(), "--tls-cert", opCert, "--tls-key", opKey, "--tls-ca", caFile); err != nil {
		t.Fatalf("status with an operator certificate: %v\n%s", err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "== controller "+c.HTTPAddr()+": 0 cells") {
		t.Fatalf("status output:\n%s", got)
	}
	var anon statusBuffer
	err = runStatus(t, context.Background(), nil, &anon, "-c", c.HTTPAddr(), "--tls-ca", caFile)
	if err == nil || !strings.Contains(anon.String(), "HTTP 401") || !strings.Contains(anon.String(), "operator client certificate") {
		t.Fatalf("status without an operator certificate: %v\n%s", err, anon.String())
	}
}
