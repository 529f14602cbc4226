package sim

import (
	"math"
	"os"
	"testing"
	"time"
)

// nimPoint is one published NVIDIA NIM figure: Llama-3.3-70B FP8 on 2×H100
// SXM (TP 2), 5000 input / 500 output tokens, closed loop at concurrency C.
type nimPoint struct {
	c         int
	ttft, itl time.Duration
}

var nimPublished = []nimPoint{
	{1, 407 * time.Millisecond, 18600 * time.Microsecond},
	{25, 689 * time.Millisecond, 38800 * time.Microsecond},
	{50, 835 * time.Millisecond, 59700 * time.Microsecond},
	{100, 8000 * time.Millisecond, 92900 * time.Microsecond},
}

func nimSpec(eff *Efficiency) PhysicsSpec {
	return PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama33_70BFP8, TP: 2, KVDtype: "fp8", Efficiency: eff}
}

// nimErrors runs the NIM configuration and returns ln(model/published) for
// each TTFT and ITL figure, in nimPublished order (TTFT, ITL, TTFT, ...).
func nimErrors(t testing.TB, eff *Efficiency, perLevel int) ([]float64, []SweepRow) {
	t.Helper()
	p, err := PhysicsProfile(nimSpec(eff))
	if err != nil {
		t.Fatal(err)
	}
	var errs []float64
	var rows []SweepRow
	for _, pt := range nimPublished {
		r, err := Sweep(p, SweepSpec{Concurrency: []int{pt.c}, PromptTokens: 5000, OutputTokens: 500, Requests: perLevel * pt.c})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r[0])
		errs = append(errs, math.Log(float64(r[0].TTFTP50)/float64(pt.ttft)), math.Log(float64(r[0].ITLMean)/float64(pt.itl)))
	}
	return errs, rows
}

// TestPhysicsFit is the fit behind FittedEfficiency (see its comment). It
// runs only with ISOBAR_FIT=1 and prints the best efficiencies found.
func TestPhysicsFit(t *testing.T) {
	if os.Getenv("ISOBAR_FIT") != "1" {
		t.Skip("set ISOBAR_FIT=1 to rerun the fit of FittedEfficiency")
	}
	type coord struct {
		name string
		grid []float64
		set  func(*Efficiency, float64)
	}
	span := func(lo, hi, step float64) []float64 {
		var g []float64
		for v := lo; v <= hi+1e-9; v += step {
			g = append(g, v)
		}
		return g
	}
	us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	coords := []coord{
		{"MemBW", span(0.55, 0.95, 0.05), func(e *Efficiency, v float64) { e.MemBW = v }},
		{"MFU", span(0.30, 0.80, 0.05), func(e *Efficiency, v float64) { e.MFU = v }},
		{"AllReduce", span(0.40, 0.90, 0.1), func(e *Efficiency, v float64) { e.AllReduce = v }},
		{"AllReduceLatency(us)", span(0, 30, 5), func(e *Efficiency, v float64) { e.AllReduceLatency = us(v) }},
		{"Step(us)", span(0, 6000, 500), func(e *Efficiency, v float64) { e.Step = us(v) }},
		{"Seq(us)", span(0, 400, 25), func(e *Efficiency, v float64) { e.Seq = us(v) }},
		{"Frontend(us)", span(0, 60000, 5000), func(e *Efficiency, v float64) { e.Frontend = us(v) }},
	}
	score := func(e Efficiency) (float64, float64) {
		errs, _ := nimErrors(t, &e, 0)
		var worst, ss float64
		for _, x := range errs {
			worst = math.Max(worst, math.Abs(x))
			ss += x * x
		}
		return worst, ss
	}
	better := func(w, s, bw, bs float64) bool { return w < bw-1e-9 || (math.Abs(w-bw) <= 1e-9 && s < bs) }
	starts := []Efficiency{
		{MemBW: 0.8, MFU: 0.55, AllReduce: 0.7, AllReduceLatency: 10 * time.Microsecond, Step: 2 * time.Millisecond, Seq: 100 * time.Microsecond, Frontend: 20 * time.Millisecond},
		{MemBW: 0.7, MFU: 0.5, AllReduce: 0.6, AllReduceLatency: 15 * time.Microsecond, Step: 3 * time.Millisecond, Seq: 200 * time.Microsecond, Frontend: 30 * time.Millisecond},
		{MemBW: 0.9, MFU: 0.65, AllReduce: 0.8, AllReduceLatency: 5 * time.Microsecond, Step: time.Millisecond, Seq: 50 * time.Microsecond, Frontend: 10 * time.Millisecond},
	}
	var best Efficiency
	bw, bs := math.Inf(1), math.Inf(1)
	for _, e := range starts {
		w, s := score(e)
		for improved := true; improved; {
			improved = false
			for _, c := range coords {
				for _, v := range c.grid {
					try := e
					c.set(&try, v)
					if tw, ts := score(try); better(tw, ts, w, s) {
						e, w, s, improved = try, tw, ts, true
					}
				}
			}
		}
		t.Logf("start -> %+v worst %.3f ss %.4f", e, w, s)
		if better(w, s, bw, bs) {
			best, bw, bs = e, w, s
		}
	}
	errs, rows := nimErrors(t, &best, 0)
	t.Logf("best %+v: worst |ln| %.3f", best, bw)
	for i, r := range rows {
		t.Logf("c=%d ttft %v (%+.0f%%) itl %v (%+.0f%%)", r.Concurrency, r.TTFTP50, 100*(math.Exp(errs[2*i])-1), r.ITLMean, 100*(math.Exp(errs[2*i+1])-1))
	}
}
