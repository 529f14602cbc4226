package regional

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/capacity"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/summary"
)

// viewSource is what the summary builder reads the region from.
type viewSource interface {
	View() *View
}

// rttSource reports the measured round-trip time to each peer region.
type rttSource interface {
	RTT() map[string]time.Duration
}

// coordSource reports this region's network coordinate (gossip's
// Vivaldi coordinate, from the same probes as the RTTs).
type coordSource interface {
	Coordinate() *coordinate.Coordinate
}

var (
	_ viewSource  = (*Registry)(nil)
	_ rttSource   = (*gossip.Node)(nil)
	_ coordSource = (*gossip.Node)(nil)
)

// summaryBuilder turns the registry's view into this region's summary
// (the RTTs to its GlobalConfig.NearestRTT nearest regions and its gossip
// coordinate, so its size does not grow with the regions): it
// feeds the capacity estimator, smooths the demand and aggregates the
// cells, splits each model's demand into slices by criticality and allowed
// regions (summaryslices.go; only the data planes' demand is split), and
// keeps the latest summary for the leader session to send.
//
// Concurrency: build is called by one goroutine at a time (the syncer's
// summaries loop, or a test); the estimator, smoother and logged
// capacities are its alone. Latest is safe from any goroutine.
type summaryBuilder struct {
	cfg     GlobalConfig
	region  string
	view    viewSource
	rtt     rttSource   // nil: no RTTs reported
	coord   coordSource // nil: no coordinate reported
	demand  func() map[string]float64
	resid   *residency.Config
	log     *slog.Logger
	metrics *metrics

	smoother *demandSmoother
	capacity *capacity.Estimator
	capSeen  map[string]seenKey // the last heartbeat observed per cell
	// capLogged: the capacity last logged per model.
	capLogged map[string]float64

	incarnation string
	seq         atomic.Uint64
	latest      atomic.Pointer[isobarpb.RegionSummary]
}

// seenKey identifies one heartbeat of a cell.
type seenKey struct {
	incarnation string
	sequence    uint64
}

func newSummaryBuilder(cfg syncConfig, d syncDeps, log *slog.Logger) *summaryBuilder {
	var b [6]byte
	_, _ = rand.Read(b[:])
	est, err := capacity.New(cfg.Global.Capacity)
	if err != nil {
		// Config.validate checked it; a zero config takes the defaults.
		est, _ = capacity.New(capacity.Config{PriorRPS: cfg.Global.NominalCellRPS})
	}
	sb := &summaryBuilder{
		cfg: cfg.Global, region: cfg.Region, view: d.Registry, demand: d.Demand, resid: cfg.Residency, log: log, metrics: d.Metrics,
		smoother: newDemandSmoother(cfg.Global.DemandTau, cfg.DataPlaneWindow),
		capacity: est, capSeen: map[string]seenKey{}, capLogged: map[string]float64{},
		incarnation: hex.EncodeToString(b[:]),
	}
	if d.Gossip != nil {
		sb.rtt = d.Gossip
		// The gossip node (gossip.Node) also keeps the coordinate; a
		// stand-in that does not report RTTs only.
		sb.coord, _ = d.Gossip.(coordSource)
	}
	return sb
}

// Latest returns the summary built last (nil before the first).
func (b *summaryBuilder) Latest() *isobarpb.RegionSummary { return b.latest.Load() }

// build aggregates the registry's current view into a summary, records
// it as the latest and returns it.
func (b *summaryBuilder) build(now time.Time) *isobarpb.RegionSummary {
	sm, _ := b.buildPools(now)
	return sm
}

