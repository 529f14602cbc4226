package global

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

type alwaysLeader struct{ done chan struct{} }

func (a alwaysLeader) term() <-chan struct{} { return a.done }
func (alwaysLeader) leaderHint() string      { return "me" }

// regionSummaries builds n regions on random 2-D coordinates (RTT from
// distance, each region reporting its 8 nearest peers), with demand at
// about 70 % of capacity on average.
func regionSummaries(n int, seed uint64) []*isobarpb.RegionSummary {
	rng := rand.New(rand.NewPCG(seed, 1))
	type pt struct{ x, y float64 }
	pts := make([]pt, n)
	for i := range pts {
		pts[i] = pt{rng.Float64() * 100, rng.Float64() * 100}
	}
	out := make([]*isobarpb.RegionSummary, n)
	for i := range out {
		capacity := 50 + rng.Float64()*100
		s := &isobarpb.RegionSummary{
			Region: fmt.Sprintf("r%04d", i), Incarnation: "x", Sequence: 1, At: timestamppb.Now(),
			IngressAddress: fmt.Sprintf("10.%d.%d.1:10001", i/250, i%250),
			Models: []*isobarpb.ModelSummary{{
				Model: "m", CellsReady: 10, CapacityRps: capacity, DemandRps: capacity * (0.2 + rng.Float64()),
				EngineLatencyMs: 300,
			}},
		}
		type nd struct {
			j int
			d float64
		}
		var near []nd
		for j := range pts {
			if j != i {
				dx, dy := pts[i].x-pts[j].x, pts[i].y-pts[j].y
				near = append(near, nd{j, 2 + (dx*dx+dy*dy)/50})
			}
		}
		for k := 0; k < 8 && k < len(near); k++ {
			best := k
			for m := k + 1; m < len(near); m++ {
				if near[m].d < near[best].d {
					best = m
				}
			}
			near[k], near[best] = near[best], near[k]
			s.Rtt = append(s.Rtt, &isobarpb.PeerRTT{Region: fmt.Sprintf("r%04d", near[k].j), RttMs: near[k].d})
		}
		out[i] = s
	}
	return out
}

// BenchmarkPlanCycle: one leader cycle's planning (every model, all live
// regions) and the plan's encoding, at 10, 100 and 1,000 regions.
//
// With slices, every region splits its demand 20/50/30 % critical,
// standard and sheddable, and a fifth of them also pin a tenth of it to
// themselves and their nearest peer.
func BenchmarkPlanCycle(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, sliced := range []bool{false, true} {
			name := fmt.Sprintf("regions=%d", n)
			if sliced {
				name += "/slices"
			}
			b.Run(name, func(b *testing.B) { benchPlanCycle(b, n, sliced) })
		}
	}
}

func benchPlanCycle(b *testing.B, n int, sliced bool) {
	now := time.Now()
	sums := map[string]received{}
	for k, s := range regionSummaries(n, 7) {
		if sliced {
			m := s.Models[0]
			d := m.DemandRps
			var pinned []string
			if k%5 == 0 {
				pinned = []string{s.Region, s.Rtt[0].Region}
				slices.Sort(pinned)
			}
			m.DemandSlices = []*isobarpb.DemandSlice{
				{Criticality: isobarpb.Criticality_CRITICALITY_CRITICAL, Rps: 0.2 * d},
				{Criticality: isobarpb.Criticality_CRITICALITY_STANDARD, Rps: 0.4 * d},
				{Criticality: isobarpb.Criticality_CRITICALITY_SHEDDABLE, Rps: 0.3 * d},
				{Criticality: isobarpb.Criticality_CRITICALITY_STANDARD, Rps: 0.1 * d, AllowedRegions: pinned},
			}
			if pinned == nil {
				m.DemandSlices[1].Rps += m.DemandSlices[3].Rps
				m.DemandSlices = m.DemandSlices[:3]
			}
		}
		sums[s.Region] = received{s: s, at: now}
	}
	p := newPlanner(PlanConfig{Headroom: 0.9, Beta: 0.1, K: 4, ShedPenaltyMs: 10_000, DampStep: 0.5})
	var size int
	for b.Loop() {
		plan, _ := p.plan(now, sums, time.Minute, time.Minute)
		bs, _ := proto.Marshal(plan)
		size = len(bs)
	}
	b.ReportMetric(float64(size), "plan-bytes")
}

// BenchmarkIngest1000Regions: 1,000 regions' Sync streams on loopback into
// the leader's summary store; reports summaries/s (the requirement is
// 1,000/s: every region at 1 Hz).
func BenchmarkIngest1000Regions(b *testing.B) {
	const n = 1000
	sums := regionSummaries(n, 3)
	lead := alwaysLeader{done: make(chan struct{})}
	st := newStore()
	svc := &syncService{lead: lead, store: st, hub: newHub(clockwork.NewRealClock().Now), clock: clockwork.NewRealClock(),
		log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	gs := grpc.NewServer()
	isobarpb.RegisterGlobalControlServer(gs, svc)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := make([]isobarpb.GlobalControl_SyncClient, n)
	for i := range streams {
		if streams[i], err = isobarpb.NewGlobalControlClient(conn).Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	per := b.N/n + 1
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Go(func() {
			m := proto.Clone(sums[i]).(*isobarpb.RegionSummary)
			for k := range per {
				m.Sequence = uint64(k + 1)
				if err := s.Send(m); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := float64(per * n)
	for {
		got := counterValue(svc.metrics.summaries)
		if got >= want {
			break
		}
		if time.Since(start) > 2*time.Minute {
			b.Fatalf("only %v of %v summaries ingested", got, want)
		}
		time.Sleep(time.Millisecond) // waiting for the streams to drain, bounded above
	}
	b.ReportMetric(want/time.Since(start).Seconds(), "summaries/s")
}
