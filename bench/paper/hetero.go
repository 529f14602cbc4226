package paper

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/sim"
)

// Stages from the published first campaign: a heterogeneous fleet, a
// homogeneous six-GPU fleet, and a fleet with throttled GPUs.
const (
	StageHetero       = "hetero"
	StageHomogeneous6 = "homogeneous6"
	StageThrottled    = "throttled"
)

// heteroRPS and homogeneousRPS are the published campaign's loads.
const heteroRPS = 12

var homogeneousRPS = []float64{12, 20}

// physicsCells returns n cells of the ground's model on gpu, all in the
// nearest site, or nil when the ground is not a physics one.
func (r *runner) physicsCells(gpu string, n int) ([]cellSpec, error) {
	if r.cfg.Physics == nil {
		return nil, nil
	}
	spec := *r.cfg.Physics
	spec.GPU = gpu
	p, err := sim.PhysicsProfile(spec)
	if err != nil {
		return nil, err
	}
	out := make([]cellSpec, n)
	for i := range out {
		out[i] = cellSpec{site: 0, profile: p}
	}
	return out, nil
}

// hetero: 2×h200-sxm, 2×h100-sxm and 2×h100-sxm whose max_model_len is
// 1024, in the nearest site, under baseline_mixed at 12 RPS, and the
// highest sustainable rate by bisection. E2E P50 and P99 are over every
// request in the measured window, a failed one counting as a miss (no
// figure when the percentile falls on one: rr and lr send long prompts to
// the 1024-token cells, which refuse them), and again over the answered
// requests only (_served). Every cell declares its
// max_model_len (vLLM's /v1/models), so isobar routes by it: the data
// plane sends a request only to cells that hold it (the context-class
// clusters). For the isobar policies it also reports the mean pushed
// weight of the constrained cells in the model's main cluster (requests of
// unknown size) over that of the others (published: 1 : 134). Physics
// grounds only.
func (r *runner) hetero(ctx context.Context) error {
	h200, err := r.physicsCells("h200-sxm", 2)
	if err != nil || h200 == nil {
		return err
	}
	h100, err := r.physicsCells("h100-sxm", 4)
	if err != nil {
		return err
	}
	cells := append(h200, h100...)
	mml := []int{0, 0, 0, 0, 1024, 1024}
	constrained := func(c int) bool { return mml[c] > 0 }
	seed := r.seed(StageHetero, 0)
	c := class("baseline_mixed")
	pl := r.plan
	w := workload{mix: []mixPart{{c, 1}}, rps: heteroRPS, duration: pl.sloWarm + pl.sloDur + pl.sloCool, seed: seed}
	reqs := w.generate(r.cfg.Profile)
	for _, p := range stagePolicies(StageHetero) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageHetero, p, digest(reqs))
		var wc, wo float64
		var nc, no int
		res, err := r.trialSpec(runSpec{policy: p, requests: reqs, until: w.duration + drain, seed: seed, maxModelLen: mml, cells: cells, declareCapability: true,
			onTick: func(now time.Duration, sc []cellScore) {
				if now < pl.sloWarm {
					return
				}
				for i, s := range sc {
					if constrained(i) {
						wc, nc = wc+float64(s.weight), nc+1
					} else {
						wo, no = wo+float64(s.weight), no+1
					}
				}
			}})
		if err != nil {
			return err
		}
		st := summarise(res.requests, arrivedIn(pl.sloWarm, pl.sloWarm+pl.sloDur))
		rate, err := r.bisect(ctx, runSpec{policy: p, seed: seed, maxModelLen: mml, cells: cells, declareCapability: true}, c)
		if err != nil {
			return err
		}
		// E2E over every request, a failed one counting as a miss (nil
		// when the percentile falls on one), and over the answered ones.
		allMS := func(q float64) *float64 {
			if d, ok := overAll(st.e2e, st.n, q); ok {
				return ms(d)
			}
			return nil
		}
		f := Figures{
			"requests": num(float64(st.n)), "success": num(st.success),
			"e2e_p50_ms": allMS(0.5), "e2e_p99_ms": allMS(0.99),
			"e2e_p50_served_ms": ms(quantile.Of(st.e2e, 0.5)), "e2e_p99_served_ms": ms(quantile.Of(st.e2e, 0.99)),
			"ttft_p95_ms": ms(st.ttftP95), "sustainable_rps": num(rate), "constrained_weight_ratio": nil,
		}
		if p.isobar() && no > 0 && nc > 0 && wo > 0 {
			f["constrained_weight_ratio"] = num((wc / float64(nc)) / (wo / float64(no)))
		}
		r.set(StageHetero, p, f)
		r.progress(StageHetero, "%s: E2E P50 %.0f ms P99 %.0f ms, sustainable %.2f RPS", p,
			float64(quantile.Of(st.e2e, 0.5))/1e6, float64(quantile.Of(st.e2e, 0.99))/1e6, rate)
	}
	return nil
}

