package regional

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/capacity"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/summary"
)

// GlobalConfig configures this region's part in cross-region routing.
type GlobalConfig struct {
	// ElectionPrefix where the global leader is found in etcd. Default
	// election.DefaultPrefix ("/isobar/global/election/").
	ElectionPrefix string
	// Keepalive of the Sync stream's connection to the leader: a leader
	// that vanished without closing is noticed within Time + Timeout
	// (internal/grpcbounds defaults: 10 s + 5 s).
	Keepalive grpcbounds.Client
	// SummaryInterval between summaries (to the leader and to gossip).
	// Default 1 s.
	SummaryInterval time.Duration
	// NominalCellRPS is the cold-start prior of one healthy cell's
	// capacity at SLO (requests/s): a cell starts there and moves to what
	// its engine shows as measurements arrive (Capacity, package
	// regional/capacity); either is scaled down by the cell's outlier
	// penalty. Default 1.3 (the 70B-AWQ profile's knee).
	NominalCellRPS float64
	// Capacity tunes the capacity estimator (TTFT SLO, smoothing,
	// evidence); its PriorRPS is NominalCellRPS. Zero fields take the
	// estimator's defaults.
	Capacity capacity.Config
	// IngressAddress (IP:port) is where other regions send traffic for
	// this one; advertised in the summary.
	IngressAddress string
	// DefaultEngineLatencyMs is the low-load latency used until cells
	// report a TTFT. Default 300.
	DefaultEngineLatencyMs float64
	// FallbackSummaryTTL: gossiped summaries older than this are ignored by
	// the fallback. Default 10 s.
	FallbackSummaryTTL time.Duration
	// BackoffMin/Max bound the jittered reconnect backoff. Defaults 100 ms
	// and 5 s.
	BackoffMin, BackoffMax time.Duration
	// DemandTau is the time constant of the demand reported for planning
	// (an exponentially weighted mean of the measured rate, each sample
	// clipped to a Poisson upper bound above the estimate; see
	// demandSmoother). Default 30 s; negative turns smoothing off.
	DemandTau time.Duration
	// Fallback optimiser parameters (the global's defaults). LocalFill: a
	// region's demand stays home while under LocalFill·capacity·Headroom
	// (0: optimize.DefaultLocalFill).
	Headroom, Beta, K, ShedPenaltyMs, LocalFill float64
}

func (g *GlobalConfig) withDefaults() {
	if g.ElectionPrefix == "" {
		g.ElectionPrefix = election.DefaultPrefix
	}
	if g.SummaryInterval == 0 {
		g.SummaryInterval = time.Second
	}
	if g.NominalCellRPS == 0 {
		g.NominalCellRPS = capacity.DefaultPriorRPS
	}
	g.Capacity.PriorRPS = g.NominalCellRPS
	g.Capacity = g.Capacity.WithDefaults()
	if g.DemandTau == 0 {
		g.DemandTau = 30 * time.Second
	}
	if g.DefaultEngineLatencyMs == 0 {
		g.DefaultEngineLatencyMs = 300
	}
	if g.FallbackSummaryTTL == 0 {
		g.FallbackSummaryTTL = 10 * time.Second
	}
	if g.BackoffMin == 0 {
		g.BackoffMin = 100 * time.Millisecond
	}
	if g.BackoffMax == 0 {
		g.BackoffMax = 5 * time.Second
	}
	if g.Headroom == 0 {
		g.Headroom = optimize.DefaultHeadroom
	}
	if g.Beta == 0 {
		g.Beta = optimize.DefaultBeta
	}
	if g.K == 0 {
		g.K = optimize.DefaultK
	}
	if g.ShedPenaltyMs == 0 {
		g.ShedPenaltyMs = optimize.DefaultShedPenaltyMs
	}
}

// gossiper is what the region needs from its gossip node.
type gossiper interface {
	SetLocalSummary(*isobarpb.RegionSummary) error
	Summaries() map[string]gossip.PeerSummary
	RTT() map[string]time.Duration
}

