package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Dist is a normal distribution of token counts, clamped to [Min, Max]
// (Min at least 1; Max 0 for no bound).
type Dist struct {
	Mean, StdDev float64
	Min, Max     int
}

// Sample draws one value.
func (d Dist) Sample(r *rand.Rand) int {
	v := int(math.Round(d.Mean + d.StdDev*r.NormFloat64()))
	v = max(v, d.Min, 1)
	if d.Max > 0 {
		v = min(v, d.Max)
	}
	return v
}

// Class is a workload class: the shape of the prompts, the outputs and
// the arrivals of one kind of traffic.
type Class struct {
	Name    string
	Summary string
	// Prompt tokens per request, and output tokens asked for.
	Prompt Dist
	Output int
	// Alt and ShiftEvery: the prompts alternate between Prompt/Output and
	// Alt/AltOutput every ShiftEvery (rapid_shift).
	Alt        *Dist
	AltOutput  int
	ShiftEvery time.Duration
	// BurstSize requests arrive at once every BurstEvery, on top of the
	// steady rate (adversarial_spike).
	BurstSize  int
	BurstEvery time.Duration
	// Turns > 1: conversations of Turns turns, turn k's prompt holding the
	// k turns so far (each a Prompt sample): the context grows (multiturn).
	Turns int
	// SLO is the tier-2 TTFT P95 objective of the published evaluation
	// for this class.
	SLO time.Duration
}

// Classes returns the eight workload classes of the evaluation (DESIGN §8),
// in order.
func Classes() []Class {
	return []Class{
		{Name: "baseline_mixed", Summary: "512±200 prompt tokens, 128 out",
			Prompt: Dist{Mean: 512, StdDev: 200}, Output: 128, SLO: 1500 * time.Millisecond},
		{Name: "rapid_shift", Summary: "alternates every 10 s between short chat (256±64, 64 out) and documents (4000±800, 128 out)",
			Prompt: Dist{Mean: 256, StdDev: 64}, Output: 64, Alt: &Dist{Mean: 4000, StdDev: 800}, AltOutput: 128,
			ShiftEvery: 10 * time.Second, SLO: 1500 * time.Millisecond},
		{Name: "code_heavy", Summary: "1024±512 prompt tokens, 192 out",
			Prompt: Dist{Mean: 1024, StdDev: 512}, Output: 192, SLO: 3 * time.Second},
		{Name: "adversarial_spike", Summary: "baseline_mixed at the rate plus 50-request bursts every 30 s",
			Prompt: Dist{Mean: 512, StdDev: 200}, Output: 128, BurstSize: 50, BurstEvery: 30 * time.Second, SLO: 3 * time.Second},
		{Name: "multiturn", Summary: "8-turn conversations of 256±64-token turns: the context grows to ~2048 tokens",
			Prompt: Dist{Mean: 256, StdDev: 64}, Output: 128, Turns: 8, SLO: 3500 * time.Millisecond},
		{Name: "rag_multidoc", Summary: "4000±800 prompt tokens, 128 out",
			Prompt: Dist{Mean: 4000, StdDev: 800}, Output: 128, SLO: 3 * time.Second},
		{Name: "long_context", Summary: "8000±1500 prompt tokens, 128 out",
			Prompt: Dist{Mean: 8000, StdDev: 1500}, Output: 128, SLO: 3 * time.Second},
		{Name: "very_long", Summary: "16000±3000 prompt tokens, 128 out",
			Prompt: Dist{Mean: 16000, StdDev: 3000}, Output: 128, SLO: 7 * time.Second},
	}
}

// LookupClass returns the named class.
func LookupClass(name string) (Class, error) {
	var names []string
	for _, c := range Classes() {
		if c.Name == name {
			return c, nil
		}
		names = append(names, c.Name)
	}
	return Class{}, fmt.Errorf("load: no workload class %q: want one of %s", name, strings.Join(names, ", "))
}

// Shape is one request's prompt and output size in tokens.
type Shape struct {
	Prompt, Output int
	Turn           int // 1-based turn of a conversation; 0 outside multiturn
}

// Sampler draws request shapes of a class from a seeded source: the same
// class and seed give the same sequence. Not safe for concurrent use.
type Sampler struct {
	c     Class
	rng   *rand.Rand
	turns []int // multiturn: the turn sizes of the conversation in progress
}

// NewSampler returns a sampler of c's shapes seeded with seed.
func NewSampler(c Class, seed uint64) *Sampler {
	return &Sampler{c: c, rng: rand.New(rand.NewPCG(seed, 0x15064a7))}
}

// Next draws the shape of a request sent at elapsed since the start.
func (s *Sampler) Next(elapsed time.Duration) Shape {
	c := s.c
	if c.Turns > 1 {
		if len(s.turns) == c.Turns {
			s.turns = s.turns[:0]
		}
		s.turns = append(s.turns, c.Prompt.Sample(s.rng))
		total := 0
		for _, t := range s.turns {
			total += t
		}
		return Shape{Prompt: total, Output: c.Output, Turn: len(s.turns)}
	}
	if c.Alt != nil && c.ShiftEvery > 0 && (elapsed/c.ShiftEvery)%2 == 1 {
		return Shape{Prompt: c.Alt.Sample(s.rng), Output: c.AltOutput}
	}
	return Shape{Prompt: c.Prompt.Sample(s.rng), Output: c.Output}
}
