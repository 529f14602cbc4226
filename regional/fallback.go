package regional

import (
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/summary"
)

// peerSource reports the gossiped peer summaries and the RTT to each peer.
type peerSource interface {
	Summaries() map[string]gossip.PeerSummary
	RTT() map[string]time.Duration
}

var _ peerSource = (*gossip.Node)(nil)

// fallbackPlanner computes the route table this region uses while no
// leader's plan is in force: local-first routing with spill-over from the
// gossiped summaries, with the global optimiser's code, keeping only this
// region's row. Without fresh peers everything stays local.
//
// Residency: pinned requests never follow the unpinned routes. For each
// residency set that allows this region and some fresh peer, the table
// carries the same local-first solution restricted to the set's regions
// (ModelRoutes.Pinned, pinnedRoutes), so pinned demand spills only to
// allowed regions. Every other set is routed by the cycle's
// nearest-allowed rule (regional/cycle pinned.go) from the gossiped
// ingress addresses: the local cells when this region is allowed, else
// the allowed region nearest by gossip RTT, else nowhere (503). So a
// region on its fallback never sends a pinned request outside its set.
//
// Concurrency: it holds no mutable state; plan is safe from any goroutine
// as far as its peerSource is.
type fallbackPlanner struct {
	cfg    GlobalConfig
	region string
	peers  peerSource               // nil: no peers, everything local
	sets   func(string) []cycle.Set // residency sets per model; nil: none
}

func newFallbackPlanner(cfg syncConfig, d syncDeps) *fallbackPlanner {
	p := &fallbackPlanner{cfg: cfg.Global, region: cfg.Region, sets: residencySets(cfg.Residency)}
	if d.Gossip != nil {
		p.peers = d.Gossip
	}
	return p
}

// fallbackRegions is the set of regions a fallback plan spans: this one
// and its fresh, reachable peers, sorted, with their summaries.
type fallbackRegions struct {
	names   []string
	self    int
	sums    map[string]*isobarpb.RegionSummary
	rtt     map[string]time.Duration
	ingress map[string]string
}

// plan returns the fallback route table at now, self being this region's
// latest summary.
func (p *fallbackPlanner) plan(now time.Time, self *isobarpb.RegionSummary) *RouteTable {
	fr := p.regions(now, self)
	t := &RouteTable{Source: RoutesLocal, Models: map[string]ModelRoutes{}, Ingress: fr.ingress}
	if len(fr.names) > 1 {
		t.Source = RoutesFallback
	}
	mat := fr.rttMatrix()
	for _, m := range self.GetModels() {
		mr := p.modelRoutes(fr, mat, m.GetModel())
		mr.Pinned = p.pinnedRoutes(fr, mat, m.GetModel())
		t.Models[m.GetModel()] = mr
	}
	return t
}

// pinnedRoutes plans each residency set of model that allows this region
// and at least one fresh peer: the same local-first problem restricted to
// the regions the set allows, keeping this region's row, so pinned
// demand spills only to allowed regions. Sets that do not allow this
// region, or that no fresh peer shares, are left to the cycle's
// nearest-allowed rule (regional/cycle pinned.go). nil when none.
func (p *fallbackPlanner) pinnedRoutes(fr fallbackRegions, mat [][]float64, model string) map[string]PinnedRoutes {
	if p.sets == nil || len(fr.names) <= 1 {
		return nil
	}
	var out map[string]PinnedRoutes
	for _, s := range p.sets(model) {
		key := cycle.RegionsKey(s.Regions)
		if _, done := out[key]; done || !slices.Contains(s.Regions, p.region) {
			continue
		}
		sub, subMat := fr.restrict(mat, s.Regions)
		if len(sub.names) <= 1 {
			continue
		}
		mr := p.modelRoutes(sub, subMat, model)
		if out == nil {
			out = map[string]PinnedRoutes{}
		}
		out[key] = PinnedRoutes{Routes: mr.Routes, Shed: mr.Shed}
	}
	return out
}

// restrict is fr and its RTT matrix mat with only the regions allowed
// lists (this one must be among them).
func (fr fallbackRegions) restrict(mat [][]float64, allowed []string) (fallbackRegions, [][]float64) {
	var idx []int
	sub := fallbackRegions{sums: fr.sums, rtt: fr.rtt, ingress: fr.ingress}
	for i, r := range fr.names {
		if slices.Contains(allowed, r) {
			if i == fr.self {
				sub.self = len(idx)
			}
			idx = append(idx, i)
			sub.names = append(sub.names, r)
		}
	}
	subMat := make([][]float64, len(idx))
	for a, i := range idx {
		subMat[a] = make([]float64, len(idx))
		for b, j := range idx {
			subMat[a][b] = mat[i][j]
		}
	}
	return sub, subMat
}

