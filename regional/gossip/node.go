package gossip

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"
	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Errors returned by Node; check with errors.Is.
var (
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("gossip: already started")
	// ErrStopped: Start after Stop.
	ErrStopped = errors.New("gossip: stopped")
	// ErrNotRegional: SetLocalSummary on a global node.
	ErrNotRegional = errors.New("gossip: only a regional node publishes a summary")
	// ErrWrongRegion: SetLocalSummary with another region's summary.
	ErrWrongRegion = errors.New("gossip: summary is not for this node's region")
	// ErrStaleSummary: SetLocalSummary with a summary that is not newer than
	// the previous one (same incarnation and a sequence not above it, or
	// another incarnation with an earlier time).
	ErrStaleSummary = errors.New("gossip: summary not newer than the previous one")
	// ErrSummaryTooLarge: SetLocalSummary with a summary whose encoding
	// exceeds Config.MaxSummaryBytes (peers would refuse it).
	ErrSummaryTooLarge = errors.New("gossip: summary too large")
)

// udpHeadroom is what a gossip packet keeps for memberlist's own messages,
// the compound header, the label and encryption; an envelope larger than
// UDPBufferSize minus this goes to each member over TCP instead.
const udpHeadroom = 400

// directSendLimit bounds concurrent TCP sends of the local summary.
const directSendLimit = 4

type lifecycle int

const (
	lifeNew lifecycle = iota
	lifeStarted
	lifeStopped
)

// Node is one member of the gossip cluster. Create it with New, then Start;
// Stop when done. All methods are safe for concurrent use.
type Node struct {
	cfg   Config
	mc    *memberlist.Config
	log   *slog.Logger
	clock clockwork.Clock
	m     *metrics
	book  *book
	priv  ed25519.PrivateKey
	meta  []byte
	queue *memberlist.TransmitLimitedQueue
	fan   *fanout
	// udpMax is the largest envelope broadcast by UDP gossip.
	udpMax int
	// wrap wraps memberlist's transport (Deps.WrapTransport), or nil.
	wrap func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport

	localMu sync.Mutex                  // serialises SetLocalSummary
	local   atomic.Pointer[heldSummary] // what this node publishes
	// vivaldi is this node's network coordinate (coordinate.go); safe for
	// concurrent use.
	vivaldi *coordinate.Client
	// coordSamples counts the probes that moved vivaldi.
	coordSamples atomic.Int64
	// id is Deps.Identity (nil: no proofs); proof caches this node's
	// identity proof per leaf certificate (guarded by localMu).
	id    *Identity
	proof *localProof

	ml atomic.Pointer[memberlist.Memberlist]

	lifeMu sync.Mutex // held for all of Start and Stop
	life   lifecycle
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New validates cfg and builds a Node. It opens no socket; Start does.
func New(cfg Config, deps Deps) (*Node, error) {
	cfg = cfg.withDefaults(rand.Reader)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Identity != nil {
		if err := deps.Identity.validate(cfg.Role); err != nil {
			return nil, err
		}
		if len(cfg.SecretKey) == 0 {
			return nil, fieldErr("SecretKey", "required with an Identity (mTLS): without it anyone who reaches the gossip port joins the cluster; make one with head -c 32 /dev/urandom > gossip.key")
		}
		if cfg.Role == RoleRegional {
			if err := checkOwnIdentity(deps.Identity, cfg.Region); err != nil {
				return nil, err
			}
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("gossip: generate signing key: %w", err)
	}
	meta := encodeMeta(nodeMeta{Role: cfg.Role, Region: cfg.Region, Ingress: cfg.IngressAddress, PubKey: pub})
	if len(meta) > memberlist.MetaMaxSize {
		// Unreachable with the Config limits; kept as a guard.
		return nil, fmt.Errorf("gossip: node meta of %d bytes exceeds %d", len(meta), memberlist.MetaMaxSize)
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	log := deps.Logger.With("node", cfg.NodeName)
	deps.Logger = log
	n := &Node{
		cfg:     cfg,
		mc:      cfg.memberlistConfig(),
		log:     log,
		clock:   deps.Clock,
		m:       m,
		book:    newBook(cfg, deps, m),
		vivaldi: newVivaldi(),
		priv:    priv,
		meta:    meta,
		fan:     newFanout(),
		wrap:    deps.WrapTransport,
		id:      deps.Identity,
	}
	n.udpMax = n.mc.UDPBufferSize - udpHeadroom
	n.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(n.book.othersAlive.Load()) + 1 },
		RetransmitMult: n.mc.RetransmitMult,
	}
	d := &delegate{n: n}
	n.mc.Delegate = d
	n.mc.Events = d
	n.mc.Ping = d
	n.mc.Alive = d
	n.mc.Logger = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(newBookCollector(n.book)); err != nil {
			return nil, fmt.Errorf("gossip: register metrics: %w", err)
		}
	}
	return n, nil
}

