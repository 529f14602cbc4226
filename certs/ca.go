package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
)

// Defaults.
const (
	// DefaultCATTL is a CA's validity when CAConfig.TTL is zero: one year.
	DefaultCATTL = 365 * 24 * time.Hour
	// DefaultLeafTTL is a leaf's validity when Leaf.TTL is zero: 90 days,
	// cut to the CA's own expiry.
	DefaultLeafTTL = 90 * 24 * time.Hour
	// DefaultCACommonName is a CA's subject CN when CAConfig.CommonName is
	// empty.
	DefaultCACommonName = "isobar development CA"
	// backdate is subtracted from NotBefore so that peers whose clocks lag
	// a little accept a fresh certificate.
	backdate = time.Minute
	// maxCommonName is X.509's upper bound on a common name.
	maxCommonName = 64
)

// File names inside a CA directory.
const (
	CACertFile = "ca.pem"     // the CA certificate (0644); the trust bundle every process loads with --tls-ca
	CAKeyFile  = "ca-key.pem" // the CA private key (0600); only isobar certs issue reads it
)

// Option configures NewCA, LoadCA, ServerConfig and ClientConfig.
type Option func(*options)

type options struct {
	clock clockwork.Clock
	peer  func(Identity) error
}

// WithClock sets the clock used for validity periods and certificate
// verification. Default: the real clock.
func WithClock(c clockwork.Clock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithPeer makes the handshakes of a ServerConfig or ClientConfig check the
// peer's identity: after the chain is verified, check is called with the
// peer's VerifiedIdentity, and an error from it (or a peer certificate
// naming no isobar identity, ErrNotIdentity) fails the handshake. A
// client that must reach only a certain kind of server (a gateway its own
// region's controller) uses it so that no other certificate from the same
// CA can pose as that server.
func WithPeer(check func(Identity) error) Option {
	return func(o *options) { o.peer = check }
}

func buildOptions(opts []Option) options {
	o := options{clock: clockwork.NewRealClock()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// CAConfig configures a new CA.
type CAConfig struct {
	// CommonName is the CA certificate's subject CN, at most 64 bytes.
	// Default DefaultCACommonName.
	CommonName string
	// TTL is how long the CA stays valid. Default DefaultCATTL (one year);
	// at least one hour.
	TTL time.Duration
}

func (c CAConfig) withDefaults() CAConfig {
	if c.CommonName == "" {
		c.CommonName = DefaultCACommonName
	}
	if c.TTL == 0 {
		c.TTL = DefaultCATTL
	}
	return c
}

func (c CAConfig) validate() error {
	if len(c.CommonName) > maxCommonName {
		return fmt.Errorf("%w: CA common name is %d bytes: want at most %d", ErrInvalid, len(c.CommonName), maxCommonName)
	}
	if c.TTL < time.Hour {
		return fmt.Errorf("%w: CA TTL %v: want at least 1h (default one year)", ErrInvalid, c.TTL)
	}
	return nil
}

// CA is a development certificate authority: an ECDSA P-256 self-signed
// root that signs leaf certificates directly. It is safe for concurrent
// use; it holds no mutable state.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	clock   clockwork.Clock
}

// NewCA creates a CA with a fresh ECDSA P-256 key, valid from now (minus
// a minute for clock skew) for cfg.TTL.
func NewCA(cfg CAConfig, opts ...Option) (*CA, error) {
	o := buildOptions(opts)
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := o.clock.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cfg.CommonName, Organization: []string{"isobar"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(cfg.TTL),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("certs: sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA certificate: %w", err)
	}
	return &CA{cert: cert, certPEM: encodeCert(der), key: key, clock: o.clock}, nil
}

// LoadCA reads ca.pem and ca-key.pem from dir. The key file must not be
// readable by group or others (ErrInsecureKey), must match the
// certificate (ErrBadKey), and the CA must be valid now (ErrExpired).
func LoadCA(dir string, opts ...Option) (*CA, error) {
	o := buildOptions(opts)
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA certificate (create one with isobar certs init --dir %s): %w", dir, err)
	}
	certs, err := ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	cert := certs[0]
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrInvalid, certPath)
	}
	fi, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v: run chmod 600 %s", ErrInsecureKey, keyPath, fi.Mode().Perm(), keyPath)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA key: %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s does not match %s", ErrBadKey, keyPath, certPath)
	}
	if err := checkValidity(cert, o.clock.Now()); err != nil {
		return nil, fmt.Errorf("CA %s (create a new one with isobar certs init --force): %w", certPath, err)
	}
	return &CA{cert: cert, certPEM: encodeCert(cert.Raw), key: key, clock: o.clock}, nil
}

