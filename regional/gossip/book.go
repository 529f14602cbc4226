package gossip

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// ErrInvalidSummary is the class of summaries that fail the basic checks or
// Deps.Validate; check with errors.Is.
var ErrInvalidSummary = errors.New("gossip: invalid summary")

// Member is one member of the gossip cluster as this node sees it.
type Member struct {
	Name string
	// Role and Region come from the member's metadata; Role is empty when
	// the metadata does not decode (such a member speaks for no region).
	Role, Region string
	// Verified is true when the member's region is proven by its
	// certificate (a node with Deps.Identity; see identity.go). Without
	// an Identity every regional member with valid metadata counts as
	// verified. This node itself counts as verified (New checked its
	// certificate).
	Verified bool
	// Addr is the member's gossip address (host:port).
	Addr string
	// Ingress is the member's advertised ingress address.
	Ingress string
	// Alive is false once the member left (Stop) or was declared dead.
	// memberlist does not tell the two apart to its event delegate.
	Alive bool
	// Since is when Alive last changed, on this node's clock.
	Since time.Time
}

// PeerSummary is the latest summary held for a region.
type PeerSummary struct {
	// Summary is a copy; the caller may keep and modify it.
	Summary *isobarpb.RegionSummary
	// ReceivedAt is when this node accepted it (Deps.Clock). Callers judge
	// its age.
	ReceivedAt time.Time
	// Alive is true while a regional member of that region is alive.
	Alive bool
}

type memberRec struct {
	name    string
	ip      net.IP
	port    uint16
	addr    string
	meta    nodeMeta
	rawMeta []byte
	metaOK  bool
	// proven is the identity proof that verified for rawMeta (nil: none
	// yet); reset when the metadata changes.
	proven *provenID
	alive  bool
	since  time.Time
	// retired are the member's previous public keys (earlier processes
	// under the same name), newest last, at most maxRetiredKeys.
	retired []ed25519.PublicKey
}

// maxRetiredKeys bounds the previous keys remembered per member.
const maxRetiredKeys = 4

// provenID is a verified identity proof of a member's metadata.
type provenID struct {
	hash  [sha256.Size]byte // of the proof bytes
	until time.Time         // the chain's earliest NotAfter
}

type heldSummary struct {
	sum        *isobarpb.RegionSummary
	env        []byte // the envelope as received, relayed in push-pull
	origin     string
	key        ed25519.PublicKey
	receivedAt time.Time
}

// book is the node's view of the cluster: members, the latest summary per
// region and the smoothed RTT per region. memberlist calls into it from
// several goroutines (event, ping and message delegates); one mutex guards
// everything, held only for map work, never across signature checks,
// Validate, logging or any call into memberlist.
type book struct {
	self       string
	selfRegion string
	maxBytes   int
	alpha      float64
	forget     time.Duration
	validate   func(*isobarpb.RegionSummary) error
	skew       time.Duration
	// roots, when set (Deps.Identity), makes identity proofs mandatory.
	roots *x509.CertPool
	clock clockwork.Clock
	log   *slog.Logger
	m     *metrics

	// changed is poked (never blocking) after a summary is applied or the
	// membership changes; membership only after membership changes.
	changed    chan struct{}
	membership chan struct{}
	// othersAlive counts alive members other than this node.
	othersAlive atomic.Int64
	// observe, when set (tests, before Start), sees every verdict with the
	// bytes it was about.
	observe func(v verdict, raw []byte)

	mu   sync.Mutex
	mems map[string]*memberRec
	held map[string]*heldSummary // by region
	rtt  map[string]float64      // seconds, by region
}