// syncer connects the region to the global leader: it finds the leader in
// etcd, streams summaries, validates and installs plans, and falls back to
// a gossip-based local-first plan when the plan expires.
//
// Goroutines: run (leader lookup and sessions) and summaries (summary
// building, gossip, fallback), both owned by the controller's ctx. The
// route table in force is an atomic pointer read by the debug endpoint.
type syncer struct {
	cfg    GlobalConfig
	region string
	reg    *Registry
	etcd   *clientv3.Client
	gossip gossiper
	demand func() map[string]float64
	dial   []grpc.DialOption
	// mtls: this controller runs with TLS, so the global leader must be
	// reached over mTLS too. Whatever it is, a server that presents a
	// certificate must present a global identity.
	mtls    bool
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics

	// smoother and capacity are owned by the summaries goroutine
	// (buildSummary).
	smoother *demandSmoother
	capacity *capacity.Estimator
	capSeen  map[string]seenKey // the last heartbeat observed per cell
	// capLogged: the capacity last logged per model.
	capLogged map[string]float64

	incarnation string
	seq         atomic.Uint64
	latest      atomic.Pointer[isobarpb.RegionSummary]
	table       atomic.Pointer[RouteTable]
	mu          sync.Mutex // serialises table changes
	// fence is the highest plan ever applied (guarded by mu): kept
	// through fallback, and through restarts via fences when set.
	fence  *RouteTable
	fences FenceStore
}

func newSyncer(cfg GlobalConfig, region string, reg *Registry, etcd *clientv3.Client, g gossiper,
	demand func() map[string]float64, dial []grpc.DialOption, clock clockwork.Clock, log *slog.Logger, m *metrics) *syncer {
	var b [6]byte
	_, _ = rand.Read(b[:])
	est, err := capacity.New(cfg.Capacity)
	if err != nil {
		// Config.validate checked it; a zero config takes the defaults.
		est, _ = capacity.New(capacity.Config{PriorRPS: cfg.NominalCellRPS})
	}
	return &syncer{
		cfg: cfg, region: region, reg: reg, etcd: etcd, gossip: g, demand: demand, dial: dial,
		clock: clock, log: log.With("component", "globalsync"), metrics: m, incarnation: hex.EncodeToString(b[:]),
		smoother: newDemandSmoother(cfg.DemandTau, reg.cfg.DataPlaneWindow),
		capacity: est, capSeen: map[string]seenKey{}, capLogged: map[string]float64{},
	}
}

// observeCapacity feeds the capacity estimator each cell heartbeat it
// has not seen yet and forgets cells that left the registry. Owned by the
// summaries goroutine.
func (s *syncer) observeCapacity(v *View) {
	rejected := s.capacity.Rejected()
	live := make(map[string]bool, len(v.Cells))
	for _, c := range v.Cells {
		live[c.ID] = true
		key := seenKey{c.Incarnation, c.Sequence}
		if s.capSeen[c.ID] == key {
			continue
		}
		s.capSeen[c.ID] = key
		sig := c.Signals
		if sig == nil || !c.VLLM.OK {
			continue // missing measurements: the estimate holds
		}
		s.capacity.Observe(c.ID, c.LastSeen, capacity.Sample{
			RequestRate: sig.RequestRate, Running: sig.Running, Waiting: sig.QueueDepth,
			KVUsage: sig.KvCacheUsage, TTFTP95: sig.TtftP95Seconds,
		})
	}
	for _, id := range s.capacity.Cells() {
		if !live[id] {
			s.capacity.Forget(id)
			delete(s.capSeen, id)
		}
	}
	if d := s.capacity.Rejected() - rejected; d > 0 {
		s.metrics.capacityRejected.Add(float64(d))
	}
}

// seenKey identifies one heartbeat of a cell.
type seenKey struct {
	incarnation string
	sequence    uint64
}

// Routes returns the route table in force (nil before any).
func (s *syncer) Routes() *RouteTable { return s.table.Load() }