// homogeneous6: 6×h100-sxm in the nearest site under baseline_mixed at 12
// and 20 RPS. Physics grounds only.
func (r *runner) homogeneous6(ctx context.Context) error {
	cells, err := r.physicsCells("h100-sxm", 6)
	if err != nil || cells == nil {
		return err
	}
	pl := r.plan
	c := class("baseline_mixed")
	for _, p := range stagePolicies(StageHomogeneous6) {
		f := Figures{}
		for k, rps := range homogeneousRPS {
			if err := ctx.Err(); err != nil {
				return err
			}
			seed := r.seed(StageHomogeneous6, k)
			w := workload{mix: []mixPart{{c, 1}}, rps: rps, duration: pl.sloWarm + pl.sloDur + pl.sloCool, seed: seed}
			reqs := w.generate(r.cfg.Profile)
			r.digestOf(StageHomogeneous6, p, digest(reqs))
			res, err := r.trialSpec(runSpec{policy: p, requests: reqs, until: w.duration + drain, seed: seed, cells: cells})
			if err != nil {
				return err
			}
			st := summarise(res.requests, arrivedIn(pl.sloWarm, pl.sloWarm+pl.sloDur))
			at := "_at_" + fmtRate(rps)
			f["success"+at] = num(st.success)
			f["ttft_p95_ms"+at] = ms(st.ttftP95)
			f["e2e_p50_ms"+at] = ms(quantile.Of(st.e2e, 0.5))
			f["e2e_p99_ms"+at] = ms(quantile.Of(st.e2e, 0.99))
		}
		r.set(StageHomogeneous6, p, f)
		r.progress(StageHomogeneous6, "%s: E2E P99 %.0f ms at 12 RPS", p, *f["e2e_p99_ms_at_12rps"])
	}
	return nil
}

func fmtRate(rps float64) string { return strconv.FormatFloat(rps, 'f', -1, 64) + "rps" }

// throttled: the ground's fleet with one cell per site (cells 0, 3, 6 of
// the paper topology) at half clock from the start (severity-1 thermal
// throttling, hardware signals and slowdown together); the highest rate
// holding baseline_mixed's SLO, by bisection.
func (r *runner) throttled(ctx context.Context) error {
	var faults []fault
	for s := range r.cfg.Topology.Sites {
		faults = append(faults, fault{at: 0, kind: faultThrottle, cell: s * r.cfg.Topology.CellsPerSite, value: 1})
	}
	seed := r.seed(StageThrottled, 0)
	c := class("baseline_mixed")
	rates := map[Policy]float64{}
	pols := stagePolicies(StageThrottled)
	for _, p := range pols {
		rate, err := r.bisect(ctx, runSpec{policy: p, seed: seed, faults: faults}, c)
		if err != nil {
			return err
		}
		r.digestOf(StageThrottled, p, fmt.Sprintf("%s/%d", c.Name, seed))
		rates[p] = rate
		r.progress(StageThrottled, "%s: %.2f RPS", p, rate)
	}
	for _, p := range pols {
		f := Figures{"sustainable_rps": num(rates[p]), "throttled_cells": num(float64(len(faults)))}
		if rates[RR] > 0 && p != RR {
			f["vs_rr"] = num(rates[p] / rates[RR])
		}
		if rates[LR] > 0 && p != LR {
			f["vs_lr"] = num(rates[p] / rates[LR])
		}
		if rates[Oracle] > 0 {
			f["oracle_fraction"] = num(rates[p] / rates[Oracle])
		}
		r.set(StageThrottled, p, f)
	}
	return nil
}
