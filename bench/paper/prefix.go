package paper

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/gateway/prefix"
)

// StagePrefix is the prefix-cache stage: every engine runs vLLM's
// automatic prefix caching (sim.Batcher.AddBlocks), and the policies that
// route by prefix are compared with those that do not.
const StagePrefix = "prefix_affinity"

// The prefix-aware policies (prefix stage only).
const (
	// IsobarAffinity is Isobar with prefix affinity, as isobar gateway
	// --lb isobar runs it: the ingress keeps, per cell, the block hashes
	// of the prompts it sent there (gateway/prefix, bounded by the cell's
	// KV capacity in blocks), counts the expected cached tokens as saved
	// prefill in the expected TTFT, and among the cells within the
	// affinity band of the best takes the longest expected cached prefix
	// (gateway/placement).
	IsobarAffinity Policy = "isobar-affinity"
	// PrefixHash is a naive prefix router: a hash of the prompt's first
	// blocks (prefixHashBlocks) on a consistent-hash ring (ringPoints
	// points per cell), walking on past cells the health checks or outlier
	// detection took out or the request already tried. It ignores load.
	PrefixHash Policy = "prefix-hash"
	// PrecisePrefix is IsobarAffinity with the exact cache: it reads every
	// engine's prefix cache at the instant of the pick
	// (sim.Batcher.CachedPrefixTokens), as llm-d's precise prefix-cache
	// scorer does from the engines' KV events, instead of the ingress's
	// approximate index.
	PrecisePrefix Policy = "precise-prefix"
)

// prefixHashBlocks is how many leading blocks the naive router hashes:
// 8 blocks, 128 tokens — a system prompt's, a document's or a
// conversation's first turn's opening.
const prefixHashBlocks = 8

// ringPoints is the points per cell on PrefixHash's ring.
const ringPoints = 100

// affinity reports whether the policy uses the affinity band.
func (p Policy) affinity() bool { return p == IsobarAffinity || p == PrecisePrefix }

// ring is PrefixHash's consistent-hash ring: points sorted by hash.
type ring struct {
	hash []uint64
	cell []int
}

