package paper

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Stages of issue 25 (overload that protects what matters).
const (
	// StageOverloadPriority: the fleet at 150 % of its measured capacity,
	// 20 % critical / 50 % standard / 30 % sheddable, two tenants one of
	// which sends 5× the other.
	StageOverloadPriority = "overload_priority"
	// StageRetryStorm: one site's engines answer 503 to 30 % of requests
	// at 90 % load; the static retry budget against the dynamic one.
	StageRetryStorm = "retry_storm"
)

// The overload stage's demand: the share of each criticality
// (reqclass order: critical, standard, sheddable), the loud tenant's share
// of the requests (5× the quiet one's), the load over the fleet's
// capacity, and the load of its no-overload run.
var overloadMix = [reqclass.Count]float64{0.2, 0.5, 0.3}

const (
	loudShare      = 5.0 / 6
	overloadFactor = 1.5
	calmFactor     = 0.75
)

// The overload stage's two tenants.
const (
	tenantLoud  = 0
	tenantQuiet = 1
)

var tenantNames = [2]string{"loud", "quiet"}

// assignClasses draws each request's criticality and tenant from a source
// keyed by (seed, request index) of its own, so every policy, and the
// same workload at another rate, sees the same classes, and no other
// draw of the request moves.
func assignClasses(reqs []request, seed uint64) {
	for i := range reqs {
		r := keyed(seed, saltClass, uint64(i))
		x := r.Float64()
		reqs[i].crit = reqclass.Sheddable
		for _, c := range reqclass.All() {
			if x -= overloadMix[c]; x < 0 {
				reqs[i].crit = c
				break
			}
		}
		reqs[i].tenant = tenantQuiet
		if r.Float64() < loudShare {
			reqs[i].tenant = tenantLoud
		}
	}
}

// classDigest is a hash of the requests' criticalities and tenants, in
// order: with digest, what shows every policy ran the same draws.
func classDigest(rs []request) string {
	h := fnv.New64a()
	for _, r := range rs {
		h.Write([]byte{byte(r.crit), byte(r.tenant)})
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// fleetCapacity is the fleet's measured capacity at this seed: the
// oracle's sustainable baseline_mixed rate at the tier-2 SLO, the
// slo_throughput stage's figure. When that stage did not run (or not on
// baseline_mixed) the same bisection runs here, at the seed
// slo_throughput gives baseline_mixed when it runs every class.
func (r *runner) fleetCapacity(ctx context.Context) (float64, error) {
	const name = "baseline_mixed"
	if v, ok := r.sloRate[Oracle][name]; ok {
		return v, nil
	}
	ci := slices.IndexFunc(load.Classes(), func(c load.Class) bool { return c.Name == name })
	v, err := r.bisect(ctx, runSpec{policy: Oracle, seed: r.seed(StageSLOThroughput, ci)}, class(name))
	if err != nil {
		return 0, err
	}
	r.noteRate(Oracle, name, v)
	return v, nil
}

// noteRate records a sustainable rate measured at this seed.
func (r *runner) noteRate(p Policy, class string, v float64) {
	if r.sloRate[p] == nil {
		r.sloRate[p] = map[string]float64{}
	}
	r.sloRate[p][class] = v
}

// overloadSpec is the run of policy p on reqs in the overload stage: the
// isobar policies behind isobar gateway's per-endpoint in-flight cap,
// isobar with the gateway's flow control (isobar-nocrit: today's
// gateway, 429 when saturated).
func (r *runner) overloadSpec(p Policy, reqs []request, until time.Duration, seed uint64) runSpec {
	spec := runSpec{policy: p, requests: reqs, until: until, seed: seed}
	if p.isobar() {
		spec.inflightCap = r.cfg.DataPlane.MaxInflightPerEndpoint
		spec.flowControl = p == Isobar
		spec.batchCap = p == Isobar
	}
	return spec
}

// overloadPriority runs baseline_mixed at overloadFactor × the fleet's
// capacity with the criticality and tenant mix, and the same demand at
// calmFactor × capacity for the quiet tenant's no-overload figure.
func (r *runner) overloadPriority(ctx context.Context) error {
	capRPS, err := r.fleetCapacity(ctx)
	if err != nil {
		return err
	}
	pl := r.plan
	c := class("baseline_mixed")
	seed := r.seed(StageOverloadPriority, 0)
	gen := func(rps float64) []request {
		w := workload{mix: []mixPart{{c, 1}}, rps: rps, duration: pl.sloWarm + pl.sloDur, seed: seed}
		reqs := w.generate(r.cfg.Profile)
		assignClasses(reqs, seed)
		return reqs
	}
	over, calm := gen(overloadFactor*capRPS), gen(calmFactor*capRPS)
	until := pl.sloWarm + pl.sloDur + drain
	measured := arrivedIn(pl.sloWarm, pl.sloWarm+pl.sloDur)
	goodput := map[Policy]float64{}
	for _, p := range stagePolicies(StageOverloadPriority) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageOverloadPriority, p, digest(over)+classDigest(over)+digest(calm)+classDigest(calm))
		res, err := r.trialSpec(r.overloadSpec(p, over, until, seed))
		if err != nil {
			return err
		}
		calmRes, err := r.trialSpec(r.overloadSpec(p, calm, until, seed))
		if err != nil {
			return err
		}
		f := overloadFigures(res.requests, measured, c.SLO)
		quietCalm := summarise(calmRes.requests, func(q *request) bool { return measured(q) && q.tenant == tenantQuiet })
		f["capacity_rps"], f["offered_rps"] = num(capRPS), num(overloadFactor*capRPS)
		f["quiet_tenant_success_no_overload"] = num(quietCalm.success)
		if q := f["tenant_quiet_success"]; q != nil {
			f["quiet_tenant_success_reduction_vs_no_overload"] = num(quietCalm.success - *q)
		}
		goodput[p] = *f["goodput"]
		r.set(StageOverloadPriority, p, f)
		r.progress(StageOverloadPriority, "%s at %.1f RPS: critical success %.4f TTFT P95 %.0f ms, standard %.4f, sheddable %.4f, goodput %.4f",
			p, overloadFactor*capRPS, fig(f, "critical_success"), fig(f, "critical_ttft_p95_ms"), fig(f, "standard_success"),
			fig(f, "sheddable_success"), goodput[p])
	}
	if g, ok := goodput[IsobarNoCrit]; ok {
		r.figs[StageOverloadPriority][string(Isobar)]["goodput_reduction_vs_nocrit"] = num(g - goodput[Isobar])
	}
	return nil
}

