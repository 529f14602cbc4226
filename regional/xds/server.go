package xds

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// numKinds is the number of node kinds; per-kind arrays are
// [numKinds]T indexed by kindIndex, in the order of kinds.
const numKinds = 2

// kinds lists the node kinds in snapshot order.
func kinds() [numKinds]NodeKind { return [numKinds]NodeKind{KindEnvoy, KindGRPC} }

// kindIndex is the index of k in kinds.
func kindIndex(k NodeKind) int {
	if k == KindGRPC {
		return 1
	}
	return 0
}

// Server serves the snapshots built from pushed States over ADS and the
// per-type discovery services, and tracks what every client acknowledged.
type Server struct {
	log       *slog.Logger
	clock     clockwork.Clock
	m         *metrics
	authorize func(context.Context) error
	cache     cache.SnapshotCache
	xds       serverv3.Server

	ctx    context.Context
	cancel context.CancelFunc

	pushMu    sync.Mutex // serialises Push; guards builder, last, lastSnaps and the LEDS fields
	builder   *Builder
	last      [numKinds]*Set            // per kind, the Set of the last snapshot
	lastSnaps [numKinds]*cache.Snapshot // per kind, the last snapshot

	// With Config.LEDS, delta clients are served the LEDS layout (leds.go)
	// from deltaCache and, per kind, ledsKinds' LinearCache; nil otherwise.
	deltaCache     cache.SnapshotCache
	ledsKinds      [numKinds]*ledsKind
	lastDeltaSnaps [numKinds]*cache.Snapshot

	mu       sync.Mutex // guards the fields below; callbacks take it
	stopped  bool
	seq      uint64                     // last pushed version
	versions [numKinds][numTypes]uint64 // per kind and type, the push that last changed it
	// names holds, per kind and type, the resource names of the last
	// snapshot, to recognise requests for names it does not hold.
	names [numKinds][numTypes]map[string]struct{}
	// collections holds, per kind, the LEDS collections of the last
	// snapshot (Config.LEDS), to recognise subscriptions to others.
	collections [numKinds]map[string]struct{}
	streams     map[int64]*streamState
	// deltaStreams holds open delta streams and what each was sent.
	deltaStreams map[int64]*deltaStreamState
	ackCh        chan struct{} // closed and replaced when an ACK lands; closed for good by Stop
}

// NewServer validates cfg (after applying defaults) and returns a Server with
// no snapshot yet: clients that connect before the first Push wait for it.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	deps = deps.withDefaults()
	b, err := NewBuilder(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		log:          deps.Logger,
		clock:        deps.Clock,
		authorize:    deps.Authorize,
		m:            m,
		ctx:          ctx,
		cancel:       cancel,
		builder:      b,
		streams:      make(map[int64]*streamState),
		deltaStreams: make(map[int64]*deltaStreamState),
		ackCh:        make(chan struct{}),
	}
	lib := libLogger{deps.Logger}
	// ads=false: in ADS mode the cache never answers a named request while
	// the snapshot holds other resources of that type (a grpc-go client
	// would hang). Ordering is safe without it: every snapshot is
	// consistent on its own.
	s.cache = cache.NewSnapshotCache(false, nodeHash{}, lib)
	var served cache.Cache = s.cache
	if cfg.LEDS {
		served = s.ledsMux(lib)
	}
	s.xds = serverv3.NewServer(ctx, served, callbacks{s}, sotw.WithLogger(lib))
	return s, nil
}

// ledsMux sets up the LEDS layout's caches and returns the cache the xDS
// server serves from: state-of-the-world requests go to s.cache as without
// LEDS; delta requests for LbEndpoints to their kind's ledsCache, other
// delta requests to deltaCache. The delta server fills in the stream's
// node on every request before it asks the cache (pkg/server/delta/v3
// server.go processDelta), so the kind is known.
func (s *Server) ledsMux(lib libLogger) cache.Cache {
	s.deltaCache = cache.NewSnapshotCache(false, nodeHash{}, lib)
	mux := &cache.MuxCache{
		Classify: func(*cache.Request) string { return "sotw" },
		ClassifyDelta: func(r *cache.DeltaRequest) string {
			if r.GetTypeUrl() == xdscontract.LbEndpointType {
				return "leds/" + string(ClassifyNode(r.GetNode()))
			}
			return "delta"
		},
		Caches: map[string]cache.Cache{"sotw": s.cache, "delta": s.deltaCache},
	}
	for i, k := range kinds() {
		s.ledsKinds[i] = newLEDSKind(lib)
		mux.Caches["leds/"+string(k)] = ledsCache{s.ledsKinds[i].cache}
	}
	return mux
}

// Register registers ADS and the listener, route, cluster and endpoint
// discovery services on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
}