// regions collects this region and the peers fresh at now and reachable
// from here.
func (p *fallbackPlanner) regions(now time.Time, self *isobarpb.RegionSummary) fallbackRegions {
	fr := fallbackRegions{
		names: []string{p.region}, sums: map[string]*isobarpb.RegionSummary{p.region: self}, ingress: map[string]string{},
	}
	var peers map[string]gossip.PeerSummary
	if p.peers != nil {
		peers, fr.rtt = p.peers.Summaries(), p.peers.RTT()
	}
	for r, ps := range peers {
		if r == p.region || !ps.Alive || now.Sub(ps.ReceivedAt) > p.cfg.FallbackSummaryTTL || ps.Summary == nil {
			continue
		}
		if _, ok := fr.rtt[r]; !ok {
			continue // unreachable from here
		}
		fr.names = append(fr.names, r)
		fr.sums[r] = ps.Summary
		if a := ps.Summary.GetIngressAddress(); a != "" && ingressAddress(a) == nil {
			fr.ingress[r] = a
		}
	}
	slices.Sort(fr.names)
	fr.self = slices.Index(fr.names, p.region)
	return fr
}

// rttMatrix is the RTT (ms) between the regions: this region's own
// measurements for its row, and for the pairs between peers what
// summary.RTTMatrix makes of their summaries (the same rule the global
// plans with: a pair either peer listed among its nearest, else the
// estimate from their coordinates); unknown pairs are +Inf.
func (fr fallbackRegions) rttMatrix() [][]float64 {
	list := make([]*isobarpb.RegionSummary, len(fr.names))
	for i, r := range fr.names {
		list[i] = fr.sums[r]
	}
	mat := summary.RTTMatrix(fr.names, list, nil)
	idx := map[string]int{}
	for i, r := range fr.names {
		idx[r] = i
	}
	for r, d := range fr.rtt {
		if j, ok := idx[r]; ok && j != fr.self {
			ms := float64(d) / float64(time.Millisecond)
			mat[fr.self][j], mat[j][fr.self] = ms, ms
		}
	}
	return mat
}

// modelRoutes solves the local-first problem for one model and keeps this
// region's row; alone, the region keeps all its traffic.
func (p *fallbackPlanner) modelRoutes(fr fallbackRegions, mat [][]float64, model string) ModelRoutes {
	n := len(fr.names)
	mr := ModelRoutes{Routes: map[string]float64{p.region: 1}}
	if n <= 1 {
		return mr
	}
	prob := optimize.Problem{
		Regions: make([]optimize.Region, n), RTTms: mat, Headroom: p.cfg.Headroom,
		Beta: p.cfg.Beta, K: p.cfg.K, ShedPenaltyMs: p.cfg.ShedPenaltyMs,
	}
	for i, r := range fr.names {
		reg := optimize.Region{Name: r, EngineLatencyMs: p.cfg.DefaultEngineLatencyMs}
		for _, pm := range fr.sums[r].GetModels() {
			if pm.GetModel() == model {
				reg.DemandRPS, reg.CapacityRPS = pm.GetDemandRps(), pm.GetCapacityRps()
				if pm.GetEngineLatencyMs() > 0 {
					reg.EngineLatencyMs = pm.GetEngineLatencyMs()
				}
			}
		}
		prob.Regions[i] = reg
	}
	pl, err := optimize.SolveLocalFirst(prob, p.cfg.LocalFill)
	if err != nil {
		return mr
	}
	mr = ModelRoutes{Routes: map[string]float64{}, Shed: pl.Shed[fr.self]}
	for j, f := range pl.Fractions[fr.self] {
		if f >= 1e-4 {
			mr.Routes[fr.names[j]] = f
		}
	}
	return mr
}

// gossipIngress is the ingress address of each live remote region whose
// gossiped summary names a valid one.
func gossipIngress(peers map[string]gossip.PeerSummary, self string) map[string]string {
	out := map[string]string{}
	for r, ps := range peers {
		if r == self || !ps.Alive || ps.Summary == nil {
			continue
		}
		if a := ps.Summary.GetIngressAddress(); a != "" && ingressAddress(a) == nil {
			out[r] = a
		}
	}
	return out
}