// Name is this node's member name.
func (n *Node) Name() string { return n.cfg.NodeName }

// Start opens memberlist's sockets and starts the background join (when
// Config.Join is set) and the direct-send loop. ctx bounds those loops;
// Stop is still required to leave the cluster and close the sockets.
func (n *Node) Start(ctx context.Context) error {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	switch n.life {
	case lifeStarted:
		return ErrStarted
	case lifeStopped:
		return ErrStopped
	}
	if n.wrap != nil {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{n.mc.BindAddr}, BindPort: n.mc.BindPort, Logger: n.mc.Logger,
		})
		if err != nil {
			return fmt.Errorf("gossip: start transport on %s:%d: %w", n.cfg.BindAddr, n.cfg.BindPort, err)
		}
		if n.mc.BindPort == 0 {
			n.mc.BindPort = nt.GetAutoBindPort()
			if n.mc.AdvertisePort == 0 {
				n.mc.AdvertisePort = n.mc.BindPort
			}
		}
		n.mc.Transport = n.wrap(nt)
	}
	ml, err := memberlist.Create(n.mc)
	if err != nil {
		return fmt.Errorf("gossip: start memberlist on %s:%d: %w", n.cfg.BindAddr, n.cfg.BindPort, err)
	}
	n.ml.Store(ml)
	n.life = lifeStarted
	ctx, n.cancel = context.WithCancel(ctx)
	if len(n.cfg.Join) > 0 {
		n.wg.Go(func() { n.joinLoop(ctx, ml) })
	}
	n.wg.Go(func() { n.sendLoop(ctx, ml) })
	n.log.Info("gossip node started", "addr", n.Addr(), "role", n.cfg.Role, "region", n.cfg.Region,
		"profile", n.cfg.Profile, "encrypted", len(n.cfg.SecretKey) > 0)
	return nil
}

// Stop leaves the cluster (waiting at most Config.LeaveTimeout for the leave
// message to go out), closes the sockets and waits for every goroutine of
// the node. It is idempotent; a Node cannot be restarted.
func (n *Node) Stop() { n.stop(true) }

// stop with leave=false shuts down without a leave message: to the others
// the node has crashed (tests use it).
func (n *Node) stop(leave bool) {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.life != lifeStarted {
		n.life = lifeStopped
		return
	}
	n.life = lifeStopped
	n.cancel()
	// In-flight joins and sends end within memberlist's TCPTimeout.
	n.wg.Wait()
	ml := n.ml.Load()
	if leave {
		if err := ml.Leave(n.cfg.LeaveTimeout); err != nil {
			n.log.Debug("gossip leave not confirmed", "err", err)
		}
	}
	if err := ml.Shutdown(); err != nil {
		n.log.Warn("gossip shutdown failed", "err", err)
	}
	n.log.Info("gossip node stopped", "left", leave)
}

// Addr is the host:port other members can join, or "" before Start.
func (n *Node) Addr() string {
	ml := n.ml.Load()
	if ml == nil {
		return ""
	}
	ln := ml.LocalNode()
	return net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port)))
}

