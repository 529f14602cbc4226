package gossip

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/isobar-mesh/isobar/certs"
)

// Identity binds gossip to the fleet's mTLS identities (SECURITY.md). With
// it, a regional member proves which region it speaks for: it signs its
// node name and metadata (role, region, ingress and its per-process
// ed25519 summary key) with the private key of its certificate, whose
// identity must be spiffe://isobar/region/<region>, and every summary
// envelope carries that proof and the certificate chain. A receiver with
// an Identity accepts a member's summaries, counts its region alive and
// takes its RTT only once the proof verifies against Roots, names the
// region the metadata claims and is unexpired.
//
// Why: memberlist authenticates nothing beyond the shared SecretKey. Its
// alive messages carry whatever name, address and metadata the sender
// writes (hashicorp/memberlist v0.7.0 state.go aliveNode), and its one
// cluster-wide key (config.go SecretKey: "message-level encryption and
// verification") keeps non-members out without telling members apart, so
// any holder of the cluster key could claim a region. The proof makes that
// claim as strong as the region's certificate.
type Identity struct {
	// Certificate returns this node's current certificate chain and private
	// key (a tls.Config's GetCertificate, so rotation is picked up; the
	// proof is remade whenever the leaf changes). Required for a regional
	// node; a global node publishes nothing and leaves it nil.
	Certificate func() (*tls.Certificate, error)
	// Roots are the fleet's CA certificates that members' chains must
	// verify against. Required.
	Roots *x509.CertPool
}

func (id *Identity) validate(role string) error {
	switch {
	case id.Roots == nil:
		return fieldErr("Identity", "Roots is required: the CA bundle (--tls-ca) that regional certificates chain to")
	case role == RoleRegional && id.Certificate == nil:
		return fieldErr("Identity", "Certificate is required for a regional node: its spiffe://isobar/region/<region> certificate (--tls-cert)")
	}
	return nil
}

// Proof wire format (inside a summary envelope of kind kindSummaryProof):
//
//	version(1)=1 | uvarint count + count × (uvarint len + DER certificate),
//	leaf first | uvarint len + signature
//
// The signature, by the leaf's key, covers proofDomain | uvarint len + node
// name | the node's metadata bytes exactly as memberlist carries them.
const proofVersion byte = 1

const (
	maxProofCerts   = 4
	maxProofCertLen = 4096
	maxProofSigLen  = 1024
	// maxProofBytes bounds a whole proof.
	maxProofBytes = 1 + binary.MaxVarintLen64 + maxProofCerts*(binary.MaxVarintLen64+maxProofCertLen) + binary.MaxVarintLen64 + maxProofSigLen
)

var proofDomain = []byte("isobar/gossip/member/v1\x00")

// Errors of identity proofs; check with errors.Is.
var (
	// ErrNoIdentity: a summary came without an identity proof to a node
	// that requires one.
	ErrNoIdentity = errors.New("gossip: no identity proof")
	// ErrBadIdentity: the proof does not verify, has expired, or names
	// another region than the member claims.
	ErrBadIdentity = errors.New("gossip: identity proof refused")
)

func proofMessage(name string, meta []byte) []byte {
	b := make([]byte, 0, len(proofDomain)+binary.MaxVarintLen64+len(name)+len(meta))
	b = append(b, proofDomain...)
	b = appendString(b, name)
	return append(b, meta...)
}

// hashFor is the digest a key type signs with: ECDSA and RSA (PKCS #1
// v1.5) sign a SHA-256 digest, ed25519 the message itself. The pairs are
// those crypto/x509's CheckSignature verifies as ECDSAWithSHA256,
// SHA256WithRSA and PureEd25519.
func hashFor(pub crypto.PublicKey) (crypto.Hash, x509.SignatureAlgorithm, error) {
	switch pub.(type) {
	case *ecdsa.PublicKey:
		return crypto.SHA256, x509.ECDSAWithSHA256, nil
	case *rsa.PublicKey:
		return crypto.SHA256, x509.SHA256WithRSA, nil
	case ed25519.PublicKey:
		return 0, x509.PureEd25519, nil
	default:
		return 0, 0, fmt.Errorf("%w: key type %T unsupported (use ECDSA, RSA or ed25519)", ErrBadIdentity, pub)
	}
}

// makeProof signs name and meta with the certificate's key.
func makeProof(cert *tls.Certificate, name string, meta []byte) ([]byte, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrBadIdentity)
	}
	if len(cert.Certificate) > maxProofCerts {
		return nil, fmt.Errorf("%w: chain of %d certificates, at most %d", ErrBadIdentity, len(cert.Certificate), maxProofCerts)
	}
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: private key %T cannot sign", ErrBadIdentity, cert.PrivateKey)
	}
	h, _, err := hashFor(signer.Public())
	if err != nil {
		return nil, err
	}
	msg := proofMessage(name, meta)
	digest := msg
	if h != 0 {
		sum := sha256.Sum256(msg)
		digest = sum[:]
	}
	sig, err := signer.Sign(rand.Reader, digest, h)
	if err != nil {
		return nil, fmt.Errorf("%w: sign: %v", ErrBadIdentity, err)
	}
	b := []byte{proofVersion}
	b = binary.AppendUvarint(b, uint64(len(cert.Certificate)))
	for _, der := range cert.Certificate {
		if len(der) > maxProofCertLen {
			return nil, fmt.Errorf("%w: certificate of %d bytes, at most %d", ErrBadIdentity, len(der), maxProofCertLen)
		}
		b = binary.AppendUvarint(b, uint64(len(der)))
		b = append(b, der...)
	}
	b = binary.AppendUvarint(b, uint64(len(sig)))
	return append(b, sig...), nil
}