func newBook(cfg Config, deps Deps, m *metrics) *book {
	var roots *x509.CertPool
	if deps.Identity != nil {
		roots = deps.Identity.Roots
	}
	return &book{
		skew:       cfg.MaxClockSkew,
		roots:      roots,
		self:       cfg.NodeName,
		selfRegion: cfg.Region,
		maxBytes:   cfg.MaxSummaryBytes,
		alpha:      cfg.RTTSmoothing,
		forget:     cfg.ForgetAfter,
		validate:   deps.Validate,
		clock:      deps.Clock,
		log:        deps.Logger,
		m:          m,
		changed:    make(chan struct{}, 1),
		membership: make(chan struct{}, 1),
		mems:       map[string]*memberRec{},
		held:       map[string]*heldSummary{},
		rtt:        map[string]float64{},
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// basicCheck is what every summary must satisfy, whatever Deps.Validate says.
func basicCheck(s *isobarpb.RegionSummary) error {
	switch {
	case s.GetRegion() == "":
		return fmt.Errorf("%w: region empty", ErrInvalidSummary)
	case len(s.GetRegion()) > maxRegionBytes:
		return fmt.Errorf("%w: region of %d bytes, at most %d", ErrInvalidSummary, len(s.GetRegion()), maxRegionBytes)
	case checkText([]byte(s.GetRegion())) != nil:
		return fmt.Errorf("%w: region not printable UTF-8", ErrInvalidSummary)
	case s.GetSequence() == 0:
		return fmt.Errorf("%w: sequence 0", ErrInvalidSummary)
	case s.GetAt() == nil || s.GetAt().CheckValid() != nil:
		return fmt.Errorf("%w: time missing or invalid", ErrInvalidSummary)
	}
	return nil
}

// check runs the basic checks, then Deps.Validate.
func (b *book) check(s *isobarpb.RegionSummary) error {
	if err := basicCheck(s); err != nil {
		return err
	}
	if b.validate != nil {
		if err := b.validate(s); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidSummary, err)
		}
	}
	return nil
}

// newer reports whether s, from member sender signing with key, should
// replace h. originAlive says whether h's origin is still alive.
//
//   - Same member, same key (same process): in one incarnation the sequence
//     must rise; across incarnations the time must.
//   - Same member, another key: the member restarted, and its current key
//     (the only one that verifies) speaks for the region now.
//   - Another member of the region: if h's origin is gone it takes over,
//     otherwise the later time wins (two live publishers for one region is
//     a misconfiguration; this keeps it from flapping).
func newer(s *isobarpb.RegionSummary, sender string, key ed25519.PublicKey, h *heldSummary, originAlive bool) bool {
	switch {
	case h == nil:
		return true
	case sender != h.origin:
		return !originAlive || s.GetAt().AsTime().After(h.sum.GetAt().AsTime())
	case !bytes.Equal(key, h.key):
		return true
	case s.GetIncarnation() == h.sum.GetIncarnation():
		return s.GetSequence() > h.sum.GetSequence()
	default:
		return s.GetAt().AsTime().After(h.sum.GetAt().AsTime())
	}
}

// verdict is the fate of one received envelope: "applied", a refusal reason
// or an ignore reason.
type verdict string

const applied verdict = "applied"

// receive runs one envelope from a peer through the checks and applies it if
// it passes. raw is not retained (it is copied when applied).
func (b *book) receive(raw []byte) verdict {
	b.m.received.Inc()
	v, attrs, err := b.judge(raw)
	switch {
	case v == applied:
		b.m.applied.Inc()
		poke(b.changed)
	case slices.Contains(refusalReasons, string(v)):
		b.m.refused.WithLabelValues(string(v)).Inc()
		b.log.Debug("gossip summary refused", append(attrs, "reason", string(v), "err", err)...)
	default:
		b.m.ignored.WithLabelValues(string(v)).Inc()
	}
	if b.observe != nil {
		b.observe(v, raw)
	}
	return v
}

func (b *book) judge(raw []byte) (verdict, []any, error) {
	env, sum, attrs, v, err := b.decode(raw)
	if v != "" {
		return v, attrs, err
	}
	region := sum.GetRegion()
	sender, attrs, v, err := b.checkSender(env, raw, region, attrs)
	if v != "" {
		return v, attrs, err
	}
	proven, attrs, v, err := b.authenticate(env, sender, region, attrs)
	if v != "" {
		return v, attrs, err
	}
	if b.validate != nil {
		if err := b.validate(sum); err != nil {
			return refusedInvalid, attrs, err
		}
	}
	return b.store(env, raw, sum, sender, proven), attrs, nil
}

