package gateway

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Envoy's constants for priority and locality health.
const (
	overprovisioning = 1.4 // default overprovisioning_factor (140)
	panicThreshold   = 0.5 // default healthy_panic_threshold (50 %)
)

// hostRT is one endpoint of a cluster in a table.
type hostRT struct {
	ep     Endpoint
	st     *hostState
	label  string // metrics and report identity: the cell id, else the address
	remote bool   // in another region: requests carry the hop header
}

type localityRT struct {
	weight uint32
	hosts  []*hostRT
	equal  bool // every endpoint weight equal
}

type priorityRT struct {
	localities []*localityRT
	hosts      []*hostRT
}

// clusterRT is a cluster of a table: its policy, its endpoints grouped by
// priority and locality, and its shared runtime state.
type clusterRT struct {
	name       string
	policy     *ClusterPolicy
	st         *clusterState
	priorities []*priorityRT
	all        []*hostRT
}

// ejectedCount counts the cluster's hosts other than h that are ejected.
func (c *clusterRT) ejectedCount(h *hostState, nowNanos int64) (ejected, total int) {
	for _, x := range c.all {
		if x.st != h && x.st.ejected(nowNanos) {
			ejected++
		}
	}
	return ejected, len(c.all)
}

// pickResult says why no host was picked.
type pickResult uint8

const (
	pickOK        pickResult = iota
	pickNoHost               // no healthy endpoint (503)
	pickSaturated            // every candidate at the in-flight cap (429)
)

// picker chooses endpoints. It is stateless apart from the atomics in the
// host and cluster states, and safe for concurrent use.
type picker struct {
	mode  LBMode
	limit int64 // in-flight cap per endpoint
}

// candidates filters hosts: not in exclude, not ejected (unless allowEjected)
// and below the in-flight cap. saturated reports that some host was left out
// only for its cap.
func (p *picker) candidates(dst, hosts []*hostRT, exclude []*hostRT, now int64, allowEjected bool) (out []*hostRT, saturated bool) {
	out = dst[:0]
	for _, h := range hosts {
		if slices.Contains(exclude, h) || (!allowEjected && h.st.ejected(now)) {
			continue
		}
		if h.st.inflight.Load() >= p.limit {
			saturated = true
			continue
		}
		out = append(out, h)
	}
	return out, saturated
}

// pick chooses a host of c and takes one of its in-flight slots; the
// caller releases it. exclude lists hosts already tried (previous-hosts
// retry predicate); when nothing else is left they may be chosen again.
func (p *picker) pick(c *clusterRT, exclude []*hostRT, now int64) (*hostRT, pickResult) {
	if len(c.all) == 0 {
		return nil, pickNoHost
	}
	var buf [16]*hostRT
	saturated := false
	// A few rounds: a candidate may reach its cap between the filter and
	// the acquire.
	for range 4 {
		var h *hostRT
		var sat bool
		switch p.mode {
		case LBRoundRobin:
			h, sat = p.pickRoundRobin(c, exclude, now)
		case LBLeastRequest:
			h, sat = p.pickFlat(c, buf[:0], exclude, now, p.leastInflight)
		default:
			h, sat = p.pickXDS(c, buf[:0], exclude, now)
		}
		saturated = saturated || sat
		if h == nil {
			break
		}
		if h.st.acquire(p.limit) {
			return h, pickOK
		}
		saturated = true
	}
	if saturated {
		return nil, pickSaturated
	}
	return nil, pickNoHost
}

// pickFlat applies choose to the cluster's hosts ignoring priorities and
// localities: healthy ones first, then ejected ones (panic), then the
// excluded ones.
func (p *picker) pickFlat(c *clusterRT, buf []*hostRT, exclude []*hostRT, now int64, choose func([]*hostRT) *hostRT) (*hostRT, bool) {
	saturated := false
	for _, step := range []struct {
		exclude      []*hostRT
		allowEjected bool
	}{{exclude, false}, {exclude, true}, {nil, true}} {
		cands, sat := p.candidates(buf, c.all, step.exclude, now, step.allowEjected)
		saturated = saturated || sat
		if len(cands) > 0 {
			return choose(cands), saturated
		}
		if len(step.exclude) == 0 && step.allowEjected {
			break
		}
	}
	return nil, saturated
}

// pickRoundRobin rotates over the cluster's hosts, skipping those that are
// not candidates.
func (p *picker) pickRoundRobin(c *clusterRT, exclude []*hostRT, now int64) (*hostRT, bool) {
	n := uint64(len(c.all))
	start := c.st.rr.Add(1) - 1
	saturated := false
	for _, allowEjected := range []bool{false, true} {
		for _, ex := range [][]*hostRT{exclude, nil} {
			for i := range n {
				h := c.all[(start+i)%n]
				if slices.Contains(ex, h) || (!allowEjected && h.st.ejected(now)) {
					continue
				}
				if h.st.inflight.Load() >= p.limit {
					saturated = true
					continue
				}
				return h, saturated
			}
			if len(exclude) == 0 {
				break
			}
		}
	}
	return nil, saturated
}

// leastInflight returns the host with the fewest requests in flight, ties
// broken at random.
func (p *picker) leastInflight(hs []*hostRT) *hostRT {
	bestN, ties := int64(math.MaxInt64), 0
	for _, h := range hs {
		switch n := h.st.inflight.Load(); {
		case n < bestN:
			bestN, ties = n, 1
		case n == bestN:
			ties++
		}
	}
	k := rand.IntN(ties)
	for _, h := range hs {
		if h.st.inflight.Load() == bestN {
			if k == 0 {
				return h
			}
			k--
		}
	}
	// The counts moved between the passes: any candidate will do.
	return hs[rand.IntN(len(hs))]
}

