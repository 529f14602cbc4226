package gossip

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Wire formats. Everything a peer sends us is outside input: each decoder
// bounds every length before it allocates, never panics, and says what was
// wrong. The fuzz tests in fuzz_test.go hold them to that.
//
// Node meta (memberlist's per-node metadata, at most 512 bytes):
//
//	version(1)=1 | uvarint len + role | uvarint len + region |
//	uvarint len + ingress | 32-byte ed25519 public key | (later versions append)
//
// Summary envelope (a user message, also an entry of the push-pull state):
//
//	kind(1)=kindSummary | uvarint len + sender node name | 32-byte public key |
//	uvarint len + RegionSummary protobuf | 64-byte ed25519 signature
//
// or, from a member with an Identity (identity.go), kind(1)=kindSummaryProof
// with uvarint len + identity proof between the summary and the signature.
//
// The signature covers signDomain followed by every byte before it, so an
// envelope cannot be replayed as anything else and a relay cannot alter it.
//
// Push-pull state:
//
//	kind(1)=kindState | uvarint count | count × (uvarint len + envelope)

const (
	kindSummary      byte = 0x01
	kindState        byte = 0x02
	kindSummaryProof byte = 0x03

	metaVersion byte = 1

	// maxNameBytes bounds a node name in an envelope and in Config.
	maxNameBytes = 256
	// maxRegionBytes bounds a region name (Config, meta and summaries).
	maxRegionBytes = 128
	// maxRoleBytes bounds the role string in meta.
	maxRoleBytes = 16
	// maxIngressBytes bounds the advertised ingress address.
	maxIngressBytes = 256
	// maxStateEntries bounds the number of envelopes in one push-pull state.
	maxStateEntries = 4096

	pubKeyLen = ed25519.PublicKeySize
	sigLen    = ed25519.SignatureSize

	// envelopeOverhead is the largest number of bytes an envelope adds to
	// its summary: kind, two uvarint lengths, the longest name, the key and
	// the signature.
	envelopeOverhead = 1 + binary.MaxVarintLen64*3 + maxNameBytes + pubKeyLen + sigLen + maxProofBytes
)

// signDomain separates isobar summary signatures from any other use of the
// same key.
var signDomain = []byte("isobar/gossip/summary/v1\x00")

// errWire is the class of every decoding error; wrapped errors say which
// field was wrong.
var errWire = errors.New("gossip: malformed message")

func wireErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errWire, fmt.Sprintf(format, args...))
}

// nodeMeta is what a member advertises about itself.
type nodeMeta struct {
	Role    string
	Region  string
	Ingress string
	PubKey  ed25519.PublicKey
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func encodeMeta(m nodeMeta) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(m.Role)+len(m.Region)+len(m.Ingress)+pubKeyLen)
	b = append(b, metaVersion)
	b = appendString(b, m.Role)
	b = appendString(b, m.Region)
	b = appendString(b, m.Ingress)
	return append(b, m.PubKey...)
}

// reader is a bounds-checked cursor over outside bytes.
type reader struct {
	b   []byte
	off int
}

func (r *reader) byte(field string) (byte, error) {
	if r.off >= len(r.b) {
		return 0, wireErr("%s: truncated", field)
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) uvarint(field string) (uint64, error) {
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		return 0, wireErr("%s: bad length", field)
	}
	r.off += n
	return v, nil
}

// bytes returns the next n bytes (a subslice, not a copy).
func (r *reader) bytes(field string, n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.off) {
		return nil, wireErr("%s: %d bytes announced, %d left", field, n, len(r.b)-r.off)
	}
	out := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return out, nil
}

// lenPrefixed reads a uvarint length no larger than limit and that many bytes.
func (r *reader) lenPrefixed(field string, limit int) ([]byte, error) {
	n, err := r.uvarint(field)
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, wireErr("%s: %d bytes, limit %d", field, n, limit)
	}
	return r.bytes(field, n)
}

// text reads a length-prefixed UTF-8 string without control characters.
func (r *reader) text(field string, limit int) (string, error) {
	b, err := r.lenPrefixed(field, limit)
	if err != nil {
		return "", err
	}
	if err := checkText(b); err != nil {
		return "", wireErr("%s: %v", field, err)
	}
	return string(b), nil
}

// checkText accepts UTF-8 without control characters: such strings end up in
// logs and metric labels.
func checkText(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("not UTF-8")
	}
	for _, c := range string(b) {
		if c < 0x20 || c == 0x7f {
			return errors.New("control character")
		}
	}
	return nil
}

// decodeMeta parses a member's advertised metadata. Bytes after the version-1
// fields are ignored so that later versions can append fields.
func decodeMeta(b []byte) (nodeMeta, error) {
	r := &reader{b: b}
	v, err := r.byte("meta version")
	if err != nil {
		return nodeMeta{}, err
	}
	if v < metaVersion {
		return nodeMeta{}, wireErr("meta version %d unknown", v)
	}
	var m nodeMeta
	if m.Role, err = r.text("meta role", maxRoleBytes); err != nil {
		return nodeMeta{}, err
	}
	if m.Region, err = r.text("meta region", maxRegionBytes); err != nil {
		return nodeMeta{}, err
	}
	if m.Ingress, err = r.text("meta ingress", maxIngressBytes); err != nil {
		return nodeMeta{}, err
	}
	key, err := r.bytes("meta public key", pubKeyLen)
	if err != nil {
		return nodeMeta{}, err
	}
	m.PubKey = ed25519.PublicKey(append([]byte(nil), key...))
	switch m.Role {
	case RoleRegional:
		if m.Region == "" {
			return nodeMeta{}, wireErr("meta: regional member without a region")
		}
	case RoleGlobal:
	default:
		return nodeMeta{}, wireErr("meta role %q unknown", m.Role)
	}
	return m, nil
}