// decode opens the envelope and its summary and runs the checks that
// need no member state. A non-empty verdict ends the judgement.
func (b *book) decode(raw []byte) (*envelope, *isobarpb.RegionSummary, []any, verdict, error) {
	env, err := decodeEnvelope(raw, b.maxBytes)
	if errors.Is(err, errOversized) {
		return nil, nil, []any{"bytes", len(raw)}, refusedOversized, err
	}
	if err != nil {
		return nil, nil, []any{"bytes", len(raw)}, refusedUndecodable, err
	}
	attrs := []any{"sender", env.Sender}
	if env.Sender == b.self {
		return nil, nil, attrs, ignoredOwn, nil
	}
	sum := &isobarpb.RegionSummary{}
	if err := proto.Unmarshal(env.Summary, sum); err != nil {
		return nil, nil, attrs, refusedUndecodable, err
	}
	if err := basicCheck(sum); err != nil {
		return nil, nil, attrs, refusedInvalid, err
	}
	attrs = append(attrs, "region", sum.GetRegion(), "sequence", sum.GetSequence())
	// A time from the future (beyond the skew allowance, on this node's
	// clock) is refused: it would win every later-time comparison and
	// mask the region's real summaries.
	if at, now := sum.GetAt().AsTime(), b.clock.Now(); at.Sub(now) > b.skew {
		return nil, nil, attrs, refusedFuture, fmt.Errorf("summary time %v is %v ahead of this node's clock, more than the %v allowed (Config.MaxClockSkew)",
			at, at.Sub(now).Round(time.Millisecond), b.skew)
	}
	return &env, sum, attrs, "", nil
}

// senderFacts is what the judgement takes from the sender's member record
// (read under b.mu).
type senderFacts struct {
	key       ed25519.PublicKey
	rawMeta   []byte
	needProof bool
}

// checkSender checks the envelope against its sender's member record. A
// non-empty verdict ends the judgement.
func (b *book) checkSender(env *envelope, raw []byte, region string, attrs []any) (senderFacts, []any, verdict, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec := b.mems[env.Sender]
	h := b.held[region]
	switch {
	case rec == nil:
		return senderFacts{}, attrs, refusedUnknownSender, nil
	case !rec.metaOK || rec.meta.Role != RoleRegional:
		return senderFacts{}, attrs, refusedNotRegional, nil
	case rec.meta.Region != region:
		return senderFacts{}, append(attrs, "sender_region", rec.meta.Region), refusedRegionMismatch, nil
	case h != nil && bytes.Equal(h.env, raw):
		return senderFacts{}, attrs, ignoredDuplicate, nil
	case !bytes.Equal(env.PubKey, rec.meta.PubKey):
		if slices.ContainsFunc(rec.retired, func(k ed25519.PublicKey) bool { return bytes.Equal(k, env.PubKey) }) {
			return senderFacts{}, attrs, ignoredStale, nil // relayed from an earlier process of the member
		}
		return senderFacts{}, attrs, refusedBadSignature, errors.New("signing key is not the member's")
	case b.roots != nil && env.Proof == nil:
		return senderFacts{}, attrs, refusedNoIdentity,
			fmt.Errorf("%w: this node requires members to prove their region with their certificate (Deps.Identity); the sender runs without one", ErrNoIdentity)
	}
	return senderFacts{
		key: rec.meta.PubKey, rawMeta: rec.rawMeta,
		needProof: b.roots != nil && !rec.proven.covers(env.Proof, b.clock.Now()),
	}, attrs, "", nil
}

// authenticate verifies the signature and, when needed, the sender's
// proof of region. A non-empty verdict ends the judgement.
func (b *book) authenticate(env *envelope, sf senderFacts, region string, attrs []any) (*provenID, []any, verdict, error) {
	if !env.verify(sf.key) {
		return nil, attrs, refusedBadSignature, errors.New("signature does not verify")
	}
	if !sf.needProof {
		return nil, attrs, "", nil
	}
	idRegion, until, err := verifyProof(env.Proof, env.Sender, sf.rawMeta, b.roots, b.clock.Now())
	if err != nil {
		return nil, attrs, refusedBadIdentity, err
	}
	if idRegion != region {
		return nil, append(attrs, "identity_region", idRegion), refusedBadIdentity,
			fmt.Errorf("%w: the member claims region %s but its certificate is region %s's", ErrBadIdentity, region, idRegion)
	}
	return &provenID{hash: sha256.Sum256(env.Proof), until: until}, attrs, "", nil
}

