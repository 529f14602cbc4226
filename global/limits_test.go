package global

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

var limitsT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func limitSummary(region, incarnation string, seq uint64, at time.Time) *isobarpb.RegionSummary {
	return &isobarpb.RegionSummary{
		Region: region, Incarnation: incarnation, Sequence: seq, At: timestamppb.New(at),
		Models: []*isobarpb.ModelSummary{{Model: "m", CellsReady: 1, CapacityRps: 10, DemandRps: 5, EngineLatencyMs: 300}},
	}
}

// newLimitedSync is a leader's Sync service with limits l and a fake
// clock, served on loopback.
func newLimitedSync(t *testing.T, l Limits) (*syncService, *clockwork.FakeClock, *prometheus.Registry, isobarpb.GlobalControlClient) {
	t.Helper()
	l.withDefaults()
	clock := clockwork.NewFakeClockAt(limitsT0)
	prom := prometheus.NewRegistry()
	svc := &syncService{
		lead: alwaysLeader{done: make(chan struct{})}, store: newStore(), hub: newHub(clock.Now),
		limits: l, regionTTL: 3 * time.Second, skew: newSkewWatch(l, slog.New(slog.DiscardHandler)),
		clock: clock, log: slog.New(slog.DiscardHandler), metrics: newMetrics(),
	}
	if err := svc.metrics.register(prom); err != nil {
		t.Fatal(err)
	}
	if err := registerAll(prom, svc.skew.counter, newSkewCollector(svc.store)); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	isobarpb.RegisterGlobalControlServer(gs, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return svc, clock, prom, isobarpb.NewGlobalControlClient(conn)
}

// syncSend opens a Sync stream and sends sm on it.
func syncSend(t *testing.T, cl isobarpb.GlobalControlClient, sm *isobarpb.RegionSummary) isobarpb.GlobalControl_SyncClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := cl.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(sm); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitHeld polls the store until region is held, bounded above.
func waitHeld(t *testing.T, st *store, region string) received {
	t.Helper()
	var rc received
	eventually.True(t, 5*time.Second, "region "+region+" stored", func() bool {
		var ok bool
		rc, ok = st.snapshot()[region]
		return ok
	})
	return rc
}

func TestGlobalLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Limits)
	}{
		{"no regions", func(l *Limits) { l.MaxRegions = -1 }},
		{"more regions than a summary can name", func(l *Limits) { l.MaxRegions = summary.MaxRegions + 1 }},
		{"negative forget-after", func(l *Limits) { l.RegionForgetAfter = -time.Second }},
		{"tiny gRPC limit", func(l *Limits) { l.MaxRecvMsgBytes = 10 }},
		{"negative skew", func(l *Limits) { l.MaxClockSkew = -time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Name: "g"}
			cfg.withDefaults()
			tc.mut(&cfg.Limits)
			if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("validate = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// A summary from a new region beyond MaxRegions ends its stream with
// ResourceExhausted and is counted; a region silent for RegionForgetAfter
// makes room.
func TestSyncRegionLimit(t *testing.T) {
	svc, clock, _, cl := newLimitedSync(t, Limits{MaxRegions: 2, RegionForgetAfter: time.Minute})
	refused := func() float64 { return testutil.ToFloat64(svc.metrics.rejected.WithLabelValues("too_many_regions")) }
	syncSend(t, cl, limitSummary("r1", "x", 1, clock.Now()))
	waitHeld(t, svc.store, "r1")
	clock.Advance(time.Second)
	r2 := syncSend(t, cl, limitSummary("r2", "x", 1, clock.Now()))
	waitHeld(t, svc.store, "r2")

	s := syncSend(t, cl, limitSummary("r3", "x", 1, clock.Now()))
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "region limit") {
		t.Fatalf("third region: %v; want ResourceExhausted naming the region limit", err)
	}
	if got := refused(); got != 1 {
		t.Fatalf("too_many_regions = %v, want 1", got)
	}
	// A held region is never refused.
	if err := r2.Send(limitSummary("r2", "x", 2, clock.Now())); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 5*time.Second, "r2's second summary stored", func() bool { return svc.store.snapshot()["r2"].s.GetSequence() == 2 })
	// r1 falls silent for RegionForgetAfter: r4 takes its place.
	clock.Advance(time.Minute)
	syncSend(t, cl, limitSummary("r4", "x", 1, clock.Now()))
	waitHeld(t, svc.store, "r4")
	held := svc.store.snapshot()
	if _, ok := held["r1"]; ok || len(held) != 2 {
		t.Fatalf("held = %v, want r2 and r4", held)
	}
	if got := refused(); got != 1 {
		t.Fatalf("too_many_regions = %v after r4 took a silent region's place, want 1", got)
	}
}

// A summary whose time is an hour behind, or ahead by less than the
// future allowance (summary.MaxFutureSkew), is accepted and flagged
// (counter, gauge, /debug/regions); its age and liveness run on the
// receive time. One dated further ahead is refused and counted as
// "future": it would outlive the region TTL and mask later summaries.
func TestSummaryClockSkew(t *testing.T) {
	svc, clock, prom, cl := newLimitedSync(t, Limits{MaxClockSkew: 5 * time.Second})
	syncSend(t, cl, limitSummary("future", "x", 1, clock.Now().Add(time.Hour)))
	eventually.True(t, 5*time.Second, "a summary an hour ahead refused as future", func() bool {
		return testutil.ToFloat64(svc.metrics.rejected.WithLabelValues("future")) == 1
	})
	if _, held := svc.store.snapshot()["future"]; held {
		t.Fatal("a summary an hour ahead was stored")
	}
	ahead := summary.MaxFutureSkew - time.Second
	syncSend(t, cl, limitSummary("behind", "x", 1, clock.Now().Add(-time.Hour)))
	syncSend(t, cl, limitSummary("ahead", "x", 1, clock.Now().Add(ahead)))
	syncSend(t, cl, limitSummary("in-sync", "x", 1, clock.Now().Add(-2*time.Second)))
	for _, r := range []string{"behind", "ahead", "in-sync"} {
		waitHeld(t, svc.store, r)
	}
	if got := testutil.ToFloat64(svc.skew.counter); got != 2 {
		t.Fatalf("skewed summaries = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(prom, "isobar_global_region_clock_skew_seconds"); n != 3 {
		t.Fatalf("skew gauges = %d, want 3", n)
	}
	g := &Server{cfg: Config{RegionTTL: 3 * time.Second, Limits: svc.limits}, deps: Deps{Clock: clock}, store: svc.store}
	want := map[string]struct {
		skew    float64
		skewed  bool
		liveNow bool
	}{"behind": {-3600, true, true}, "ahead": {ahead.Seconds(), true, true}, "in-sync": {-2, false, true}}
	for _, rs := range g.Regions() {
		w := want[rs.Region]
		if rs.ClockSkewSeconds != w.skew || rs.ClockSkewed != w.skewed || rs.Live != w.liveNow || rs.AgeSeconds != 0 {
			t.Errorf("%s: %+v, want skew %v skewed %v live, age 0", rs.Region, rs, w.skew, w.skewed)
		}
	}
	// Liveness ends one RegionTTL after receipt, whatever the summary said.
	clock.Advance(4 * time.Second)
	for _, rs := range g.Regions() {
		if rs.Live {
			t.Errorf("%s live %v after receipt", rs.Region, rs.AgeSeconds)
		}
	}
}

// A region whose clock ran ahead before it restarted is not locked out
// until its clock catches up: once the held summary is older than the
// region TTL (receive time), a new incarnation replaces it.
func TestRestartAfterSkewReplaces(t *testing.T) {
	st := newStore()
	l := Limits{}
	l.withDefaults()
	ttl := 3 * time.Second
	if err := st.putLimited(limitSummary("r", "old", 9, limitsT0.Add(time.Hour)), limitsT0, l, ttl); err != nil {
		t.Fatal(err)
	}
	restarted := limitSummary("r", "new", 1, limitsT0.Add(time.Second))
	if err := st.putLimited(restarted, limitsT0.Add(time.Second), l, ttl); !errors.Is(err, ErrStale) {
		t.Fatalf("within the TTL: %v, want ErrStale (a live older incarnation still wins by time)", err)
	}
	later := proto.Clone(restarted).(*isobarpb.RegionSummary)
	later.Sequence = 2
	if err := st.putLimited(later, limitsT0.Add(ttl+time.Second), l, ttl); err != nil {
		t.Fatalf("after the TTL: %v, want the new incarnation stored", err)
	}
	if got := st.snapshot()["r"].s.GetIncarnation(); got != "new" {
		t.Fatalf("held incarnation %q, want new", got)
	}
	// The same incarnation still needs a higher sequence.
	if err := st.putLimited(later, limitsT0.Add(time.Hour), l, ttl); !errors.Is(err, ErrStale) {
		t.Fatalf("replayed sequence: %v, want ErrStale", err)
	}
}

// FuzzAcceptSummary feeds the leader's summary intake (validation, the
// region limit, the store) arbitrary encoded summaries on a stream bound
// to no region and to "a". It must never panic, must store only summaries
// that pass summary.Validate, and must never hold more than MaxRegions.
func FuzzAcceptSummary(f *testing.F) {
	seeds := []*isobarpb.RegionSummary{
		limitSummary("a", "x", 1, limitsT0), limitSummary("b", "y", 7, limitsT0.Add(time.Hour)),
		{Region: "c", Sequence: 1, At: timestamppb.New(limitsT0), Rtt: []*isobarpb.PeerRTT{{Region: "a", RttMs: 3}}},
	}
	// The issue-26 fields: a reduced summary (nearest RTTs and a
	// coordinate), a bad coordinate, and a pre-issue-26 full list.
	for _, mut := range []func(*isobarpb.RegionSummary){
		func(s *isobarpb.RegionSummary) { s.Coordinate = coordAt(0.01) },
		func(s *isobarpb.RegionSummary) { s.Coordinate = coordAt(math.NaN()) },
		func(s *isobarpb.RegionSummary) { s.Coordinate = &isobarpb.NetworkCoordinate{Vec: make([]float64, 17)} },
		func(s *isobarpb.RegionSummary) { s.Rtt = fullRTTList(200) },
	} {
		s := limitSummary("a", "x", 2, limitsT0)
		s.Rtt = []*isobarpb.PeerRTT{{Region: "held1", RttMs: 3}}
		mut(s)
		seeds = append(seeds, s)
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	l := Limits{MaxRegions: 2, RegionForgetAfter: time.Minute}
	l.withDefaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		sm := &isobarpb.RegionSummary{}
		if proto.Unmarshal(b, sm) != nil {
			return
		}
		svc := &syncService{store: newStore(), limits: l, regionTTL: time.Second,
			skew: newSkewWatch(l, slog.New(slog.DiscardHandler)), clock: clockwork.NewFakeClockAt(limitsT0),
			log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
		_ = svc.accept("", limitSummary("held1", "x", 1, limitsT0), nil)
		_ = svc.accept("", limitSummary("held2", "x", 1, limitsT0), nil)
		for _, bound := range []string{"", "a"} {
			err := svc.accept(bound, sm, nil)
			if err == nil && summary.Validate(sm) != nil {
				t.Fatalf("stored an invalid summary: %v", summary.Validate(sm))
			}
			if err != nil && reason(err) == "other" {
				t.Fatalf("refusal without a reason label: %v", err)
			}
		}
		held := svc.store.snapshot()
		if n := len(held); n > l.MaxRegions {
			t.Fatalf("%d regions held, limit %d", n, l.MaxRegions)
		}
		names := make([]string, 0, len(held))
		for r := range held {
			names = append(names, r)
		}
		slices.Sort(names)
		for _, row := range rttMatrix(names, held) {
			for _, v := range row {
				if math.IsNaN(v) || v < 0 {
					t.Fatalf("RTT matrix entry %v from accepted summaries", v)
				}
			}
		}
	})
}

// coordAt is a placed two-dimensional coordinate at (x, 0) seconds.
func coordAt(x float64) *isobarpb.NetworkCoordinate {
	return &isobarpb.NetworkCoordinate{Vec: []float64{x, 0}, Error: 0.3, Height: 1e-5}
}

// fullRTTList is a pre-issue-26 RTT list: one entry per peer p0000….
func fullRTTList(n int) []*isobarpb.PeerRTT {
	out := make([]*isobarpb.PeerRTT, n)
	for i := range out {
		out[i] = &isobarpb.PeerRTT{Region: fmt.Sprintf("p%04d", i), RttMs: float64(1 + i)}
	}
	return out
}

// The leader takes reduced summaries and pre-issue-26 full ones alike (a
// mixed-version fleet during an upgrade), and refuses a bad coordinate as
// invalid (isobar_global_summaries_rejected_total{reason="invalid"}) with
// an error naming the field.
func TestAcceptCoordinatesAndFullLists(t *testing.T) {
	l := Limits{MaxRegions: 10, RegionForgetAfter: time.Minute}
	l.withDefaults()
	svc := &syncService{store: newStore(), limits: l, regionTTL: time.Second,
		skew: newSkewWatch(l, slog.New(slog.DiscardHandler)), clock: clockwork.NewFakeClockAt(limitsT0),
		log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	reduced := limitSummary("a", "x", 1, limitsT0)
	reduced.Coordinate, reduced.Rtt = coordAt(0), []*isobarpb.PeerRTT{{Region: "b", RttMs: 20}}
	full := limitSummary("b", "y", 1, limitsT0)
	full.Rtt = append(fullRTTList(1000), &isobarpb.PeerRTT{Region: "a", RttMs: 22}, &isobarpb.PeerRTT{Region: "c", RttMs: 50})
	placed := limitSummary("c", "z", 1, limitsT0)
	placed.Coordinate = coordAt(0.040)
	for _, s := range []*isobarpb.RegionSummary{reduced, full, placed} {
		if err := svc.accept("", s, nil); err != nil {
			t.Fatalf("%s refused: %v", s.Region, err)
		}
	}
	mat := rttMatrix([]string{"a", "b", "c"}, svc.store.snapshot())
	// a–b: both listed it (mean); b–c: only b did; a–c: neither, estimated
	// from the coordinates (40 ms + both heights).
	if mat[0][1] != 21 || mat[1][2] != 50 || math.Abs(mat[0][2]-40.02) > 1e-6 {
		t.Errorf("matrix %v: want a–b 21, b–c 50, a–c 40.02", mat)
	}
	for name, c := range map[string]*isobarpb.NetworkCoordinate{
		"NaN":      coordAt(math.NaN()),
		"absurd":   coordAt(1e6),
		"too many": {Vec: make([]float64, 17), Error: 0.3},
		"no error": {Vec: []float64{0}, Error: -1},
	} {
		s := limitSummary("a", "x", 2, limitsT0)
		s.Coordinate = c
		err := svc.accept("", s, nil)
		if reason(err) != "invalid" || !strings.Contains(err.Error(), "coordinate") {
			t.Errorf("%s coordinate: err %v (reason %q), want invalid naming the coordinate", name, err, reason(err))
		}
	}
}

func TestPlanConfigLocalFill(t *testing.T) {
	cfg := Config{Name: "g"}
	cfg.withDefaults()
	if cfg.Plan.LocalFill != optimize.DefaultLocalFill {
		t.Errorf("default local fill %v, want %v", cfg.Plan.LocalFill, optimize.DefaultLocalFill)
	}
	for _, bad := range []float64{-0.5, 1.5, math.NaN()} {
		cfg.Plan.LocalFill = bad
		if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("local fill %v: validate = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// A summary whose capacity confidence (model or context class) is NaN,
// infinite, negative or above 1 is refused as invalid (the reason label
// the refusal counter uses) and not stored; one in [0,1] is accepted.
func TestCapacityConfidenceRefused(t *testing.T) {
	var l Limits
	l.withDefaults()
	svc := &syncService{store: newStore(), limits: l, regionTTL: time.Second,
		skew: newSkewWatch(l, slog.New(slog.DiscardHandler)), clock: clockwork.NewFakeClockAt(limitsT0),
		log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	seq := uint64(0)
	next := func() *isobarpb.RegionSummary {
		seq++
		sm := limitSummary("a", "x", seq, limitsT0)
		sm.Models[0].ContextClasses = []*isobarpb.ContextClass{{MaxTokens: 4096, Cells: 1, CapacityRps: 10, CapacityConfidence: 0.5}}
		return sm
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), -0.1, 1.5} {
		for _, where := range []string{"model", "class"} {
			sm := next()
			if where == "model" {
				sm.Models[0].CapacityConfidence = bad
			} else {
				sm.Models[0].ContextClasses[0].CapacityConfidence = bad
			}
			err := svc.accept("", sm, nil)
			if !errors.Is(err, summary.ErrInvalid) || reason(err) != "invalid" || !strings.Contains(err.Error(), "capacity_confidence") {
				t.Errorf("%s confidence %v: accept = %v (reason %q), want an invalid refusal naming capacity_confidence", where, bad, err, reason(err))
			}
		}
	}
	if n := len(svc.store.snapshot()); n != 0 {
		t.Fatalf("%d summaries stored, want none", n)
	}
	ok := next()
	ok.Models[0].CapacityConfidence = 1
	if err := svc.accept("", ok, nil); err != nil {
		t.Fatalf("confidence 1 refused: %v", err)
	}
}

// Sync streams are bounded: past Limits.MaxSyncStreams a stream is refused
// with ResourceExhausted, and a stream that sends no summary within
// Limits.FirstSummaryTimeout (on the service's clock) is closed with
// DeadlineExceeded, while a stream that did send one stays.
func TestSyncStreamsBounded(t *testing.T) {
	svc, clock, _, cl := newLimitedSync(t, Limits{MaxSyncStreams: 3, FirstSummaryTimeout: 10 * time.Second})
	live := syncSend(t, cl, limitSummary("r1", "x", 1, clock.Now()))
	waitHeld(t, svc.store, "r1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var silent []isobarpb.GlobalControl_SyncClient
	for range 2 {
		s, err := cl.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, s)
	}
	// Every stream's first-summary timer is set once its handler runs.
	if err := clock.BlockUntilContext(ctx, 3); err != nil {
		t.Fatalf("three Sync handlers never ran: %v", err)
	}
	extra, err := cl.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("fourth stream: %v; want ResourceExhausted", err)
	}
	if got := testutil.ToFloat64(svc.metrics.rejected.WithLabelValues("too_many_streams")); got != 1 {
		t.Fatalf("too_many_streams = %v, want 1", got)
	}
	clock.Advance(10 * time.Second)
	for i, s := range silent {
		if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("silent stream %d: %v; want DeadlineExceeded", i, err)
		}
	}
	if got := testutil.ToFloat64(svc.metrics.rejected.WithLabelValues("first_summary_timeout")); got != 2 {
		t.Fatalf("first_summary_timeout = %v, want 2", got)
	}
	// The stream that named its region is still served.
	if err := live.Send(limitSummary("r1", "x", 2, clock.Now())); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 5*time.Second, "r1's second summary stored", func() bool { return svc.store.snapshot()["r1"].s.GetSequence() == 2 })
}
