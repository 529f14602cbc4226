package interop

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// writePKI writes a CA and one leaf certificate for 127.0.0.1, usable as
// etcd's server certificate and as its clients'.
func writePKI(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	now := time.Now() // certificate validity is wall time
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "interop ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "isobar"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(leafKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string][]byte{
		ca:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

// TestGlobalPairExternalEtcd34: the real `isobar global` pair on a real
// etcd 3.4 server with client TLS and auth. One member leads; SIGSTOP of
// the leader (its lease lapses while it cannot act) makes the other lead
// at a higher plan epoch; SIGCONT brings the old leader back as a follower
// — never two leaders once it has caught up — and the new leader keeps
// publishing plans. The failover time is logged.
func TestGlobalPairExternalEtcd34(t *testing.T) {
	suite(t)
	bin := need(t, "etcd", "Debian etcd-server 3.4")
	if v, _ := exec.Command(bin, "--version").Output(); !strings.Contains(string(v), "etcd Version: 3.4.") {
		t.Skipf("INTEROP-SKIP: %s is not etcd 3.4", bin)
	}
	dir := t.TempDir()
	ca, cert, key := writePKI(t, dir)
	client, peer := freeAddr(t), freeAddr(t)
	start(t, "etcd", nil, nil, bin, "--name", "interop", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "https://"+client, "--advertise-client-urls", "https://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "interop=http://"+peer, "--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca,
		"--client-cert-auth", "--unsafe-no-fsync")
	waitDial(t, client)

	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(caPEM)
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + client}, DialTimeout: 5 * time.Second,
		TLS: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "isobar", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "isobar", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enable auth on etcd 3.4: %v", err)
		}
	}
	pw := filepath.Join(dir, "etcd-password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type member struct {
		name, http string
		p          *proc
	}
	var members []*member
	for _, name := range []string{"g1", "g2"} {
		m := &member{name: name, http: freeAddr(t)}
		m.p = start(t, name, nil, nil, isobarBin, "global", "--name", name, "--listen", freeAddr(t), "--metrics-listen", m.http,
			"--insecure", "--lease-ttl", "2s", "--cycle-interval", "250ms",
			"--etcd-endpoints", "https://"+client, "--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", key,
			"--etcd-username", "isobar", "--etcd-password-file", pw)
		members = append(members, m)
	}
	gauge := func(m *member, metric string) float64 {
		body, err := httpGet("http://" + m.http + "/metrics")
		if err != nil {
			return -1
		}
		var v float64
		for _, x := range samples(body, metric) {
			v += x
		}
		return v
	}
	var leader, follower *member
	poll(t, "one leader on etcd 3.4", 60*time.Second, func() (bool, string) {
		l := []float64{gauge(members[0], "isobar_global_leader"), gauge(members[1], "isobar_global_leader")}
		switch {
		case l[0] == 1 && l[1] == 0:
			leader, follower = members[0], members[1]
		case l[0] == 0 && l[1] == 1:
			leader, follower = members[1], members[0]
		default:
			return false, fmt.Sprint(l)
		}
		return gauge(leader, "isobar_global_plan_sequence") > 0, "no plan yet"
	})
	epoch := gauge(leader, "isobar_global_plan_epoch")
	t.Logf("%s leads at epoch %v", leader.name, epoch)

	if err := leader.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	poll(t, follower.name+" takes over", 60*time.Second, func() (bool, string) {
		return gauge(follower, "isobar_global_leader") == 1 && gauge(follower, "isobar_global_plan_epoch") > epoch,
			fmt.Sprint(gauge(follower, "isobar_global_leader"), gauge(follower, "isobar_global_plan_epoch"))
	})
	t.Logf("FIGURE global pair on etcd 3.4 (TLS, auth): %s leads %v after %s was SIGSTOPped (lease TTL 2s)", follower.name, time.Since(stopped), leader.name)
	if err := leader.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	poll(t, leader.name+" steps down after SIGCONT", 60*time.Second, func() (bool, string) {
		return gauge(leader, "isobar_global_leader") == 0, fmt.Sprint(gauge(leader, "isobar_global_leader"))
	})
	seq := gauge(follower, "isobar_global_plan_sequence")
	poll(t, "the new leader keeps publishing", 30*time.Second, func() (bool, string) {
		return gauge(follower, "isobar_global_plan_sequence") > seq && gauge(follower, "isobar_global_leader") == 1, ""
	})
}