// envelope is a decoded summary envelope. Its byte fields alias the buffer it
// was decoded from.
type envelope struct {
	Sender  string
	PubKey  ed25519.PublicKey
	Summary []byte
	// Proof is the sender's identity proof (kindSummaryProof), or nil.
	Proof  []byte
	signed []byte // everything the signature covers, after signDomain
	sig    []byte
}

// sealEnvelope builds a signed envelope for summary bytes without a proof.
func sealEnvelope(sender string, priv ed25519.PrivateKey, summary []byte) []byte {
	return sealProof(sender, priv.Public().(ed25519.PublicKey), priv, summary, nil)
}

// seal builds an envelope without a proof naming pub and signed by signer
// (which a correct envelope has match pub; tests forge ones that do not).
func seal(sender string, pub ed25519.PublicKey, signer ed25519.PrivateKey, summary []byte) []byte {
	return sealProof(sender, pub, signer, summary, nil)
}

// sealProof builds an envelope carrying proof when it is not nil (kind
// kindSummaryProof), else a plain one.
func sealProof(sender string, pub ed25519.PublicKey, signer ed25519.PrivateKey, summary, proof []byte) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(sender)+pubKeyLen+len(summary)+len(proof)+sigLen)
	if proof != nil {
		b = append(b, kindSummaryProof)
	} else {
		b = append(b, kindSummary)
	}
	b = appendString(b, sender)
	b = append(b, pub...)
	b = binary.AppendUvarint(b, uint64(len(summary)))
	b = append(b, summary...)
	if proof != nil {
		b = binary.AppendUvarint(b, uint64(len(proof)))
		b = append(b, proof...)
	}
	return append(b, ed25519.Sign(signer, signedBytes(b))...)
}

func signedBytes(body []byte) []byte {
	msg := make([]byte, 0, len(signDomain)+len(body))
	msg = append(msg, signDomain...)
	return append(msg, body...)
}

// errOversized is returned by decodeEnvelope when the summary (or the whole
// envelope) is larger than allowed.
var errOversized = errors.New("gossip: summary too large")

// decodeEnvelope parses an envelope whose summary may be at most maxSummary
// bytes. It does not verify the signature (see envelope.verify).
func decodeEnvelope(b []byte, maxSummary int) (envelope, error) {
	if len(b) > maxSummary+envelopeOverhead {
		return envelope{}, fmt.Errorf("%w: envelope of %d bytes", errOversized, len(b))
	}
	r := &reader{b: b}
	k, err := r.byte("kind")
	if err != nil {
		return envelope{}, err
	}
	if k != kindSummary && k != kindSummaryProof {
		return envelope{}, wireErr("kind 0x%02x is not a summary", k)
	}
	var e envelope
	if e.Sender, err = r.text("sender", maxNameBytes); err != nil {
		return envelope{}, err
	}
	if e.Sender == "" {
		return envelope{}, wireErr("sender: empty")
	}
	key, err := r.bytes("public key", pubKeyLen)
	if err != nil {
		return envelope{}, err
	}
	e.PubKey = ed25519.PublicKey(key)
	n, err := r.uvarint("summary")
	if err != nil {
		return envelope{}, err
	}
	if n > uint64(maxSummary) {
		return envelope{}, fmt.Errorf("%w: %d bytes, limit %d", errOversized, n, maxSummary)
	}
	if e.Summary, err = r.bytes("summary", n); err != nil {
		return envelope{}, err
	}
	if k == kindSummaryProof {
		if e.Proof, err = r.lenPrefixed("proof", maxProofBytes); err != nil {
			return envelope{}, err
		}
		if len(e.Proof) == 0 {
			return envelope{}, wireErr("proof: empty")
		}
	}
	e.signed = b[:r.off]
	if e.sig, err = r.bytes("signature", sigLen); err != nil {
		return envelope{}, err
	}
	if r.off != len(b) {
		return envelope{}, wireErr("%d trailing bytes", len(b)-r.off)
	}
	return e, nil
}

// verify checks the envelope's signature against key.
func (e envelope) verify(key ed25519.PublicKey) bool {
	return len(key) == pubKeyLen && ed25519.Verify(key, signedBytes(e.signed), e.sig)
}

// encodeState builds a push-pull state from envelopes.
func encodeState(envs [][]byte) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, e := range envs {
		size += binary.MaxVarintLen64 + len(e)
	}
	b := make([]byte, 0, size)
	b = append(b, kindState)
	b = binary.AppendUvarint(b, uint64(len(envs)))
	for _, e := range envs {
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return b
}

// decodeState splits a push-pull state into its envelopes (subslices of b).
// An entry longer than maxEntry is returned as is, so that the caller counts
// it as oversized like any other oversized envelope; it does not make the
// whole state unreadable.
func decodeState(b []byte) ([][]byte, error) {
	r := &reader{b: b}
	k, err := r.byte("kind")
	if err != nil {
		return nil, err
	}
	if k != kindState {
		return nil, wireErr("kind 0x%02x is not a state", k)
	}
	n, err := r.uvarint("count")
	if err != nil {
		return nil, err
	}
	if n > maxStateEntries {
		return nil, wireErr("count %d, limit %d", n, maxStateEntries)
	}
	envs := make([][]byte, 0, min(n, uint64(len(b))))
	for i := uint64(0); i < n; i++ {
		e, err := r.lenPrefixed("entry", len(b))
		if err != nil {
			return envs, err
		}
		envs = append(envs, e)
	}
	if r.off != len(b) {
		return envs, wireErr("%d trailing bytes", len(b)-r.off)
	}
	return envs, nil
}