// Certificate returns the CA certificate. Do not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM returns the CA certificate in PEM: the trust bundle (--tls-ca).
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Pool returns a new pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// WriteDir writes ca.pem (0644) and ca-key.pem (0600) into dir, creating
// dir (0700) when missing. Unless overwrite is set it refuses, before
// writing anything, when either file exists (ErrExists). Overwriting
// replaces each file atomically.
func (ca *CA) WriteDir(dir string, overwrite bool) error {
	keyPEM, err := encodeKey(ca.key)
	if err != nil {
		return err
	}
	return writePair(dir, filepath.Join(dir, CACertFile), ca.certPEM, filepath.Join(dir, CAKeyFile), keyPEM, overwrite)
}

// Leaf is a request for a leaf certificate.
type Leaf struct {
	// Name is the subject common name: 1-64 bytes of [A-Za-z0-9._-].
	// Required.
	Name string
	// URIs are URI SANs (absolute URIs, e.g. CellURI(id)).
	URIs []string
	// DNS are DNS SANs. A server certificate needs a DNS or IP SAN for
	// every name peers dial it by.
	DNS []string
	// IPs are IP SANs.
	IPs []net.IP
	// Server and Client select the extended key usages; at least one.
	Server, Client bool
	// TTL is the validity. Default DefaultLeafTTL, cut to the CA's expiry;
	// an explicit TTL beyond the CA's expiry is refused.
	TTL time.Duration
}

func (l Leaf) validate() error {
	if err := checkName(l.Name); err != nil {
		return fmt.Errorf("leaf name: %w", err)
	}
	if len(l.Name) > maxCommonName {
		return fmt.Errorf("%w: leaf name %q is longer than %d bytes", ErrInvalid, l.Name, maxCommonName)
	}
	if !l.Server && !l.Client {
		return fmt.Errorf("%w: leaf %s: want server use, client use or both", ErrInvalid, l.Name)
	}
	if l.TTL < 0 {
		return fmt.Errorf("%w: leaf %s TTL %v is negative", ErrInvalid, l.Name, l.TTL)
	}
	if l.TTL != 0 && l.TTL < time.Minute {
		return fmt.Errorf("%w: leaf %s TTL %v: want at least 1m", ErrInvalid, l.Name, l.TTL)
	}
	for _, d := range l.DNS {
		if err := checkDNS(d); err != nil {
			return err
		}
	}
	for _, ip := range l.IPs {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return fmt.Errorf("%w: leaf %s: IP SAN %v is not an IPv4 or IPv6 address", ErrInvalid, l.Name, ip)
		}
	}
	if l.Server && len(l.DNS) == 0 && len(l.IPs) == 0 {
		return fmt.Errorf("%w: server certificate %s needs a DNS or IP SAN for each address clients dial", ErrInvalid, l.Name)
	}
	_, err := parseURIs(l.URIs)
	return err
}

// Issued is a signed leaf certificate and its private key.
type Issued struct {
	// Cert is the parsed certificate.
	Cert *x509.Certificate
	// CertPEM is the certificate in PEM (one CERTIFICATE block).
	CertPEM []byte
	// KeyPEM is the ECDSA P-256 private key in PKCS#8 PEM.
	KeyPEM []byte
}

