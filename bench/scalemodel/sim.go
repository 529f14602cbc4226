package scalemodel

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
)

// jobKind is what a simulated job is.
type jobKind int

const (
	kindHeartbeat jobKind = iota
	kindLiveCycle
	kindOverhead
	kindProbe // a full-push cycle timed back to back on controller 0
)

// job is one piece of CPU work in the processor-sharing server: it
// finishes when the server's attained service per job reaches finish.
type job struct {
	finish  float64
	arrival float64
	cost    float64
	kind    jobKind
}

type jobHeap []job

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(i, j int) bool { return h[i].finish < h[j].finish }
func (h jobHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *jobHeap) Push(x any)        { *h = append(*h, x.(job)) }
func (h *jobHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// psServer is an egalitarian processor-sharing server of c cores: each of
// the N active jobs is served at min(1, c/N) (one job uses at most one
// core, as one goroutine does). s is the service every job present since
// the start has attained; a job arriving at level s with cost w finishes
// at level s+w, so the next completion is the heap's least finish.
type psServer struct {
	cores  float64
	now, s float64
	active jobHeap
}

func (p *psServer) rate() float64 {
	n := float64(len(p.active))
	if n == 0 {
		return 0
	}
	return math.Min(1, p.cores/n)
}

// nextCompletion is the virtual time of the next completion (+Inf when
// idle).
func (p *psServer) nextCompletion() float64 {
	if len(p.active) == 0 {
		return math.Inf(1)
	}
	return p.now + (p.active[0].finish-p.s)/p.rate()
}

// advance moves the clock to t (no completion before it).
func (p *psServer) advance(t float64) {
	p.s += p.rate() * (t - p.now)
	p.now = t
}

func (p *psServer) add(kind jobKind, cost float64) {
	heap.Push(&p.active, job{finish: p.s + cost, arrival: p.now, cost: cost, kind: kind})
}

// periodic is a set of sources each firing every period at its own seeded
// phase, in time order.
type periodic struct {
	phases []float64 // sorted, in [0, period)
	period float64
	k      int // next firing
}

func newPeriodic(n int, period float64, rng *rand.Rand) *periodic {
	ph := make([]float64, n)
	for i := range ph {
		ph[i] = rng.Float64() * period
	}
	slices.Sort(ph)
	return &periodic{phases: ph, period: period}
}

// next is the time of the next firing (+Inf with no sources).
func (p *periodic) next() float64 {
	if len(p.phases) == 0 {
		return math.Inf(1)
	}
	n := len(p.phases)
	return p.phases[p.k%n] + float64(p.k/n)*p.period
}

// fire returns the firing's source index and moves on.
func (p *periodic) fire() int {
	i := p.k % len(p.phases)
	p.k++
	return i
}

// lognormal draws median·exp(σZ).
func lognormal(rng *rand.Rand, median, sigma float64) float64 {
	if sigma <= 0 {
		return median
	}
	return median * math.Exp(sigma*rng.NormFloat64())
}