// SetLocalSummary publishes this region's summary: it is signed, gossiped to
// the members and handed to every member that joins later. s must be for
// Config.Region, pass the basic checks and Deps.Validate, encode within
// Config.MaxSummaryBytes and be newer than the previous one (higher
// sequence in the same incarnation, or a later time in a new incarnation).
// s is not retained. It may be called before Start.
func (n *Node) SetLocalSummary(s *isobarpb.RegionSummary) error {
	if n.cfg.Role != RoleRegional {
		return ErrNotRegional
	}
	if s == nil {
		return fmt.Errorf("%w: nil", ErrInvalidSummary)
	}
	if err := n.book.check(s); err != nil {
		return err
	}
	if s.GetRegion() != n.cfg.Region {
		return fmt.Errorf("%w: %q, this node speaks for %q", ErrWrongRegion, s.GetRegion(), n.cfg.Region)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrInvalidSummary, err)
	}
	if len(raw) > n.cfg.MaxSummaryBytes {
		return fmt.Errorf("%w: %d bytes, limit %d (Config.MaxSummaryBytes)", ErrSummaryTooLarge, len(raw), n.cfg.MaxSummaryBytes)
	}
	pub := n.priv.Public().(ed25519.PublicKey)
	n.localMu.Lock()
	defer n.localMu.Unlock()
	if prev := n.local.Load(); prev != nil && !newer(s, n.cfg.NodeName, pub, prev, true) {
		return fmt.Errorf("%w: incarnation %q sequence %d after incarnation %q sequence %d", ErrStaleSummary,
			s.GetIncarnation(), s.GetSequence(), prev.sum.GetIncarnation(), prev.sum.GetSequence())
	}
	var proof []byte
	if n.id != nil {
		cert, err := n.id.Certificate()
		if err != nil {
			return fmt.Errorf("%w: this node's certificate: %v", ErrBadIdentity, err)
		}
		lp, err := proofFor(n.proof, cert, n.cfg.NodeName, n.meta)
		if err != nil {
			return err
		}
		n.proof, proof = lp, lp.proof
	}
	env := sealProof(n.cfg.NodeName, pub, n.priv, raw, proof)
	n.local.Store(&heldSummary{
		sum: proto.CloneOf(s), env: env, origin: n.cfg.NodeName, key: pub, receivedAt: n.clock.Now(),
	})
	if len(env) <= n.udpMax {
		n.queue.QueueBroadcast(summaryBroadcast(env))
	} else {
		n.fan.wantAll()
	}
	return nil
}

// localEnvelope is the signed envelope of the local summary, or nil.
func (n *Node) localEnvelope() []byte {
	if l := n.local.Load(); l != nil {
		return l.env
	}
	return nil
}

// Summaries returns the latest summary of every other region this node has
// accepted, by region, copied. Regions whose members left or died keep
// their last summary with Alive false.
func (n *Node) Summaries() map[string]PeerSummary { return n.book.summaries(true) }

// RTT returns the smoothed probe round-trip time from this node to each
// other region that has an alive regional member and has been probed.
func (n *Node) RTT() map[string]time.Duration { return n.book.rtts() }

// Members lists the members this node knows, itself included, sorted by
// name. Departed members stay listed (Alive false) for Config.ForgetAfter.
func (n *Node) Members() []Member { return n.book.members() }

// Changes is signalled (coalesced, one slot) after a summary is applied or
// the membership changes. It is meant for one reader.
func (n *Node) Changes() <-chan struct{} { return n.book.changed }

// joinLoop joins the seeds whenever no other member is alive: at start, and
// again if every other member has gone (a partition healed, the cluster
// restarted). Attempts back off exponentially with jitter.
func (n *Node) joinLoop(ctx context.Context, ml *memberlist.Memberlist) {
	bo := backoff.New(backoff.Policy{Min: n.cfg.JoinBackoffMin, Max: n.cfg.JoinBackoffMax, Jitter: backoff.Equal})
	for {
		if n.book.othersAlive.Load() == 0 {
			contacted, err := ml.Join(n.cfg.Join)
			if n.book.othersAlive.Load() > 0 {
				n.m.joins.WithLabelValues("ok").Inc()
				n.log.Info("gossip joined", "contacted", contacted, "members", n.book.othersAlive.Load()+1)
				bo.Reset()
				continue
			}
			n.m.joins.WithLabelValues("failed").Inc()
			wait := bo.Next()
			n.log.Debug("gossip join failed", "seeds", n.cfg.Join, "contacted", contacted, "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return
			case <-n.clock.After(wait):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-n.book.membership:
		}
	}
}

// sendLoop sends the local summary over TCP to the members the fanout asks
// for: each member that joins (so it has our summary before the next
// broadcast), and every member when the summary is too large for UDP.
func (n *Node) sendLoop(ctx context.Context, ml *memberlist.Memberlist) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.fan.wake:
		}
		all, names := n.fan.take()
		env := n.localEnvelope()
		if env == nil {
			continue
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, directSendLimit)
		for _, to := range n.book.targets(names, all) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := ml.SendReliable(to, env); err != nil {
					n.m.directSends.WithLabelValues("failed").Inc()
					n.log.Debug("gossip direct send failed", "member", to.Name, "err", err)
					return
				}
				n.m.directSends.WithLabelValues("ok").Inc()
			})
		}
		wg.Wait()
	}
}