// summaries builds a summary every interval, gossips it, and switches to
// the fallback when the plan has expired.
func (s *syncer) summaries(ctx context.Context) {
	t := s.clock.NewTicker(s.cfg.SummaryInterval)
	defer t.Stop()
	for {
		// A starting controller holds back until its cells are back
		// (Registry.Settled, warmstart.go): a summary or a fallback built
		// from the cells that reconnected first would tell the leader and
		// the gossip peers the region has lost capacity, and route on it.
		select {
		case <-ctx.Done():
			return
		case <-s.reg.settledC(): // closed once; the first summary follows at once
		}
		now := s.clock.Now()
		sm := s.buildSummary(now)
		s.latest.Store(sm)
		if s.gossip != nil {
			if err := s.gossip.SetLocalSummary(sm); err != nil {
				s.log.Warn("summary not gossiped", "err", err)
			}
		}
		if cur := s.table.Load(); cur == nil || cur.Source != RoutesPlan || !now.Before(cur.ValidUntil) {
			s.install(ctx, s.fallback(now, sm))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// buildSummary aggregates the registry's current view.
func (s *syncer) buildSummary(now time.Time) *isobarpb.RegionSummary {
	v := s.reg.View()
	s.observeCapacity(v)
	cells := make([]summary.Cell, 0, len(v.Cells))
	served := map[string]float64{}
	for _, c := range v.Cells {
		sc := summary.Cell{
			Model: c.Model, State: c.State.Proto(), Pressure: c.Score.Pressure, Fallback: c.Fallback,
			MaxModelLen: c.MaxModelLen,
		}
		if c.State == lifecycle.Ready {
			e := s.capacity.Estimate(c.ID, now, 1-c.Weight.Penalty)
			sc.CapacityRPS, sc.CapacityConfidence = e.RPS, e.Confidence
			if e.LowLoadTTFT > 0 {
				t0 := e.LowLoadTTFT
				sc.LowLoadTTFT = &t0
			}
		}
		if sig := c.Signals; sig != nil && c.VLLM.OK {
			sc.LoadRPS = sig.GetRequestRate()
			sc.TTFTP95, sc.ErrorRate, sc.WindowRequests, sc.KVUsage = sig.TtftP95Seconds, sig.ErrorRate, sig.WindowRequests, sig.KvCacheUsage
		}
		served[c.Model] += sc.LoadRPS
		cells = append(cells, sc)
	}
	demand := served
	switch {
	case s.demand != nil:
		demand = s.demand()
	case v.Demand != nil:
		demand = v.Demand
	}
	demand = s.smoother.update(now, demand)
	var rtt map[string]time.Duration
	if s.gossip != nil {
		rtt = s.gossip.RTT()
	}
	sm := summary.Aggregate(summary.Input{
		Region: s.region, Incarnation: s.incarnation, Sequence: s.seq.Add(1), Now: now, Cells: cells,
		Demand: demand, RTT: rtt, IngressAddress: s.cfg.IngressAddress, DefaultEngineLatencyMs: s.cfg.DefaultEngineLatencyMs,
	})
	s.metrics.capacityRPS.Reset()
	s.metrics.capacityConfidence.Reset()
	for m := range s.capLogged {
		if !slices.ContainsFunc(sm.GetModels(), func(ms *isobarpb.ModelSummary) bool { return ms.GetModel() == m }) {
			delete(s.capLogged, m)
		}
	}
	for _, m := range sm.GetModels() {
		s.metrics.capacityRPS.WithLabelValues(m.GetModel()).Set(m.GetCapacityRps())
		s.metrics.capacityConfidence.WithLabelValues(m.GetModel()).Set(m.GetCapacityConfidence())
		if last, ok := s.capLogged[m.GetModel()]; !ok || math.Abs(m.GetCapacityRps()-last) > 0.1*last {
			s.capLogged[m.GetModel()] = m.GetCapacityRps()
			s.log.Info("capacity estimate changed", "model", m.GetModel(), "capacity_rps", m.GetCapacityRps(),
				"confidence", m.GetCapacityConfidence(), "cells_ready", m.GetCellsReady(), "load_rps", m.GetLoadRps())
		}
	}
	return sm
}

// install hands t to the registry and then makes it the table in force.
// Both happen under s.mu, so the plan stream and the summaries loop, which
// both install, hand tables to the registry in the order /debug/routes
// (s.table) shows them, and a table the registry did not take (it stopped,
// or ctx ended) is never shown: /debug/routes and the table the registry
// serves from cannot disagree.
func (s *syncer) install(ctx context.Context, t *RouteTable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reg.SetRoutes(ctx, t); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("route table not installed", "err", err)
		}
		return
	}
	prev := s.table.Swap(t)
	if prev == nil || prev.Source != t.Source {
		s.log.Info("cross-region routing source changed", "source", t.Source, "epoch", t.Epoch)
	}
	s.metrics.routeSource.Reset()
	s.metrics.routeSource.WithLabelValues(t.Source).Set(1)
}

// fallback computes local-first routing with spill-over from the gossiped
// summaries, with the global optimiser's code, keeping only this region's
// row. Without fresh peers everything stays local.
func (s *syncer) fallback(now time.Time, self *isobarpb.RegionSummary) *RouteTable {
	t := &RouteTable{Source: RoutesLocal, Models: map[string]ModelRoutes{}, Ingress: map[string]string{}}
	var peers map[string]gossip.PeerSummary
	var rtt map[string]time.Duration
	if s.gossip != nil {
		peers, rtt = s.gossip.Summaries(), s.gossip.RTT()
	}
	names := []string{s.region}
	sums := map[string]*isobarpb.RegionSummary{s.region: self}
	for r, p := range peers {
		if r == s.region || !p.Alive || now.Sub(p.ReceivedAt) > s.cfg.FallbackSummaryTTL || p.Summary == nil {
			continue
		}
		if _, ok := rtt[r]; !ok {
			continue // unreachable from here
		}
		names = append(names, r)
		sums[r] = p.Summary
		if a := p.Summary.GetIngressAddress(); a != "" && ingressAddress(a) == nil {
			t.Ingress[r] = a
		}
	}
	slices.Sort(names)
	if len(names) > 1 {
		t.Source = RoutesFallback
	}
	selfIdx := slices.Index(names, s.region)
	n := len(names)
	mat := make([][]float64, n)
	for i := range mat {
		mat[i] = make([]float64, n)
		for j := range mat[i] {
			if i != j {
				mat[i][j] = math.Inf(1)
			}
		}
	}
	idx := map[string]int{}
	for i, r := range names {
		idx[r] = i
	}
	for r, d := range rtt {
		if j, ok := idx[r]; ok && j != selfIdx {
			ms := float64(d) / float64(time.Millisecond)
			mat[selfIdx][j], mat[j][selfIdx] = ms, ms
		}
	}
	for i, r := range names {
		if i == selfIdx {
			continue
		}
		for _, p := range sums[r].GetRtt() {
			if j, ok := idx[p.GetRegion()]; ok && j != selfIdx && j != i && math.IsInf(mat[i][j], 1) {
				mat[i][j], mat[j][i] = p.GetRttMs(), p.GetRttMs()
			}
		}
	}
	for _, m := range self.GetModels() {
		prob := optimize.Problem{
			Regions: make([]optimize.Region, n), RTTms: mat, Headroom: s.cfg.Headroom,
			Beta: s.cfg.Beta, K: s.cfg.K, ShedPenaltyMs: s.cfg.ShedPenaltyMs,
		}
		for i, r := range names {
			reg := optimize.Region{Name: r, EngineLatencyMs: s.cfg.DefaultEngineLatencyMs}
			for _, pm := range sums[r].GetModels() {
				if pm.GetModel() == m.GetModel() {
					reg.DemandRPS, reg.CapacityRPS = pm.GetDemandRps(), pm.GetCapacityRps()
					if pm.GetEngineLatencyMs() > 0 {
						reg.EngineLatencyMs = pm.GetEngineLatencyMs()
					}
				}
			}
			prob.Regions[i] = reg
		}
		mr := ModelRoutes{Routes: map[string]float64{s.region: 1}}
		if n > 1 {
			if pl, err := optimize.SolveLocalFirst(prob, s.cfg.LocalFill); err == nil {
				mr = ModelRoutes{Routes: map[string]float64{}, Shed: pl.Shed[selfIdx]}
				for j, f := range pl.Fractions[selfIdx] {
					if f >= 1e-4 {
						mr.Routes[names[j]] = f
					}
				}
			}
		}
		t.Models[m.GetModel()] = mr
	}
	return t
}

// run keeps a Sync session with the current leader.
func (s *syncer) run(ctx context.Context) {
	bo := backoff.New(backoff.Policy{Min: s.cfg.BackoffMin, Max: s.cfg.BackoffMax, Jitter: backoff.Full})
	for ctx.Err() == nil {
		got, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			bo.Reset()
		}
		wait := bo.Next()
		s.log.Debug("global session ended; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(wait):
		}
	}
}