// store holds sum as its region's summary when it is newer than the one
// held, and records the sender's proof.
func (b *book) store(env *envelope, raw []byte, sum *isobarpb.RegionSummary, sf senderFacts, proven *provenID) verdict {
	now := b.clock.Now()
	region := sum.GetRegion()
	b.mu.Lock()
	defer b.mu.Unlock()
	if rec := b.mems[env.Sender]; proven != nil && rec != nil && bytes.Equal(rec.rawMeta, sf.rawMeta) {
		rec.proven = proven
	}
	h := b.held[region]
	originAlive := false
	if h != nil {
		rec := b.mems[h.origin]
		originAlive = rec != nil && rec.alive
	}
	if !newer(sum, env.Sender, sf.key, h, originAlive) {
		return ignoredStale
	}
	b.held[region] = &heldSummary{
		sum:        sum,
		env:        bytes.Clone(raw),
		origin:     env.Sender,
		key:        sf.key,
		receivedAt: now,
	}
	return applied
}

// covers reports whether p is a still-valid verification of proof.
func (p *provenID) covers(proof []byte, now time.Time) bool {
	return p != nil && p.hash == sha256.Sum256(proof) && now.Before(p.until)
}

// verifiedLocked reports whether rec speaks for its meta region: always
// without an Identity, else only with a valid proof.
func (b *book) verifiedLocked(rec *memberRec, now time.Time) bool {
	if !rec.metaOK || rec.meta.Role != RoleRegional {
		return false
	}
	return b.roots == nil || (rec.proven != nil && now.Before(rec.proven.until))
}

// receiveState applies every envelope of a peer's push-pull state.
func (b *book) receiveState(buf []byte) {
	envs, err := decodeState(buf)
	for _, e := range envs {
		b.receive(e)
	}
	if err != nil {
		b.m.received.Inc()
		b.m.refused.WithLabelValues(refusedUndecodable).Inc()
		b.log.Debug("gossip state refused", "reason", refusedUndecodable, "err", err, "bytes", len(buf))
	}
}

// localState returns the push-pull state to send: own (our envelope, may be
// nil) and every held summary whose origin is alive. Summaries of dead
// members are not relayed: a receiver that never knew the member could not
// check their signature.
func (b *book) localState(own []byte) []byte {
	b.mu.Lock()
	envs := make([][]byte, 0, len(b.held)+1)
	if own != nil {
		envs = append(envs, own)
	}
	for _, h := range b.held {
		if rec := b.mems[h.origin]; rec != nil && rec.alive {
			envs = append(envs, h.env)
		}
	}
	b.mu.Unlock()
	return encodeState(envs)
}

// memberUp records a member that joined, or whose metadata changed. ip and
// rawMeta are copied.
func (b *book) memberUp(name string, ip net.IP, port uint16, rawMeta []byte) {
	meta, err := decodeMeta(rawMeta)
	ip = slices.Clone(ip)
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
	now := b.clock.Now()
	b.mu.Lock()
	rec := b.mems[name]
	if rec == nil {
		rec = &memberRec{name: name}
		b.mems[name] = rec
	}
	rec.ip, rec.port, rec.addr = ip, port, addr
	if !bytes.Equal(rec.rawMeta, rawMeta) {
		rec.rawMeta, rec.proven = slices.Clone(rawMeta), nil
	}
	if old := rec.meta.PubKey; err == nil && len(old) > 0 && !bytes.Equal(old, meta.PubKey) {
		rec.retired = append(rec.retired, old)
		if len(rec.retired) > maxRetiredKeys {
			rec.retired = rec.retired[1:]
		}
	}
	rec.meta, rec.metaOK = meta, err == nil
	if !rec.alive {
		rec.alive, rec.since = true, now
	}
	b.afterMembershipLocked(now)
	b.mu.Unlock()
	if err != nil {
		b.log.Debug("gossip member meta invalid", "member", name, "err", err)
	}
	poke(b.membership)
	poke(b.changed)
}