func newRing(cells int) ring {
	var r ring
	type pt struct {
		h uint64
		c int
	}
	var pts []pt
	for c := range cells {
		for k := range ringPoints {
			pts = append(pts, pt{mix64(uint64(c)<<32 | uint64(k)), c})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return a.c - b.c
	})
	for _, p := range pts {
		r.hash, r.cell = append(r.hash, p.h), append(r.cell, p.c)
	}
	return r
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// pickHash is PrefixHash: the first cell clockwise from the hash of the
// prompt's first blocks (a prompt without a full block hashes its
// request index) that is up, not ejected, not tried, and holds the
// prompt.
func (f *fleet) pickHash(r *request, i int) int {
	key := mix64(uint64(i) ^ 0xa5a5)
	if len(r.blocks) > 0 {
		key = mix64(r.blocks[min(len(r.blocks), prefixHashBlocks)-1])
	}
	ok := func(c int) bool {
		e := f.cells[c]
		return !e.hcDown && e.ejectUntil <= f.now && !slices.Contains(r.tried, c) &&
			(e.maxModelLen == 0 || r.prompt+r.out <= e.maxModelLen)
	}
	n := len(f.ring.hash)
	start := sort.Search(n, func(k int) bool { return f.ring.hash[k] >= key })
	for k := range n {
		if c := f.ring.cell[(start+k)%n]; ok(c) {
			return c
		}
	}
	return -1
}

// cachedTokens is what the policy expects cell c to hold of request r's
// prompt: the ingress's index (isobar-affinity), the engine's cache
// (precise-prefix), or nothing.
func (f *fleet) cachedTokens(c int, r *request) int64 {
	switch f.spec.policy {
	case IsobarAffinity:
		return int64(f.prefixIdx.Match(c, r.blocks) * f.cells[c].prof.BlockSize)
	case PrecisePrefix:
		return int64(f.cells[c].b.CachedPrefixTokens(r.prompt, r.blocks))
	}
	return 0
}

// sent notes request r's attempt to cell c: the ingress's index records
// its blocks, and the prompt tokens it expects c to prefill (its
// pending work) are the uncached ones.
func (f *fleet) sent(c int, r *request) {
	r.work = r.prompt
	if !f.spec.policy.affinity() {
		return
	}
	r.work = int(placement.UncachedTokens(int64(r.prompt), f.cachedTokens(c, r)))
	if f.prefixIdx != nil {
		e := f.cells[c]
		f.prefixIdx.Record(c, r.blocks, e.prof.KVCacheTokens/e.prof.BlockSize)
	}
}

func newPrefixIndex() *prefix.Index[int] {
	x, err := prefix.New[int](prefix.DefaultConfig())
	if err != nil {
		panic(err) // the defaults are valid
	}
	return x
}

// prefixClasses are the prefix stage's classes: the shared-prefix ones and
// the prefix-free ones whose SLO some rate can hold (rapid_shift,
// long_context and very_long hold it at no rate on any ground: their idle
// TTFT floor is above the SLO).
func prefixClasses() []load.Class {
	cs := []load.Class{class("multiturn"), class("rag_multidoc")}
	cs = append(cs, load.PrefixClasses()...)
	for _, n := range []string{"baseline_mixed", "code_heavy", "adversarial_spike"} {
		cs = append(cs, class(n))
	}
	return cs
}

// prefixAffinity bisects each policy's sustainable rate on every prefix
// class with prefix caching on, reports each policy's prefix-cache hit
// rate there (engine counters, over the run at the sustainable rate),
// and, on rag_multidoc (Zipf 1.1 documents) at three quarters of
// isobar-affinity's sustainable rate, each policy's per-cell load spread
// (the busiest cell's requests over the mean) and TTFT P99: the hot-cell
// pile-up of pure hashing.
func (r *runner) prefixAffinity(ctx context.Context) error {
	pl := r.plan
	classes := prefixClasses()
	only := pl.prefixClasses
	if len(r.opt.Classes) > 0 {
		only = r.opt.Classes
	}
	if len(only) > 0 {
		classes = slices.DeleteFunc(classes, func(c load.Class) bool { return !slices.Contains(only, c.Name) })
	}
	pols := stagePolicies(StagePrefix)
	figs := map[Policy]Figures{}
	rate := map[Policy]map[string]float64{}
	for _, p := range pols {
		figs[p], rate[p] = Figures{}, map[string]float64{}
	}
	if err := r.prefixRates(ctx, classes, pols, figs, rate); err != nil {
		return err
	}
	prefixRatios(classes, pols, figs, rate)
	if err := r.prefixPileup(pols, figs, rate); err != nil {
		return err
	}
	for _, p := range pols {
		r.set(StagePrefix, p, figs[p])
	}
	return nil
}

// prefixRates bisects each class's sustainable rate under each policy
// into rate, and records it, the prefix hit rate and the TTFT P95 there
// in figs.
func (r *runner) prefixRates(ctx context.Context, classes []load.Class, pols []Policy, figs map[Policy]Figures, rate map[Policy]map[string]float64) error {
	for ci, c := range classes {
		seed := r.seed(StagePrefix, ci)
		for _, p := range pols {
			spec := runSpec{policy: p, seed: seed, prefixCache: true}
			lo, err := r.bisect(ctx, spec, c)
			if err != nil {
				return err
			}
			rate[p][c.Name] = lo
			r.digestOf(StagePrefix, p, fmt.Sprintf("%s/%d", c.Name, seed))
			figs[p][c.Name+"_sustainable_rps"] = num(lo)
			// The hit rate at the sustainable rate (or the lowest step).
			at := max(lo, r.cfg.SLOHigh/float64(int(1)<<r.plan.sloIters))
			_, st, res, err := r.sustainableRun(spec, c, at)
			if err != nil {
				return err
			}
			figs[p][c.Name+"_prefix_hit_rate"] = hitRate(res)
			figs[p][c.Name+"_ttft_p95_ms"] = ms(st.ttftP95)
			r.progress(StagePrefix, "%s %s: %.2f RPS, prefix hit rate %.3f", p, c.Name, lo, deref(hitRate(res)))
		}
	}
	return nil
}

// prefixRatios records each policy's sustainable rate against rr's,
// isobar's, precise-prefix's and the oracle's.
func prefixRatios(classes []load.Class, pols []Policy, figs map[Policy]Figures, rate map[Policy]map[string]float64) {
	for _, p := range pols {
		f := figs[p]
		for _, c := range classes {
			v := rate[p][c.Name]
			if b := rate[RR][c.Name]; p != RR && b > 0 {
				f[c.Name+"_vs_rr"] = num(v / b)
			}
			if b := rate[Isobar][c.Name]; p != Isobar && b > 0 {
				f[c.Name+"_vs_isobar"] = num(v / b)
			}
			if b := rate[PrecisePrefix][c.Name]; p != PrecisePrefix && b > 0 {
				f[c.Name+"_vs_precise"] = num(v / b)
			}
			if b := rate[Oracle][c.Name]; b > 0 {
				f[c.Name+"_oracle_fraction"] = num(v / b)
			}
		}
	}
}

// prefixPileup is the pile-up: rag_multidoc, every policy at one rate,
// three quarters of isobar-affinity's sustainable rate at this seed (a
// load the fleet holds with room when it is spread).
func (r *runner) prefixPileup(pols []Policy, figs map[Policy]Figures, rate map[Policy]map[string]float64) error {
	pl := r.plan
	if top := rate[IsobarAffinity]["rag_multidoc"]; top > 0 {
		c := class("rag_multidoc")
		seed := r.seed(StagePrefix, 1000)
		at := 0.75 * top
		for _, p := range pols {
			_, st, res, err := r.sustainableRun(runSpec{policy: p, seed: seed, prefixCache: true}, c, at)
			if err != nil {
				return err
			}
			counts := make([]float64, r.cfg.Topology.Cells())
			for _, q := range res.requests {
				if q.arrive >= pl.sloWarm && q.arrive < pl.sloWarm+pl.sloDur && q.cell >= 0 {
					counts[q.cell]++
				}
			}
			if m := mean(counts); m > 0 {
				figs[p]["pileup_max_over_mean"] = num(slices.Max(counts) / m)
			}
			work := make([]float64, len(res.cellPrefill))
			for i, w := range res.cellPrefill {
				work[i] = float64(w)
			}
			if m := mean(work); m > 0 {
				figs[p]["pileup_prefill_max_over_mean"] = num(slices.Max(work) / m)
			}
			hot := time.Duration(0)
			for c := range counts {
				cs := summarise(res.requests, func(q *request) bool {
					return q.cell == c && q.arrive >= pl.sloWarm && q.arrive < pl.sloWarm+pl.sloDur
				})
				hot = max(hot, cs.ttftP95)
			}
			figs[p]["pileup_hottest_cell_ttft_p95_ms"] = ms(hot)
			figs[p]["pileup_ttft_p99_ms"] = ms(st.ttftP99)
			figs[p]["pileup_success"] = num(st.success)
			figs[p]["pileup_rps"] = num(at)
			r.progress(StagePrefix, "%s rag_multidoc at %.2f RPS: busiest cell %.2f× the mean requests, %.2f× the mean prefill; hottest cell's TTFT P95 %.0f ms; TTFT P99 %.0f ms, success %.4f",
				p, at, deref(figs[p]["pileup_max_over_mean"]), deref(figs[p]["pileup_prefill_max_over_mean"]), float64(hot)/1e6, float64(st.ttftP99)/1e6, st.success)
		}
	}
	return nil
}

func deref(x *float64) float64 {
	if x == nil {
		return math.NaN()
	}
	return *x
}

// hitRate is the engines' prefix-cache hits over queries (tokens), nil
// when nothing was looked up.
func hitRate(res runResult) *float64 {
	if res.prefixQueries == 0 {
		return nil
	}
	return num(float64(res.prefixHits) / float64(res.prefixQueries))
}

// sustainableRun is sustainableIn that also returns the run.
func (r *runner) sustainableRun(spec runSpec, c load.Class, rps float64) (bool, reqStats, runResult, error) {
	pl := r.plan
	w := workload{mix: []mixPart{{c, 1}}, rps: rps, duration: pl.sloWarm + pl.sloDur + pl.sloCool, seed: spec.seed}
	spec.requests, spec.until = w.generate(r.cfg.Profile), w.duration+drain
	res, err := r.trialSpec(spec)
	if err != nil {
		return false, reqStats{}, runResult{}, err
	}
	st := summarise(res.requests, arrivedIn(pl.sloWarm, pl.sloWarm+pl.sloDur))
	return st.meetsSLO(c.SLO), st, res, nil
}
