package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Flag names as every isobar component spells them; errors name the flag
// with the file so the operator knows which to fix.
const (
	flagCert = "--tls-cert"
	flagKey  = "--tls-key"
	flagCA   = "--tls-ca"
)

// ServerConfig loads a server's mTLS configuration: TLS 1.3 only, the key
// pair from certFile/keyFile, and client certificates required and
// verified against the CA bundle in caFile.
//
// At load it checks, with errors naming the flag and file: every file is
// given and readable, the certificate parses and matches the key, it is
// valid now (ErrExpired) and it chains to caFile for server use
// (ErrUntrusted; issue it with --server).
//
// Rotation: the key pair is re-read when either file changes (size,
// modification time or identity, checked at each handshake); a pair that
// fails the load checks is ignored and the last good one stays in use, so
// replacing the files (isobar certs issue --force, or a Kubernetes Secret
// update) takes effect on the next connection without a restart. The CA
// bundle is read once: to rotate the CA, append the new CA to every
// bundle and restart, then reissue the leaves, then drop the old CA.
func ServerConfig(certFile, keyFile, caFile string, opts ...Option) (*tls.Config, error) {
	o := buildOptions(opts)
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	kp, err := newKeyPair(certFile, keyFile, pool, x509.ExtKeyUsageServerAuth, o)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get(), nil
		},
		VerifyConnection: o.verifyPeer(),
		Time:             o.clock.Now,
	}, nil
}

// ClientConfig loads a client's mTLS configuration: TLS 1.3 only, the key
// pair from certFile/keyFile presented to the server, and the server
// verified against caFile. serverName is the name checked in the server's
// certificate; empty means the host of the address dialled (gRPC fills it
// in; a plain tls.Dial needs it set). Load checks and rotation are as for
// ServerConfig, with the certificate checked for client use (--client).
func ClientConfig(certFile, keyFile, caFile, serverName string, opts ...Option) (*tls.Config, error) {
	o := buildOptions(opts)
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	kp, err := newKeyPair(certFile, keyFile, pool, x509.ExtKeyUsageClientAuth, o)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get(), nil
		},
		VerifyConnection: o.verifyPeer(),
		Time:             o.clock.Now,
	}, nil
}

// verifyPeer is the tls.Config.VerifyConnection of WithPeer (nil without).
func (o options) verifyPeer() func(tls.ConnectionState) error {
	if o.peer == nil {
		return nil
	}
	check := o.peer
	return func(cs tls.ConnectionState) error {
		id, err := VerifiedIdentity(cs)
		if err != nil {
			return err
		}
		if err := check(id); err != nil {
			return fmt.Errorf("certs: peer %s refused: %w", id, err)
		}
		return nil
	}
}

// loadPool reads a CA bundle of one or more PEM certificates.
func loadPool(caFile string) (*x509.CertPool, error) {
	if caFile == "" {
		return nil, fmt.Errorf("%w: %s is required (the CA bundle, e.g. ca.pem from isobar certs init)", ErrInvalid, flagCA)
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", flagCA, err)
	}
	cas, err := ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagCA, caFile, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		if !c.IsCA {
			return nil, fmt.Errorf("%w: %s %s holds %q, which is not a CA certificate", ErrInvalid, flagCA, caFile, c.Subject.CommonName)
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// keyPair is a certificate and key loaded from files and re-read when the
// files change. It is safe for concurrent use.
type keyPair struct {
	certFile, keyFile string
	pool              *x509.CertPool
	usage             x509.ExtKeyUsage
	clock             func() time.Time

	mu       sync.Mutex
	cur      *tls.Certificate
	certStat os.FileInfo
	keyStat  os.FileInfo
}

func newKeyPair(certFile, keyFile string, pool *x509.CertPool, usage x509.ExtKeyUsage, o options) (*keyPair, error) {
	switch {
	case certFile == "":
		return nil, fmt.Errorf("%w: %s is required", ErrInvalid, flagCert)
	case keyFile == "":
		return nil, fmt.Errorf("%w: %s is required", ErrInvalid, flagKey)
	}
	kp := &keyPair{certFile: certFile, keyFile: keyFile, pool: pool, usage: usage, clock: o.clock.Now}
	cs, ks, err := kp.stat()
	if err != nil {
		return nil, err
	}
	cert, err := kp.load()
	if err != nil {
		return nil, err
	}
	kp.cur, kp.certStat, kp.keyStat = cert, cs, ks
	return kp, nil
}

// get returns the current pair, re-reading the files first when they
// changed since the last successful load.
func (k *keyPair) get() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	cs, ks, err := k.stat()
	if err != nil || (sameFile(cs, k.certStat) && sameFile(ks, k.keyStat)) {
		return k.cur
	}
	if cert, err := k.load(); err == nil {
		k.cur, k.certStat, k.keyStat = cert, cs, ks
	}
	return k.cur
}

func (k *keyPair) stat() (os.FileInfo, os.FileInfo, error) {
	cs, err := os.Stat(k.certFile)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s: %w", flagCert, err)
	}
	ks, err := os.Stat(k.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s: %w", flagKey, err)
	}
	return cs, ks, nil
}

// load reads and checks the pair.
func (k *keyPair) load() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(k.certFile)
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", flagCert, err)
	}
	keyPEM, err := os.ReadFile(k.keyFile)
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", flagKey, err)
	}
	chain, err := ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagCert, k.certFile, err)
	}
	if _, err := parseKey(keyPEM); err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagKey, k.keyFile, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s and %s %s: %v", ErrBadKey, flagCert, k.certFile, flagKey, k.keyFile, err)
	}
	leaf := chain[0]
	now := k.clock()
	if err := checkValidity(leaf, now); err != nil {
		return nil, fmt.Errorf("%s %s (reissue it with isobar certs issue --force): %w", flagCert, k.certFile, err)
	}
	pair.Leaf = leaf
	if k.pool == nil {
		return &pair, nil // ClientCertificate: another PKI's server checks the chain
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: k.pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{k.usage},
	}); err != nil {
		role := "server"
		if k.usage == x509.ExtKeyUsageClientAuth {
			role = "client"
		}
		return nil, fmt.Errorf("%w: %s %s for %s use: %v", ErrUntrusted, flagCert, k.certFile, role, unwrapAll(err))
	}
	return &pair, nil
}

func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// unwrapAll renders x509 verification errors without their type prefix
// noise; it keeps the message.
func unwrapAll(err error) error {
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return errors.New("signed by an authority not in the CA bundle")
	}
	return err
}

// ClientCertificate returns a tls.Config.GetClientCertificate that
// presents the key pair in certFile/keyFile and re-reads the files when
// they change, with the rotation rules of ServerConfig (checked at each
// handshake; a pair that fails to load is ignored and the last good one
// stays). It is for clients of another PKI (etcd's): the pair must match
// and be valid now, but its chain is left to the server to check. Errors
// at load name the files.
func ClientCertificate(certFile, keyFile string, opts ...Option) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	kp, err := newKeyPair(certFile, keyFile, nil, x509.ExtKeyUsageClientAuth, buildOptions(opts))
	if err != nil {
		return nil, err
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get(), nil }, nil
}