// memberDown records a member that left or was declared dead.
func (b *book) memberDown(name string) {
	now := b.clock.Now()
	b.mu.Lock()
	if rec := b.mems[name]; rec != nil && rec.alive {
		rec.alive, rec.since = false, now
	}
	b.afterMembershipLocked(now)
	b.mu.Unlock()
	poke(b.membership)
	poke(b.changed)
}

// afterMembershipLocked forgets long-departed members and recounts.
func (b *book) afterMembershipLocked(now time.Time) {
	var others int64
	for name, rec := range b.mems {
		if !rec.alive && name != b.self && now.Sub(rec.since) > b.forget {
			delete(b.mems, name)
			continue
		}
		if rec.alive && name != b.self {
			others++
		}
	}
	b.othersAlive.Store(others)
}

// pingRTT folds one probe round-trip time to a member into its region's
// EWMA and reports whether it counted: only verified regional members of
// other regions count (their coordinates too, coordinate.go).
func (b *book) pingRTT(name string, rtt time.Duration) bool {
	if rtt <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rec := b.mems[name]
	if rec == nil || !b.verifiedLocked(rec, b.clock.Now()) || rec.meta.Region == b.selfRegion {
		return false
	}
	s := rtt.Seconds()
	if old, ok := b.rtt[rec.meta.Region]; ok {
		s = b.alpha*s + (1-b.alpha)*old
	}
	b.rtt[rec.meta.Region] = s
	return true
}

// aliveRegionsLocked is the set of regions with an alive, verified
// regional member: a member that has not proven its region (with an
// Identity) keeps no region alive.
func (b *book) aliveRegionsLocked() map[string]bool {
	out := map[string]bool{}
	now := b.clock.Now()
	for _, rec := range b.mems {
		if rec.alive && b.verifiedLocked(rec, now) {
			out[rec.meta.Region] = true
		}
	}
	return out
}

func (b *book) members() []Member {
	b.mu.Lock()
	now := b.clock.Now()
	out := make([]Member, 0, len(b.mems))
	for _, rec := range b.mems {
		out = append(out, Member{
			Name: rec.name, Role: rec.meta.Role, Region: rec.meta.Region, Verified: rec.name == b.self || b.verifiedLocked(rec, now),
			Addr: rec.addr, Ingress: rec.meta.Ingress, Alive: rec.alive, Since: rec.since,
		})
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y Member) int {
		if x.Name < y.Name {
			return -1
		}
		if x.Name > y.Name {
			return 1
		}
		return 0
	})
	return out
}

// summaries returns the held summaries by region, without our own region.
// With clone false the Summary pointers are shared and must not be touched
// (the metrics collector only reads ReceivedAt).
func (b *book) summaries(clone bool) map[string]PeerSummary {
	b.mu.Lock()
	alive := b.aliveRegionsLocked()
	out := make(map[string]PeerSummary, len(b.held))
	for region, h := range b.held {
		if region == b.selfRegion {
			continue
		}
		out[region] = PeerSummary{Summary: h.sum, ReceivedAt: h.receivedAt, Alive: alive[region]}
	}
	b.mu.Unlock()
	if clone {
		for region, ps := range out {
			ps.Summary = proto.CloneOf(ps.Summary)
			out[region] = ps
		}
	}
	return out
}

// rtts returns the smoothed RTT per remote region with an alive member.
func (b *book) rtts() map[string]time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	alive := b.aliveRegionsLocked()
	out := make(map[string]time.Duration, len(b.rtt))
	for region, s := range b.rtt {
		if alive[region] {
			out[region] = time.Duration(s * float64(time.Second))
		}
	}
	return out
}

// targets returns the alive members other than this node that are named in
// names (or all of them), as fresh memberlist.Node values: memberlist's own
// Node structs must not be read outside its lock.
func (b *book) targets(names map[string]struct{}, all bool) []*memberlist.Node {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*memberlist.Node
	for name, rec := range b.mems {
		if name == b.self || !rec.alive {
			continue
		}
		if _, ok := names[name]; ok || all {
			out = append(out, &memberlist.Node{Name: name, Addr: rec.ip, Port: rec.port})
		}
	}
	return out
}