// TLSCertificate returns the pair as a tls.Certificate.
func (i Issued) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(i.CertPEM, i.KeyPEM)
}

// Issue signs a leaf certificate for l with a fresh ECDSA P-256 key.
func (ca *CA) Issue(l Leaf) (Issued, error) {
	if err := l.validate(); err != nil {
		return Issued{}, err
	}
	now := ca.clock.Now()
	if err := checkValidity(ca.cert, now); err != nil {
		return Issued{}, fmt.Errorf("CA: %w", err)
	}
	notAfter := now.Add(l.TTL)
	switch {
	case l.TTL == 0:
		notAfter = now.Add(DefaultLeafTTL)
		if notAfter.After(ca.cert.NotAfter) {
			notAfter = ca.cert.NotAfter
		}
	case notAfter.After(ca.cert.NotAfter):
		return Issued{}, fmt.Errorf("%w: leaf %s TTL %v outlives the CA, which expires %s: shorten the TTL or create a new CA",
			ErrInvalid, l.Name, l.TTL, ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	uris, _ := parseURIs(l.URIs) // validated above
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, fmt.Errorf("certs: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return Issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: l.Name, Organization: []string{"isobar"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		URIs:                  uris,
		DNSNames:              append([]string(nil), l.DNS...),
		IPAddresses:           append([]net.IP(nil), l.IPs...),
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return Issued{}, fmt.Errorf("certs: sign %s: %w", l.Name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Issued{}, fmt.Errorf("certs: parse %s: %w", l.Name, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{Cert: cert, CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// IssueTo issues l and writes it into dir as <l.Name>.pem and
// <l.Name>-key.pem (see WriteLeaf): the --tls-cert and --tls-key files of
// one process.
func (ca *CA) IssueTo(dir string, l Leaf, overwrite bool) (certPath, keyPath string, err error) {
	is, err := ca.Issue(l)
	if err != nil {
		return "", "", err
	}
	return WriteLeaf(dir, l.Name, is, overwrite)
}

// LeafPaths returns where WriteLeaf puts name's files: dir/<name>.pem and
// dir/<name>-key.pem.
func LeafPaths(dir, name string) (certPath, keyPath string) {
	return filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
}

// WriteLeaf writes is as dir/<name>.pem (0644) and dir/<name>-key.pem
// (0600), creating dir (0700) when missing. Unless overwrite is set it
// refuses, before writing anything, when either file exists (ErrExists).
// Overwriting replaces each file atomically (rename), key first, so a
// process reloading the pair never reads a torn file. name "ca" is
// refused: it would collide with the CA's files.
func WriteLeaf(dir, name string, is Issued, overwrite bool) (certPath, keyPath string, err error) {
	if err := checkName(name); err != nil {
		return "", "", fmt.Errorf("file name: %w", err)
	}
	if name == "ca" {
		return "", "", fmt.Errorf("%w: name %q collides with the CA files", ErrInvalid, name)
	}
	certPath, keyPath = LeafPaths(dir, name)
	if err := writePair(dir, certPath, is.CertPEM, keyPath, is.KeyPEM, overwrite); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writePair writes a certificate and its key; see WriteLeaf.
func writePair(dir, certPath string, certPEM []byte, keyPath string, keyPEM []byte, overwrite bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certs: create directory: %w", err)
	}
	if !overwrite {
		for _, p := range []string{certPath, keyPath} {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%w: %s (pass --force to replace it)", ErrExists, p)
			} else if !os.IsNotExist(err) {
				return fmt.Errorf("certs: %w", err)
			}
		}
	}
	if err := writeFile(keyPath, keyPEM, 0o600, overwrite); err != nil {
		return err
	}
	return writeFile(certPath, certPEM, 0o644, overwrite)
}

// writeFile writes data with exactly perm. Without overwrite it creates the
// file exclusively; with overwrite it writes a temporary file in the same
// directory and renames it over path.
func writeFile(path string, data []byte, perm os.FileMode, overwrite bool) error {
	if !overwrite {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if os.IsExist(err) {
			return fmt.Errorf("%w: %s (pass --force to replace it)", ErrExists, path)
		}
		if err != nil {
			return fmt.Errorf("certs: %w", err)
		}
		return finish(f, data, perm, "")
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return finish(f, data, perm, path)
}

// finish writes, syncs and closes f, sets perm (the umask may have
// narrowed it) and, when renameTo is set, renames f over it.
func finish(f *os.File, data []byte, perm os.FileMode, renameTo string) error {
	name := f.Name()
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && renameTo != "" {
		err = os.Rename(name, renameTo)
	}
	if err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("certs: write %s: %w", name, err)
	}
	return nil
}

// ParseCertificates returns every certificate in data: PEM CERTIFICATE
// blocks (other blocks are skipped), or DER when data holds no PEM at all.
// No certificate, or one that does not parse, wraps ErrNoCertificate.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest, sawPEM := data, false
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		sawPEM = true
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate %d: %v", ErrNoCertificate, len(out)+1, err)
		}
		out = append(out, c)
	}
	if !sawPEM && len(data) > 0 {
		cs, err := x509.ParseCertificates(data)
		if err != nil {
			return nil, fmt.Errorf("%w: neither PEM nor DER: %v", ErrNoCertificate, err)
		}
		out = cs
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no CERTIFICATE block", ErrNoCertificate)
	}
	return out, nil
}

// parseKey reads the first private key block of a PEM file (PKCS#8, SEC 1
// EC or PKCS#1 RSA).
func parseKey(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("%w: no PRIVATE KEY block", ErrBadKey)
		}
		var (
			k   any
			err error
		)
		switch b.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrBadKey, b.Type, err)
		}
		switch k := k.(type) {
		case *ecdsa.PrivateKey:
			return k, nil
		case *rsa.PrivateKey:
			return k, nil
		case ed25519.PrivateKey:
			return k, nil
		default:
			return nil, fmt.Errorf("%w: unsupported key type %T", ErrBadKey, k)
		}
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("certs: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil // never 0
}

// checkValidity reports ErrExpired when now is outside cert's validity.
func checkValidity(cert *x509.Certificate, now time.Time) error {
	switch {
	case now.Before(cert.NotBefore):
		return fmt.Errorf("%w: %q is not valid before %s", ErrExpired, cert.Subject.CommonName, cert.NotBefore.UTC().Format(time.RFC3339))
	case now.After(cert.NotAfter):
		return fmt.Errorf("%w: %q expired %s", ErrExpired, cert.Subject.CommonName, cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkDNS accepts a DNS name of labels [A-Za-z0-9-] (and '_'), with an
// optional leading "*." wildcard.
func checkDNS(d string) error {
	name := strings.TrimPrefix(d, "*.")
	if name == "" || len(d) > 253 {
		return fmt.Errorf("%w: DNS SAN %q: want a host name of at most 253 bytes", ErrInvalid, trunc(d))
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%w: DNS SAN %q: bad label %q", ErrInvalid, trunc(d), trunc(label))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
				return fmt.Errorf("%w: DNS SAN %q: bad character %q", ErrInvalid, trunc(d), c)
			}
		}
	}
	return nil
}

// parseURIs parses URI SANs: absolute, with a scheme, no spaces.
func parseURIs(in []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(in))
	for _, s := range in {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "" || (u.Host == "" && u.Opaque == "") || strings.ContainsAny(s, " \t\r\n") {
			return nil, fmt.Errorf("%w: URI SAN %q: want an absolute URI such as %s", ErrInvalid, trunc(s), CellURI("<region>", "<id>"))
		}
		if u.Scheme == "spiffe" && u.Host == TrustDomain {
			if _, err := ParseIdentity(s); err != nil {
				return nil, fmt.Errorf("URI SAN: %w", err)
			}
		}
		out = append(out, u)
	}
	return out, nil
}