// Push builds, validates and serves st to every node kind. It returns the
// version of the resulting snapshot, to pass to WaitForAck. A State that
// fails validation is refused with an error wrapping ErrInvalidState (or
// xdscontract.ErrInvalidResource) and the previous snapshot stays in place. A
// type's version moves only when its content changed, so a weight change
// pushes only EDS; a State equal to the previous one changes nothing and
// returns the current version.
func (s *Server) Push(st State) (string, error) {
	s.pushMu.Lock()
	defer s.pushMu.Unlock()
	if s.isStopped() {
		return "", ErrStopped
	}
	start := s.clock.Now()
	p, err := s.prepare(st)
	s.m.buildDuration.Observe(s.clock.Since(start).Seconds())
	if err != nil {
		s.m.pushErrors.Inc()
		s.log.Warn("xds push refused, previous snapshot kept", "err", err)
		return "", err
	}
	if p == nil {
		s.m.pushes.Inc()
		return s.Version(), nil
	}
	names := setNames(p.sets)
	s.mu.Lock()
	s.seq, s.versions, s.names = p.seq, p.versions, names
	if p.leds[0] != nil {
		for i := range numKinds {
			s.collections[i] = p.leds[i].collections
		}
	}
	s.mu.Unlock()
	s.last, s.lastSnaps = p.sets, p.snaps
	for i, k := range kinds() {
		if err := s.cache.SetSnapshot(s.ctx, string(k), p.snaps[i]); err != nil {
			s.m.pushErrors.Inc()
			return "", fmt.Errorf("xds: set %s snapshot: %w", k, err)
		}
	}
	if err := s.applyLEDS(p); err != nil {
		s.m.pushErrors.Inc()
		return "", err
	}
	s.m.pushes.Inc()
	version := strconv.FormatUint(p.seq, 10)
	s.log.Debug("xds snapshot pushed", "version", version, "models", len(st.Models))
	return version, nil
}

// prepared is a validated pair of snapshots not yet set.
type prepared struct {
	seq      uint64
	versions [numKinds][numTypes]uint64
	sets     [numKinds]*Set
	snaps    [numKinds]*cache.Snapshot
	// With Config.LEDS, per kind, the LEDS layout and the delta snapshot.
	leds       [numKinds]*ledsUpdate
	deltaSnaps [numKinds]*cache.Snapshot
}

// prepare builds and validates the snapshots of st. It returns nil, nil when
// st changes nothing.
func (s *Server) prepare(st State) (*prepared, error) {
	res, err := s.builder.Build(st)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	p := &prepared{seq: s.seq + 1, versions: s.versions, sets: [numKinds]*Set{&res.Envoy, &res.GRPC}}
	s.mu.Unlock()
	changed := false
	for k := range p.sets {
		for t := range numTypes {
			if s.last[k] == nil || !sameResources(s.last[k], p.sets[k], t) {
				p.versions[k][t] = p.seq
				changed = true
			}
		}
	}
	if !changed {
		return nil, nil
	}
	for i, k := range kinds() {
		prev := s.lastSnaps[i]
		p.snaps[i] = newSnapshot(p.sets[i], &p.versions[i], prev)
		if prev != nil && p.versions[i][typeListener] == s.versions[i][typeListener] && p.versions[i][typeRoute] == s.versions[i][typeRoute] &&
			p.versions[i][typeCluster] == s.versions[i][typeCluster] && sameAssignmentNames(s.last[i], p.sets[i]) {
			// Only assignment contents changed. Every check below depends
			// on listeners, routes, clusters and the assignment names alone,
			// all equal to those of the previous snapshot, which passed.
			continue
		}
		if err := checkReferences(k, p.sets[i]); err != nil {
			return nil, err
		}
		if err := p.snaps[i].Consistent(); err != nil {
			return nil, fmt.Errorf("%w: %s snapshot is not consistent: %w", xdscontract.ErrInvalidResource, k, err)
		}
	}
	if err := s.prepareLEDS(p); err != nil {
		return nil, err
	}
	return p, nil
}

// prepareLEDS computes the LEDS layout and the delta snapshot of each kind
// (Config.LEDS). The delta snapshot is the state-of-the-world one with its
// assignments in LEDS form: the same names, listeners, routes and
// clusters, so the checks the state-of-the-world snapshot passed hold.
func (s *Server) prepareLEDS(p *prepared) error {
	if s.deltaCache == nil {
		return nil
	}
	for i := range numKinds {
		u, err := s.ledsKinds[i].prepare(p.sets[i].Endpoints)
		if err != nil {
			return err
		}
		set := *p.sets[i]
		set.Endpoints = u.clas
		p.leds[i] = u
		p.deltaSnaps[i] = newSnapshot(&set, &p.versions[i], s.lastDeltaSnaps[i])
	}
	return nil
}