// proof is a decoded identity proof; its slices alias the input.
type proof struct {
	chain [][]byte
	sig   []byte
}

func decodeProof(b []byte) (proof, error) {
	if len(b) > maxProofBytes {
		return proof{}, wireErr("proof of %d bytes, limit %d", len(b), maxProofBytes)
	}
	r := &reader{b: b}
	v, err := r.byte("proof version")
	if err != nil {
		return proof{}, err
	}
	if v != proofVersion {
		return proof{}, wireErr("proof version %d unknown", v)
	}
	n, err := r.uvarint("proof certificates")
	if err != nil {
		return proof{}, err
	}
	if n == 0 || n > maxProofCerts {
		return proof{}, wireErr("proof with %d certificates, want 1..%d", n, maxProofCerts)
	}
	var p proof
	for i := uint64(0); i < n; i++ {
		der, err := r.lenPrefixed("proof certificate", maxProofCertLen)
		if err != nil {
			return proof{}, err
		}
		p.chain = append(p.chain, der)
	}
	if p.sig, err = r.lenPrefixed("proof signature", maxProofSigLen); err != nil {
		return proof{}, err
	}
	if r.off != len(b) {
		return proof{}, wireErr("proof: %d trailing bytes", len(b)-r.off)
	}
	return p, nil
}

// verifyProof checks that raw proves that the holder of a region identity
// issued by roots published name with meta, at now. It returns the region
// and when the proof stops being valid (the chain's earliest NotAfter).
func verifyProof(raw []byte, name string, meta []byte, roots *x509.CertPool, now time.Time) (string, time.Time, error) {
	p, err := decodeProof(raw)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %w", ErrBadIdentity, err)
	}
	chain := make([]*x509.Certificate, 0, len(p.chain))
	for _, der := range p.chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("%w: certificate does not parse: %v", ErrBadIdentity, err)
		}
		chain = append(chain, c)
	}
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return "", time.Time{}, fmt.Errorf("%w: certificate %q does not verify against the CA bundle: %v", ErrBadIdentity, leaf.Subject.CommonName, err)
	}
	id, err := certs.PeerIdentity(leaf)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %w", ErrBadIdentity, err)
	}
	if id.Kind != certs.KindRegion {
		return "", time.Time{}, fmt.Errorf("%w: certificate identity %s is not a region (spiffe://isobar/region/<region>)", ErrBadIdentity, id)
	}
	_, algo, err := hashFor(leaf.PublicKey)
	if err != nil {
		return "", time.Time{}, err
	}
	if err := leaf.CheckSignature(algo, proofMessage(name, meta), p.sig); err != nil {
		return "", time.Time{}, fmt.Errorf("%w: signature over the member's name and metadata: %v", ErrBadIdentity, err)
	}
	until := leaf.NotAfter
	for _, c := range chain[1:] {
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	return id.Name, until, nil
}

// localProof caches the proof of this node's metadata per leaf certificate.
type localProof struct {
	leaf  []byte
	proof []byte
}

// proofFor returns the proof for cert, reusing cached when the leaf is the same.
func proofFor(cached *localProof, cert *tls.Certificate, name string, meta []byte) (*localProof, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrBadIdentity)
	}
	if cached != nil && bytes.Equal(cached.leaf, cert.Certificate[0]) {
		return cached, nil
	}
	p, err := makeProof(cert, name, meta)
	if err != nil {
		return nil, err
	}
	return &localProof{leaf: cert.Certificate[0], proof: p}, nil
}

// checkOwnIdentity refuses a regional node whose certificate does not name
// its region: its peers would refuse every summary it sends.
func checkOwnIdentity(id *Identity, region string) error {
	cert, err := id.Certificate()
	if err != nil {
		return fmt.Errorf("%w: this node's certificate: %v", ErrBadIdentity, err)
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return fmt.Errorf("%w: this node has no certificate", ErrBadIdentity)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("%w: this node's certificate: %v", ErrBadIdentity, err)
	}
	got, err := certs.PeerIdentity(leaf)
	if err != nil {
		return fmt.Errorf("%w: this node's certificate: %w", ErrBadIdentity, err)
	}
	if want := (certs.Identity{Kind: certs.KindRegion, Name: region}); got != want {
		return fmt.Errorf("%w: this node's certificate is %s, peers accept region %s's summaries only from %s (isobar certs issue --role regional --region %s)",
			ErrBadIdentity, got, region, want, region)
	}
	return nil
}