// errNoLeader: no leader is registered in etcd.
var errNoLeader = errors.New("regional: no global leader")

// ErrPlanSource: the server a region dialled as the global leader is not
// a global identity (spiffe://isobar/global/<name>), or was reached
// without mTLS by a controller that runs with TLS. The session is closed
// before any summary is sent or plan read.
var ErrPlanSource = errors.New("regional: routing plans accepted only from a global identity")

// errPlanNotMTLS is the ErrPlanSource case of a plaintext session.
var errPlanNotMTLS = fmt.Errorf("%w: the connection is not mTLS", ErrPlanSource)

// checkLeader authorises the server end of a Sync stream, whose context
// carries the peer of the established connection.
func (s *syncer) checkLeader(ctx context.Context) error {
	id, err := certs.GRPCPeerIdentity(ctx)
	if errors.Is(err, certs.ErrNotMTLS) {
		if s.mtls {
			return errPlanNotMTLS
		}
		return nil // plaintext by the operator's choice (--insecure)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPlanSource, err)
	}
	if id.Kind != certs.KindGlobal {
		return fmt.Errorf("%w: the server's certificate identity is %s", ErrPlanSource, id)
	}
	return nil
}

func planPeerReason(err error) string {
	if errors.Is(err, errPlanNotMTLS) {
		return "not_mtls"
	}
	return "not_global"
}

