package paper

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/sim"
)

// Policy is how the ingress spreads requests over the cells.
type Policy string

// The policies of the evaluation.
const (
	// RR is Envoy's ROUND_ROBIN with active health checks: the stock
	// setup the published evaluation compared against.
	RR Policy = "rr"
	// LR is Envoy's LEAST_REQUEST (power of two choices over the
	// ingress's requests in flight) with active health checks.
	LR Policy = "lr"
	// Isobar is isobar's regional control loop: every heartbeat the real
	// scorer (regional/score) turns each cell's ten signals into a
	// pressure and the real projector (regional/projection) into weights,
	// which reach the ingress as isobar's pushed cluster: weighted
	// least-request, retries on connect failure on another host and
	// ejection after one local-origin failure.
	Isobar Policy = "isobar"
	// IsobarGPUOnly is Isobar with the RTT and jitter signals weighted 0.
	IsobarGPUOnly Policy = "isobar-gpu-only"
	// IsobarCapability is Isobar with capability discovery: requests go
	// only to cells whose max_model_len holds them (the context-class
	// clusters).
	IsobarCapability Policy = "isobar-capability"
)

// Policies lists every policy.
func Policies() []Policy { return []Policy{RR, LR, Isobar, IsobarGPUOnly, IsobarCapability} }

// ParsePolicy returns the named policy.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, 0, 5)
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return "", fmt.Errorf("paper: unknown policy %q: want one of %s", s, strings.Join(names, ", "))
}

func (p Policy) isobar() bool        { return strings.HasPrefix(string(p), "isobar") }
func (p Policy) healthChecked() bool { return !p.isobar() }

func (p Policy) scoreConfig() score.Config {
	c := score.DefaultConfig()
	if p == IsobarGPUOnly {
		c.Weights[score.RTT], c.Weights[score.Jitter] = 0, 0
	}
	return c
}

// pick chooses the cell for request r's next attempt, or -1.
func (f *fleet) pick(r *request) int {
	switch f.spec.policy {
	case RR:
		return f.pickRR()
	case LR:
		return f.pickLR()
	default:
		return f.pickIsobar(r)
	}
}

// healthyHC returns the cells the active health checks pass, or every cell
// in Envoy's panic mode (fewer than half healthy).
func (f *fleet) healthyHC() []int {
	out := make([]int, 0, len(f.cells))
	for i, e := range f.cells {
		if !e.hcDown {
			out = append(out, i)
		}
	}
	if 2*len(out) < len(f.cells) {
		out = out[:0]
		for i := range f.cells {
			out = append(out, i)
		}
	}
	return out
}

func (f *fleet) pickRR() int {
	n := len(f.cells)
	ok := f.healthyHC()
	for k := range n {
		c := (f.rr + k) % n
		if slices.Contains(ok, c) {
			f.rr = c + 1
			return c
		}
	}
	return -1
}

func (f *fleet) pickLR() int {
	return f.p2c(f.healthyHC())
}

// p2c is Envoy's least-request with two choices.
func (f *fleet) p2c(cands []int) int {
	switch len(cands) {
	case 0:
		return -1
	case 1:
		return cands[0]
	}
	a, b := cands[f.lb.IntN(len(cands))], cands[f.lb.IntN(len(cands))]
	if f.cells[b].inflight < f.cells[a].inflight {
		return b
	}
	return a
}

// pickIsobar follows isobar's pushed cluster: the endpoints with a
// weight, not ejected, not already tried by this request (the retry host
// predicate), fitting the prompt with capability discovery; weighted
// least-request over them (weight / (active+1)), or two choices when the
// weights are equal. Constraints are relaxed in that order when nothing
// is left.
func (f *fleet) pickIsobar(r *request) int {
	capable := func(c int) bool {
		e := f.cells[c]
		return f.spec.policy != IsobarCapability || e.maxModelLen == 0 || r.prompt+r.out <= e.maxModelLen
	}
	var cands []int
	for _, relax := range []int{0, 1, 2} {
		cands = cands[:0]
		for i, e := range f.cells {
			if e.weight == 0 || !capable(i) {
				continue
			}
			if relax < 2 && e.ejectUntil > f.now {
				continue
			}
			if relax < 1 && slices.Contains(r.tried, i) {
				continue
			}
			cands = append(cands, i)
		}
		if len(cands) > 0 {
			break
		}
	}
	if len(cands) == 0 {
		return -1
	}
	equal := true
	for _, c := range cands {
		equal = equal && f.cells[c].weight == f.cells[cands[0]].weight
	}
	if equal {
		return f.p2c(cands)
	}
	var sum float64
	for _, c := range cands {
		sum += float64(f.cells[c].weight) / float64(f.cells[c].inflight+1)
	}
	x := f.lb.Float64() * sum
	for _, c := range cands {
		if x -= float64(f.cells[c].weight) / float64(f.cells[c].inflight+1); x < 0 {
			return c
		}
	}
	return cands[len(cands)-1]
}