// fig is a figure's value, NaN when null.
func fig(f Figures, k string) float64 {
	if v := f[k]; v != nil {
		return *v
	}
	return math.NaN()
}

// overloadFigures are the overload stage's figures of the requests keep
// selects: success, TTFT P95 (answered requests) and goodput (the share
// answered within slo) in all, by criticality and by tenant.
func overloadFigures(rs []request, keep func(*request) bool, slo time.Duration) Figures {
	f := Figures{"slo_ms": ms(slo)}
	add := func(prefix string, sel func(*request) bool) {
		st := summarise(rs, func(q *request) bool { return keep(q) && sel(q) })
		f[prefix+"requests"] = num(float64(st.n))
		f[prefix+"success"] = num(st.success)
		f[prefix+"ttft_p95_ms"] = ms(st.ttftP95)
		if st.ok == 0 {
			f[prefix+"ttft_p95_ms"] = nil
		}
		good, _ := slices.BinarySearch(st.ttft, slo+1)
		f[prefix+"goodput"] = num(float64(good) / float64(max(st.n, 1)))
		var waits []time.Duration
		for i := range rs {
			if q := &rs[i]; keep(q) && sel(q) && q.status == statusOK {
				waits = append(waits, q.wait)
			}
		}
		f[prefix+"queue_wait_p95_ms"] = nil
		if len(waits) > 0 {
			slices.Sort(waits)
			f[prefix+"queue_wait_p95_ms"] = ms(quantile.Sorted(waits, 0.95))
		}
	}
	add("", func(*request) bool { return true })
	queued, shed, n := 0, 0, 0
	for i := range rs {
		if q := &rs[i]; keep(q) {
			n++
			if q.queued {
				queued++
			}
			if q.status == statusShed {
				shed++
			}
		}
	}
	f["queued_share"], f["shed_429_share"] = num(float64(queued)/float64(max(n, 1))), num(float64(shed)/float64(max(n, 1)))
	for _, c := range reqclass.All() {
		add(c.String()+"_", func(q *request) bool { return q.crit == c })
	}
	for t, name := range tenantNames {
		add("tenant_"+name+"_", func(q *request) bool { return q.tenant == t })
		// Success by tenant and criticality: fairness within a band.
		for _, c := range reqclass.All() {
			st := summarise(rs, func(q *request) bool { return keep(q) && q.tenant == t && q.crit == c })
			f["tenant_"+name+"_"+c.String()+"_success"] = num(st.success)
		}
	}
	return f
}