// session finds the leader, streams summaries and applies plans until the
// stream ends. got reports whether any plan arrived.
func (s *syncer) session(ctx context.Context) (got bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	id, _, err := election.Leader(lctx, s.etcd, s.cfg.ElectionPrefix)
	cancel()
	if err != nil {
		return false, err
	}
	addr, ok := leaderAddress(id)
	if !ok {
		return false, errNoLeader
	}
	return s.stream(ctx, addr)
}

// stream runs one Sync session with the leader at addr: it authorises the
// server (checkLeader), then streams summaries and applies plans until the
// stream ends. got reports whether any plan arrived.
func (s *syncer) stream(ctx context.Context, addr string) (got bool, err error) {
	conn, err := grpc.NewClient(addr, append(s.dial, s.cfg.Keepalive.DialOption())...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := isobarpb.NewGlobalControlClient(conn).Sync(sctx)
	if err != nil {
		return false, err
	}
	if err := s.checkLeader(stream.Context()); err != nil {
		s.metrics.planPeerRefused.WithLabelValues(planPeerReason(err)).Inc()
		s.log.Warn("global leader refused: plans are accepted only from a global identity",
			"address", addr, "peer_identity", peerName(stream.Context()), "err", err)
		return false, err
	}
	sendErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() {
		t := s.clock.NewTicker(s.cfg.SummaryInterval)
		defer t.Stop()
		for {
			if sm := s.latest.Load(); sm != nil {
				if err := stream.Send(sm); err != nil {
					sendErr <- err
					return
				}
			}
			select {
			case <-sctx.Done():
				return
			case <-t.Chan():
			}
		}
	})
	for {
		p, err := stream.Recv()
		if err != nil {
			if status.Code(err) == codes.FailedPrecondition {
				s.log.Info("global member is not the leader; looking again", "err", status.Convert(err).Message())
			}
			select {
			case e := <-sendErr:
				return got, e
			default:
			}
			return got, err
		}
		s.applyPlan(ctx, p)
		got = true
	}
}

// applyPlan validates a plan against the fence and installs it, or counts
// the refusal. An applied plan raises the fence (and saves it).
func (s *syncer) applyPlan(ctx context.Context, p *isobarpb.RoutingPlan) {
	now := s.clock.Now()
	s.mu.Lock()
	cur := s.table.Load()
	inForce := cur != nil && cur.Source == RoutesPlan && now.Before(cur.ValidUntil)
	t, err := planTable(p, s.region, s.fence, inForce, now, s.reg.cfg.Limits.MaxClockSkew)
	if err == nil {
		s.fence = t
	}
	s.mu.Unlock()
	s.metrics.plans.WithLabelValues(planResult(err)).Inc()
	if err != nil {
		s.log.Warn("routing plan refused", "epoch", p.GetEpoch(), "sequence", p.GetSequence(), "err", err)
		return
	}
	if s.fences != nil {
		if err := s.fences.SaveFence(Fence{Epoch: t.Epoch, Sequence: t.Sequence}); err != nil {
			s.log.Warn("plan fence not saved; after a restart this region may accept an older leader's plan", "err", err)
		}
	}
	s.metrics.planEpoch.Set(float64(t.Epoch))
	s.install(ctx, t)
}

// leaderAddress extracts the gRPC address from the leader's election
// value, "name@host:port".
func leaderAddress(id string) (string, bool) {
	i := strings.LastIndexByte(id, '@')
	if i < 0 || i == len(id)-1 {
		return "", false
	}
	return id[i+1:], true
}

var _ gossiper = (*gossip.Node)(nil)