// tick is one control-plane pass: every cellagent's heartbeat (its
// scrape of the engine and the DCGM exporter over the signal window), the
// regional controller's RTT probe, scoring and — for the isobar policies —
// projection and the push to the ingress. The baselines get the same
// scoring as monitoring only (for the lead-time alert); their routing
// ignores it.
func (f *fleet) tick() {
	start := time.Now() // wall time, for the routing-update cost only
	f.advanceClock()
	scores := f.tickBuf[:0]
	pcells := f.pcells[:0]
	for i, e := range f.cells {
		e.rtt.Add(f.oneWay(e.site) + f.oneWay(e.site))
		in, w := f.input(e)
		res := f.scorer.Score(in)
		state := lifecycle.Ready
		if e.detected {
			state = lifecycle.Failed
		}
		pc := projection.Cell{ID: e.id, State: state, Pressure: res.Pressure}
		if e.alive && w.requests > 0 {
			pc.ErrorRate, pc.ErrorRequests, pc.ErrorOK = w.errRate, float64(w.requests), true
		}
		pcells = append(pcells, pc)
		if !e.dcgmUp && res.Fallback && f.dcgmAt[i] >= 0 && f.res.fallbackAt[i] < 0 {
			f.res.fallbackAt[i] = f.now
		}
		scores = append(scores, cellScore{res: res, weight: e.weight, ttftP95: w.ttftP95, windowReq: w.requests, hwAlert: hardwareAlert(res)})
	}
	if f.spec.policy.isobar() {
		d := f.proj.Project(f.base.Add(f.now), pcells)
		if d.Push {
			snap := weightSnap{w: make([]uint32, len(d.Weights))}
			for i, w := range d.Weights {
				snap.w[i] = w.Published
			}
			k := f.nextSnap
			f.nextSnap++
			f.pendingWeights[k] = snap
			f.push(f.now+f.cfg.DataPlane.PushDelay, evWeights, k, 0, 0)
		}
		f.res.updateCost = append(f.res.updateCost, time.Since(start))
	}
	f.tickBuf, f.pcells = scores, pcells
	if f.spec.onTick != nil {
		f.spec.onTick(f.now, scores)
	}
}

// Alert thresholds on the hardware signals (normalised scores): the
// thermal signal at half scale (82.5 °C, or any throttle bit), or DRAM
// activity at 0.95. Fixed before any comparison; the calibration run
// reports how often they fire without a fault (false_alerts).
const (
	alertThermal = 0.5
	alertDRAM    = 0.95
)

func hardwareAlert(r score.Result) bool {
	return (r.Present[score.Thermal] && r.Normalized[score.Thermal] >= alertThermal) ||
		(r.Present[score.DRAMActive] && r.Normalized[score.DRAMActive] >= alertDRAM)
}

type window struct {
	requests int
	errRate  float64
	ttftP95  time.Duration
}

// input is what cell e's heartbeat carries, mapped as the regional
// registry maps it (regional.scoreInput): application signals while the
// engine answers, hardware ones while the DCGM exporter does, the probe's
// RTT and jitter, and the data plane's error rate when it is higher.
func (f *fleet) input(e *engine) (score.Input, window) {
	from := f.now - f.cfg.DataPlane.Window
	e.win = pruneWin(e.win, from)
	e.dpWin = pruneWin(e.dpWin, from)
	var w window
	var in score.Input
	if e.alive {
		var ttfts []time.Duration
		errs := 0
		for _, ev := range e.win {
			w.requests++
			if ev.err {
				errs++
			}
			if ev.ttft >= 0 {
				ttfts = append(ttfts, ev.ttft)
			}
		}
		st := e.b.Stats()
		in.QueueDepth, in.Running, in.KVCache = score.Some(float64(st.Waiting)), score.Some(float64(st.Running)), score.Some(st.KVUsage)
		if w.requests > 0 {
			w.errRate = float64(errs) / float64(w.requests)
			in.ErrorRate = score.Some(w.errRate)
		}
		if len(ttfts) > 0 {
			slices.Sort(ttfts)
			w.ttftP95 = sim.Percentile(ttfts, 0.95)
			in.TTFTP95 = score.Some(w.ttftP95.Seconds())
		}
	}
	if e.dcgmUp {
		g := e.gpu.GPUSample()
		in.GPUUtil = score.Some(g.UtilPct / 100)
		if t := g.FBUsedMiB + g.FBFreeMiB; t > 0 {
			in.VRAM = score.Some(g.FBUsedMiB / t)
		}
		in.SMActive, in.DRAMActive = score.Some(g.SMActive), score.Some(g.DRAMActive)
		in.TemperatureC = score.Some(g.GPUTempC)
		in.ThrottleReasons, in.ThrottleOK = g.ThrottleReasons, true
	}
	in.RTT, in.Jitter, in.RTTOK, in.JitterOK = e.rtt.RTT, e.rtt.Jitter, true, true
	if n := len(e.dpWin); n > 0 {
		errs := 0
		for _, ev := range e.dpWin {
			if ev.err {
				errs++
			}
		}
		if dp := float64(errs) / float64(n); !in.ErrorRate.OK || dp > in.ErrorRate.V {
			in.ErrorRate = score.Some(dp)
		}
	}
	return in, w
}

func pruneWin(w []winEv, from time.Duration) []winEv {
	k := 0
	for k < len(w) && w[k].at < from {
		k++
	}
	if k == 0 {
		return w
	}
	return append(w[:0], w[k:]...)
}