// buildPools is build, also returning each model's pool utilisation: the
// load its Ready cells serve over their capacity counting penalised cells
// at full capacity (the summary's capacity counts them at 1 − penalty).
// The projection's penalty bound (projection.PenaltyConfig.MaxLoadAfterHold)
// asks whether the cells left could carry the pool, so it needs the
// capacity a hold takes out in the denominator.
func (b *summaryBuilder) buildPools(now time.Time) (*isobarpb.RegionSummary, map[string]float64) {
	v := b.view.View()
	b.observeCapacity(v)
	cells, served := b.cells(v, now)
	pool := make(map[string]float64, len(served))
	for _, c := range v.Cells {
		if c.State == lifecycle.Ready {
			pool[c.Model] += b.capacity.Estimate(c.ID, now, 1).RPS
		}
	}
	for m, capRPS := range pool {
		switch {
		case capRPS > 0:
			pool[m] = served[m] / capRPS
		case served[m] > 0:
			pool[m] = 1
		}
	}
	demand := served
	var split map[string]map[SliceKey]float64 // only the data planes' demand is split
	switch {
	case b.demand != nil:
		demand = b.demand()
	case v.Demand != nil:
		demand, split = v.Demand, v.DemandSlices
	}
	demand = b.smoother.update(now, demand)
	var rtt map[string]time.Duration
	if b.rtt != nil {
		rtt = b.rtt.RTT()
	}
	var coord *coordinate.Coordinate
	if b.coord != nil {
		coord = b.coord.Coordinate()
	}
	sm := summary.Aggregate(summary.Input{
		Region: b.region, Incarnation: b.incarnation, Sequence: b.seq.Add(1), Now: now, Cells: cells,
		Demand: demand, RTT: rtt, NearestRTT: b.cfg.NearestRTT, Coordinate: coord, IngressAddress: b.cfg.IngressAddress, DefaultEngineLatencyMs: b.cfg.DefaultEngineLatencyMs,
		DemandSlices: summarySlices(split, b.resid),
	})
	b.reportCapacity(sm)
	b.latest.Store(sm)
	return sm, pool
}

// cells maps the view's cells to summary cells, and sums the load each
// model serves.
func (b *summaryBuilder) cells(v *View, now time.Time) ([]summary.Cell, map[string]float64) {
	cells := make([]summary.Cell, 0, len(v.Cells))
	served := map[string]float64{}
	for _, c := range v.Cells {
		sc := summary.Cell{
			Model: c.Model, State: c.State.Proto(), Pressure: c.Score.Pressure, Fallback: c.Fallback,
			MaxModelLen: c.MaxModelLen,
		}
		if c.State == lifecycle.Ready {
			e := b.capacity.Estimate(c.ID, now, 1-c.Weight.Penalty)
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
	return cells, served
}

// reportCapacity sets the capacity gauges from sm and logs each model's
// capacity when it moved by more than a tenth since last logged.
func (b *summaryBuilder) reportCapacity(sm *isobarpb.RegionSummary) {
	b.metrics.capacityRPS.Reset()
	b.metrics.capacityConfidence.Reset()
	for m := range b.capLogged {
		if !slices.ContainsFunc(sm.GetModels(), func(ms *isobarpb.ModelSummary) bool { return ms.GetModel() == m }) {
			delete(b.capLogged, m)
		}
	}
	for _, m := range sm.GetModels() {
		b.metrics.capacityRPS.WithLabelValues(m.GetModel()).Set(m.GetCapacityRps())
		b.metrics.capacityConfidence.WithLabelValues(m.GetModel()).Set(m.GetCapacityConfidence())
		if last, ok := b.capLogged[m.GetModel()]; !ok || math.Abs(m.GetCapacityRps()-last) > 0.1*last {
			b.capLogged[m.GetModel()] = m.GetCapacityRps()
			b.log.Info("capacity estimate changed", "model", m.GetModel(), "capacity_rps", m.GetCapacityRps(),
				"confidence", m.GetCapacityConfidence(), "cells_ready", m.GetCellsReady(), "load_rps", m.GetLoadRps())
		}
	}
}

// observeCapacity feeds the capacity estimator each cell heartbeat it
// has not seen yet and forgets cells that left the registry.
func (b *summaryBuilder) observeCapacity(v *View) {
	rejected := b.capacity.Rejected()
	live := make(map[string]bool, len(v.Cells))
	for _, c := range v.Cells {
		live[c.ID] = true
		key := seenKey{c.Incarnation, c.Sequence}
		if b.capSeen[c.ID] == key {
			continue
		}
		b.capSeen[c.ID] = key
		sig := c.Signals
		if sig == nil || !c.VLLM.OK {
			continue // missing measurements: the estimate holds
		}
		b.capacity.Observe(c.ID, c.LastSeen, capacity.Sample{
			RequestRate: sig.RequestRate, Running: sig.Running, Waiting: sig.QueueDepth,
			KVUsage: sig.KvCacheUsage, TTFTP95: sig.TtftP95Seconds,
		})
	}
	for _, id := range b.capacity.Cells() {
		if !live[id] {
			b.capacity.Forget(id)
			delete(b.capSeen, id)
		}
	}
	if d := b.capacity.Rejected() - rejected; d > 0 {
		b.metrics.capacityRejected.Add(float64(d))
	}
}