// pickXDS follows the xDS: a priority by priority load, a locality by
// effective locality weight, then the cluster's LB policy within the
// locality. When the chosen locality has no candidate, it falls back to a
// flat choice over the cluster.
func (p *picker) pickXDS(c *clusterRT, buf []*hostRT, exclude []*hostRT, now int64) (*hostRT, bool) {
	pr, panicMode := choosePriority(c.priorities, now)
	var hosts []*hostRT
	equal := true
	if c.policy.LocalityWeighted {
		l := chooseLocality(pr.localities, now, panicMode)
		if l != nil {
			hosts, equal = l.hosts, l.equal
		}
	} else {
		hosts = pr.hosts
		for _, h := range hosts {
			equal = equal && h.ep.Weight == hosts[0].ep.Weight
		}
	}
	choose := func(cands []*hostRT) *hostRT { return p.byPolicy(c.policy, cands, equal) }
	if hosts != nil {
		cands, sat := p.candidates(buf, hosts, exclude, now, panicMode)
		if len(cands) > 0 {
			return choose(cands), sat
		}
	}
	return p.pickFlat(c, buf, exclude, now, func(cands []*hostRT) *hostRT {
		eq := true
		for _, h := range cands {
			eq = eq && h.ep.Weight == cands[0].ep.Weight
		}
		return p.byPolicy(c.policy, cands, eq)
	})
}

// byPolicy picks among candidates with the cluster's policy: Envoy's
// least-request (power of choice_count choices when the locality's weights
// are equal, otherwise weighted random over weight/(active+1)^bias), or
// weighted random (RANDOM: uniform).
func (p *picker) byPolicy(pol *ClusterPolicy, cands []*hostRT, equal bool) *hostRT {
	if len(cands) == 1 {
		return cands[0]
	}
	switch pol.LBPolicy {
	case "LEAST_REQUEST":
		if equal {
			var best *hostRT
			for range max(pol.ChoiceCount, 1) {
				h := cands[rand.IntN(len(cands))]
				if best == nil || h.st.inflight.Load() < best.st.inflight.Load() {
					best = h
				}
			}
			return best
		}
		return weightedRandom(cands, func(h *hostRT) float64 {
			w := float64(h.ep.Weight)
			a := float64(h.st.inflight.Load()) + 1
			switch pol.ActiveRequestBias {
			case 0:
				return w
			case 1:
				return w / a
			default:
				return w / math.Pow(a, pol.ActiveRequestBias)
			}
		})
	case "RANDOM":
		return cands[rand.IntN(len(cands))]
	default:
		return weightedRandom(cands, func(h *hostRT) float64 { return float64(h.ep.Weight) })
	}
}

func weightedRandom(hs []*hostRT, weight func(*hostRT) float64) *hostRT {
	var sum float64
	for _, h := range hs {
		sum += weight(h)
	}
	if !(sum > 0) {
		return hs[rand.IntN(len(hs))]
	}
	x := rand.Float64() * sum
	for _, h := range hs {
		if x -= weight(h); x < 0 {
			return h
		}
	}
	return hs[len(hs)-1]
}

func healthShare(hosts []*hostRT, now int64) float64 {
	if len(hosts) == 0 {
		return 0
	}
	healthy := 0
	for _, h := range hosts {
		if !h.st.ejected(now) {
			healthy++
		}
	}
	return float64(healthy) / float64(len(hosts))
}

// choosePriority draws a priority by Envoy's priority load: each level
// takes min(100 % - what higher levels took, overprovisioning × its
// healthy share), normalised when the levels together are not 100 %
// healthy. panicMode is set when the chosen level is below the panic
// threshold: its ejected hosts are then candidates too.
func choosePriority(ps []*priorityRT, now int64) (*priorityRT, bool) {
	if len(ps) == 1 {
		return ps[0], healthShare(ps[0].hosts, now) < panicThreshold
	}
	var loads [8]float64
	shares := make([]float64, len(ps))
	lv := loads[:0]
	left, total := 1.0, 0.0
	for i, p := range ps {
		shares[i] = healthShare(p.hosts, now)
		l := min(left, overprovisioning*shares[i])
		lv = append(lv, l)
		left -= l
		total += l
	}
	if total == 0 {
		return ps[0], true
	}
	x := rand.Float64() * total
	for i, l := range lv {
		if x -= l; x < 0 {
			return ps[i], shares[i] < panicThreshold
		}
	}
	i := len(ps) - 1
	return ps[i], shares[i] < panicThreshold
}

// chooseLocality draws a locality by effective weight: locality weight ×
// min(1, overprovisioning × healthy share) (the plain weight in panic
// mode). Nil when no locality has weight.
func chooseLocality(ls []*localityRT, now int64, panicMode bool) *localityRT {
	if len(ls) == 1 {
		if ls[0].weight == 0 {
			return nil
		}
		return ls[0]
	}
	var sum float64
	eff := make([]float64, len(ls))
	for i, l := range ls {
		w := float64(l.weight)
		if !panicMode {
			w *= min(1, overprovisioning*healthShare(l.hosts, now))
		}
		eff[i] = w
		sum += w
	}
	if sum == 0 {
		return nil
	}
	x := rand.Float64() * sum
	for i, w := range eff {
		if x -= w; x < 0 {
			return ls[i]
		}
	}
	return ls[len(ls)-1]
}