// applyLEDS serves what prepareLEDS computed: the endpoints first, then
// the assignments naming their collections (make before break).
func (s *Server) applyLEDS(p *prepared) error {
	if s.deltaCache == nil {
		return nil
	}
	for i, k := range kinds() {
		if err := s.ledsKinds[i].apply(p.leds[i]); err != nil {
			return fmt.Errorf("xds: set %s LEDS endpoints: %w", k, err)
		}
		if err := s.deltaCache.SetSnapshot(s.ctx, string(k), p.deltaSnaps[i]); err != nil {
			return fmt.Errorf("xds: set %s delta snapshot: %w", k, err)
		}
	}
	s.lastDeltaSnaps = p.deltaSnaps
	return nil
}

func sameAssignmentNames(a, b *Set) bool {
	if len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	for i := range a.Endpoints {
		if a.Endpoints[i].GetClusterName() != b.Endpoints[i].GetClusterName() {
			return false
		}
	}
	return true
}

// sameResources reports whether type t of a and b holds the same resources.
// The Builder returns an unchanged resource as the same pointer, so pointer
// equality is content equality (a rebuilt but equal resource only costs a
// spare version bump).
// setNames returns the resource names of each kind's Set, by type.
func setNames(sets [numKinds]*Set) [numKinds][numTypes]map[string]struct{} {
	var out [numKinds][numTypes]map[string]struct{}
	for k, set := range sets {
		for t := range numTypes {
			out[k][t] = make(map[string]struct{})
		}
		for _, r := range set.Listeners {
			out[k][typeListener][r.GetName()] = struct{}{}
		}
		for _, r := range set.Routes {
			out[k][typeRoute][r.GetName()] = struct{}{}
		}
		for _, r := range set.Clusters {
			out[k][typeCluster][r.GetName()] = struct{}{}
		}
		for _, r := range set.Endpoints {
			out[k][typeEndpoint][r.GetClusterName()] = struct{}{}
		}
	}
	return out
}

func sameResources(a, b *Set, t resourceType) bool {
	switch t {
	case typeListener:
		return samePtrs(a.Listeners, b.Listeners)
	case typeRoute:
		return samePtrs(a.Routes, b.Routes)
	case typeCluster:
		return samePtrs(a.Clusters, b.Clusters)
	default:
		return samePtrs(a.Endpoints, b.Endpoints)
	}
}

func samePtrs[T any](a, b []*T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// newSnapshot builds the snapshot of set. A type whose version equals its
// version in prev (may be nil) reuses prev's index of that type.
func newSnapshot(set *Set, versions *[numTypes]uint64, prev *cache.Snapshot) *cache.Snapshot {
	snap := &cache.Snapshot{}
	for t := range numTypes {
		idx := cache.GetResponseType(t.url())
		version := strconv.FormatUint(versions[t], 10)
		if prev != nil && prev.Resources[idx].Version == version {
			snap.Resources[idx] = prev.Resources[idx]
			continue
		}
		var items []types.Resource
		switch t {
		case typeListener:
			items = toResources(set.Listeners)
		case typeRoute:
			items = toResources(set.Routes)
		case typeCluster:
			items = toResources(set.Clusters)
		default:
			items = toResources(set.Endpoints)
		}
		snap.Resources[idx] = cache.NewResources(version, items)
	}
	return snap
}

func toResources[T types.Resource](in []T) []types.Resource {
	out := make([]types.Resource, len(in))
	for i, r := range in {
		out[i] = r
	}
	return out
}

// Version returns the version of the last pushed snapshot, "0" before the
// first Push.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatUint(s.seq, 10)
}

// Stop cancels every open xDS stream, refuses new ones, fails pending and
// future WaitForAck and Push calls with ErrStopped, and waits for an
// in-flight Push to finish. It is idempotent. The stream goroutines belong
// to the grpc.Server that serves them: call Stop before that server's Stop
// or GracefulStop, which would otherwise wait on the open streams.
func (s *Server) Stop() {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		close(s.ackCh)
	}
	s.mu.Unlock()
	s.cancel()
	s.pushMu.Lock()
	defer s.pushMu.Unlock()
}

func (s *Server) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// libLogger adapts slog to go-control-plane's printf-style logger. The
// library's chatter goes out at debug level except its warnings and errors.
type libLogger struct{ l *slog.Logger }

func (g libLogger) logf(level slog.Level, format string, args []any) {
	if !g.l.Enabled(context.Background(), level) {
		return
	}
	g.l.Log(context.Background(), level, "xds library event", "detail", fmt.Sprintf(format, args...))
}

func (g libLogger) Debugf(format string, args ...any) { g.logf(slog.LevelDebug, format, args) }
func (g libLogger) Infof(format string, args ...any)  { g.logf(slog.LevelDebug, format, args) }
func (g libLogger) Warnf(format string, args ...any)  { g.logf(slog.LevelWarn, format, args) }
func (g libLogger) Errorf(format string, args ...any) { g.logf(slog.LevelError, format, args) }