// fanout collects the members waiting for a direct send of the local
// summary; wake has one slot and coalesces.
type fanout struct {
	mu    sync.Mutex
	all   bool
	names map[string]struct{}
	wake  chan struct{}
}

func newFanout() *fanout {
	return &fanout{names: map[string]struct{}{}, wake: make(chan struct{}, 1)}
}

func (f *fanout) want(name string) {
	f.mu.Lock()
	f.names[name] = struct{}{}
	f.mu.Unlock()
	poke(f.wake)
}

func (f *fanout) wantAll() {
	f.mu.Lock()
	f.all = true
	f.mu.Unlock()
	poke(f.wake)
}

func (f *fanout) take() (bool, map[string]struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, names := f.all, f.names
	f.all, f.names = false, map[string]struct{}{}
	return all, names
}

// summaryBroadcast is the local summary's envelope in memberlist's broadcast
// queue; a newer one replaces it (same name).
type summaryBroadcast []byte

func (b summaryBroadcast) Invalidates(other memberlist.Broadcast) bool {
	_, ok := other.(summaryBroadcast)
	return ok
}
func (b summaryBroadcast) Name() string    { return "isobar/summary" }
func (b summaryBroadcast) Message() []byte { return b }
func (b summaryBroadcast) Finished()       {}

// delegate adapts memberlist's callbacks to the node. memberlist calls them
// from its own goroutines, some with its node lock held: none of them may
// call back into memberlist or block.
type delegate struct{ n *Node }

var (
	_ memberlist.Delegate       = (*delegate)(nil)
	_ memberlist.EventDelegate  = (*delegate)(nil)
	_ memberlist.PingDelegate   = (*delegate)(nil)
	_ memberlist.AliveDelegate  = (*delegate)(nil)
	_ memberlist.NamedBroadcast = summaryBroadcast(nil)
)

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.n.meta) > limit {
		return nil
	}
	return d.n.meta
}

func (d *delegate) NotifyMsg(buf []byte) { d.n.book.receive(buf) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.n.queue.GetBroadcasts(overhead, limit)
}

func (d *delegate) LocalState(bool) []byte { return d.n.book.localState(d.n.localEnvelope()) }

func (d *delegate) MergeRemoteState(buf []byte, _ bool) { d.n.book.receiveState(buf) }

func (d *delegate) NotifyJoin(node *memberlist.Node) {
	d.n.book.memberUp(node.Name, node.Addr, node.Port, node.Meta)
	if node.Name != d.n.cfg.NodeName {
		d.n.fan.want(node.Name)
	}
}

func (d *delegate) NotifyLeave(node *memberlist.Node) {
	d.n.book.memberDown(node.Name)
	d.n.vivaldi.ForgetNode(node.Name)
	d.n.log.Info("gossip member gone", "member", node.Name)
}

func (d *delegate) NotifyUpdate(node *memberlist.Node) {
	d.n.book.memberUp(node.Name, node.Addr, node.Port, node.Meta)
}

// AckPayload carries this node's network coordinate in every probe ack
// (coordinate.go).
func (d *delegate) AckPayload() []byte { return encodeCoordinate(d.n.vivaldi.GetCoordinate()) }

// NotifyPingComplete folds the probe's RTT into the member's region and,
// for a member whose RTT counts, its coordinate into this node's.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	if d.n.book.pingRTT(other.Name, rtt) && len(payload) > 0 {
		d.n.observeCoordinate(other.Name, rtt, payload)
	}
}

// NotifyAlive refuses members whose metadata does not decode: they could
// not speak for a region anyway, and would only confuse the counts.
func (d *delegate) NotifyAlive(peer *memberlist.Node) error {
	if _, err := decodeMeta(peer.Meta); err != nil {
		d.n.m.badMeta.Inc()
		return err
	}
	return nil
}
