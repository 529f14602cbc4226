package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Dist is a distribution of token counts with the given mean and standard
// deviation, rounded and clamped to [max(Min,1), Max] (Max 0: no bound).
// It is lognormal unless Normal is set: request and response lengths in
// public LLM serving traces (the Azure LLM inference traces, ShareGPT) are
// right-skewed, with a long tail of long requests, which a lognormal of
// the same mean and spread reproduces and a normal does not.
type Dist struct {
	Mean, StdDev float64
	Min, Max     int
	// Normal selects a normal distribution instead of the lognormal.
	Normal bool
}

// Sample draws one value.
func (d Dist) Sample(r *rand.Rand) int {
	var x float64
	switch {
	case d.StdDev <= 0 || d.Mean <= 0:
		x = d.Mean
	case d.Normal:
		x = d.Mean + d.StdDev*r.NormFloat64()
	default:
		// A lognormal with mean m and standard deviation s:
		// σ² = ln(1 + s²/m²), μ = ln m − σ²/2.
		cv := d.StdDev / d.Mean
		s2 := math.Log1p(cv * cv)
		x = math.Exp(math.Log(d.Mean) - s2/2 + math.Sqrt(s2)*r.NormFloat64())
	}
	v := int(math.Round(x))
	v = max(v, d.Min, 1)
	if d.Max > 0 {
		v = min(v, d.Max)
	}
	return v
}

// String writes the distribution as "512±200" (lognormal) or "N(512±200)".
func (d Dist) String() string {
	s := fmt.Sprintf("%.0f±%.0f", d.Mean, d.StdDev)
	if d.Normal {
		s = "N(" + s + ")"
	}
	if d.Max > 0 {
		s += fmt.Sprintf(" ≤%d", d.Max)
	}
	return s
}

// Class is a workload class: the shape of the prompts, the outputs and
// the arrivals of one kind of traffic.
type Class struct {
	Name    string
	Summary string
	// Prompt tokens per request, and output tokens generated. Output.Max
	// is the request's max_tokens.
	Prompt Dist
	Output Dist
	// Alt and ShiftEvery: the prompts alternate between Prompt/Output and
	// Alt/AltOutput every ShiftEvery (rapid_shift).
	Alt        *Dist
	AltOutput  Dist
	ShiftEvery time.Duration
	// BurstSize requests arrive at once every BurstEvery, on top of the
	// steady rate (adversarial_spike).
	BurstSize  int
	BurstEvery time.Duration
	// Turns > 1: conversations of Turns turns, turn k's prompt holding the
	// k user turns so far (each a Prompt sample): the context grows and
	// every turn after the first shares the previous turn's prompt as a
	// prefix (multiturn). Sessions conversations are open at once and the
	// requests interleave them.
	Turns    int
	Sessions int
	// DocPool > 0: each prompt is one of DocPool documents (a Prompt
	// sample, fixed per document) followed by a Question sample; documents
	// are drawn with Zipf popularity of exponent DocZipf (> 1). A request
	// whose document was asked about before shares the document as a
	// prefix (rag_multidoc).
	DocPool  int
	DocZipf  float64
	Question Dist
	// Tenants > 0: each prompt is one of Tenants system prompts (a Prompt
	// sample, fixed per tenant), drawn uniformly, followed by a Question
	// sample: every request of a tenant shares its system prompt as a
	// prefix (tenant_prompts).
	Tenants int
	// SLO is the tier-2 TTFT P95 objective of the published evaluation
	// for this class.
	SLO time.Duration
}

// Output-length distributions. vLLM generates until an end-of-sequence
// token or max_tokens; chat responses in public traces are right-skewed
// with a coefficient of variation near 0.7–1. Each class keeps its
// published mean, with a standard deviation of 0.75 × the mean and
// max_tokens at 4 × the mean.
func outDist(mean float64) Dist {
	return Dist{Mean: mean, StdDev: 0.75 * mean, Max: int(4 * mean)}
}

// Classes returns the eight workload classes of the evaluation (docs/design.md §8.3),
// in order. Means and spreads are the published ones; see Dist for the
// shape and docs/bench.md for the sources.
func Classes() []Class {
	return []Class{
		{Name: "baseline_mixed", Summary: "512±200 prompt tokens, 128±96 out",
			Prompt: Dist{Mean: 512, StdDev: 200}, Output: outDist(128), SLO: 1500 * time.Millisecond},
		{Name: "rapid_shift", Summary: "alternates every 10 s between short chat (256±64, 64±48 out) and documents (4000±800, 128±96 out)",
			Prompt: Dist{Mean: 256, StdDev: 64}, Output: outDist(64), Alt: &Dist{Mean: 4000, StdDev: 800}, AltOutput: outDist(128),
			ShiftEvery: 10 * time.Second, SLO: 1500 * time.Millisecond},
		{Name: "code_heavy", Summary: "1024±512 prompt tokens, 192±144 out",
			Prompt: Dist{Mean: 1024, StdDev: 512}, Output: outDist(192), SLO: 3 * time.Second},
		{Name: "adversarial_spike", Summary: "baseline_mixed at the rate plus 50-request bursts every 30 s",
			Prompt: Dist{Mean: 512, StdDev: 200}, Output: outDist(128), BurstSize: 50, BurstEvery: 30 * time.Second, SLO: 3 * time.Second},
		{Name: "multiturn", Summary: "8-turn conversations of 256±64-token turns, 16 open at once: the context grows to ~2048 tokens",
			Prompt: Dist{Mean: 256, StdDev: 64}, Output: outDist(128), Turns: 8, Sessions: 16, SLO: 3500 * time.Millisecond},
		{Name: "rag_multidoc", Summary: "a 3936±800-token document (Zipf 1.1 over 200) and a 64±32-token question, 128±96 out",
			Prompt: Dist{Mean: 3936, StdDev: 800}, Question: Dist{Mean: 64, StdDev: 32}, DocPool: 200, DocZipf: 1.1,
			Output: outDist(128), SLO: 3 * time.Second},
		{Name: "long_context", Summary: "8000±1500 prompt tokens, 128±96 out",
			Prompt: Dist{Mean: 8000, StdDev: 1500}, Output: outDist(128), SLO: 3 * time.Second},
		{Name: "very_long", Summary: "16000±3000 prompt tokens, 128±96 out",
			Prompt: Dist{Mean: 16000, StdDev: 3000}, Output: outDist(128), SLO: 7 * time.Second},
	}
}

// PrefixClasses returns the classes with shared prefixes beyond the eight
// of the evaluation, for the prefix-affinity stage: tenant_prompts, the
// shape of SGLang's generated-shared-prefix benchmark (bench_serving
// --dataset-name generated-shared-prefix, its defaults: 64 groups, a
// 2,048-token system prompt, 128-token questions, 256 output tokens), with
// the evaluation's output spread (outDist).
func PrefixClasses() []Class {
	return []Class{
		{Name: "tenant_prompts", Summary: "one of 64 tenants' 2048-token system prompts and a 128-token question, 256±192 out",
			Prompt: Dist{Mean: 2048}, Question: Dist{Mean: 128}, Tenants: 64, Output: outDist(256), SLO: 3 * time.Second},
	}
}

// LookupClass returns the named class, of Classes or PrefixClasses.
func LookupClass(name string) (Class, error) {
	var names []string
	for _, c := range append(Classes(), PrefixClasses()...) {
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
	// Turn is the 1-based turn of a conversation; 0 outside multiturn.
	Turn int
	// Session names the conversation (multiturn) or the document
	// (rag_multidoc) the request belongs to, 1-based; 0 for none.
	Session uint64
	// SharedPrefix is the number of leading prompt tokens this request
	// shares with an earlier request of the same session: the previous
	// turn's prompt, or the document. A prefix cache could skip them.
	SharedPrefix int
	// Segments is the prompt's content, in order: runs of tokens each
	// named by a key, so two prompts hold the same tokens where they hold
	// the same segment (a conversation's turn, a document, a tenant's
	// system prompt). A request's own text is a segment no other holds.
	// Their tokens sum to Prompt.
	Segments []Segment
}

// Segment is a run of Tokens prompt tokens whose content Key names.
type Segment struct {
	Key    uint64
	Tokens int
}

// BlockHashes returns the hash chain of the prompt's full blocks of size
// tokens, as an engine's prefix cache keys them: block i's hash covers
// the content of its tokens (segment keys and offsets) and, through its
// parent's hash, everything before it. Prompts with the same leading
// segments share the leading blocks those cover. nil when the prompt has
// no full block or size < 1.
func (s Shape) BlockHashes(size int) []uint64 {
	if size < 1 || s.Prompt < size {
		return nil
	}
	out := make([]uint64, 0, s.Prompt/size)
	var h uint64
	fill, seg, off := 0, 0, 0 // tokens in the current block; position in Segments
	for seg < len(s.Segments) && len(out) < cap(out) {
		sg := s.Segments[seg]
		n := min(sg.Tokens-off, size-fill)
		h = mix(h ^ mix(sg.Key^mix(uint64(off)<<20|uint64(n))))
		fill, off = fill+n, off+n
		if off >= sg.Tokens {
			seg, off = seg+1, 0
		}
		if fill == size {
			out = append(out, h)
			fill = 0
		}
	}
	return out
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Sampler draws request shapes of a class. Request i's draws come from a
// source keyed by (seed, i) alone, so request i has the same shape
// whatever was drawn before it or how many draws any consumer takes.
// Sessions are the one dependency on earlier requests: a conversation's
// turns and a document's first use follow the request order. Not safe for
// concurrent use.
type Sampler struct {
	c    Class
	seed uint64
	n    uint64 // requests drawn by Next
	pcg  *rand.PCG
	rng  *rand.Rand
	zipf *rand.Zipf
	// multiturn: the open conversations.
	open     []conversation
	sessions uint64
	// rag_multidoc: documents asked about so far.
	seenDoc map[uint64]bool
}

type conversation struct {
	id    uint64
	turns int // turns sent
	sum   int // prompt tokens of the turns sent
	segs  []Segment
}

// Stream salts of the keyed sources.
const (
	saltRequest = 0x15064a7
	saltSession = 0x5e55
	saltDoc     = 0xd0c
	saltTenant  = 0x7e4a
	// Content keys: what a segment's key is derived from.
	contentTurn   = 1
	contentDoc    = 2
	contentOwn    = 3
	contentTenant = 4
)

// contentKey names a segment's content: kind, then an id and index.
func contentKey(kind, id, k uint64) uint64 { return mix(mix(kind<<56^id) ^ k) }

// NewSampler returns a sampler of c's shapes seeded with seed.
func NewSampler(c Class, seed uint64) *Sampler {
	pcg := rand.NewPCG(seed, saltRequest)
	s := &Sampler{c: c, seed: seed, pcg: pcg, rng: rand.New(pcg)}
	if c.DocPool > 0 {
		z := c.DocZipf
		if !(z > 1) {
			z = 1.1
		}
		s.zipf = rand.NewZipf(s.rng, z, 1, uint64(c.DocPool-1))
		s.seenDoc = make(map[uint64]bool)
	}
	return s
}

// key reseeds the shared source for stream (salt, i).
func (s *Sampler) key(salt, i uint64) *rand.Rand {
	s.pcg.Seed(s.seed^(salt*0x9e3779b97f4a7c15), i)
	return s.rng
}

// Next draws the next request's shape (request index = the number of
// earlier calls), sent at elapsed since the start.
func (s *Sampler) Next(elapsed time.Duration) Shape {
	i := s.n
	s.n++
	return s.At(i, elapsed)
}

// At draws the shape of request i, sent at elapsed since the start.
// Requests with sessions must be drawn in index order.
func (s *Sampler) At(i uint64, elapsed time.Duration) Shape {
	c := s.c
	r := s.key(saltRequest, i)
	own := contentKey(contentOwn, s.seed, i)
	switch {
	case c.Turns > 1:
		return s.turn(r)
	case c.DocPool > 0:
		return s.rag(r, own)
	case c.Tenants > 0:
		return s.tenant(r, own)
	case c.Alt != nil && c.ShiftEvery > 0 && (elapsed/c.ShiftEvery)%2 == 1:
		p := c.Alt.Sample(r)
		return Shape{Prompt: p, Output: c.AltOutput.Sample(r), Segments: []Segment{{own, p}}}
	}
	p := c.Prompt.Sample(r)
	return Shape{Prompt: p, Output: c.Output.Sample(r), Segments: []Segment{{own, p}}}
}

// tenant draws a tenant uniformly and a question: the tenant's system
// prompt (fixed per tenant) is the shared prefix.
func (s *Sampler) tenant(r *rand.Rand, own uint64) Shape {
	c := s.c
	tn := uint64(r.IntN(c.Tenants))
	q := c.Question.Sample(r)
	out := c.Output.Sample(r)
	sp := c.Prompt.Sample(s.key(saltTenant, tn))
	key := contentKey(contentTenant, s.seed, tn)
	return Shape{Prompt: sp + q, Output: out, Session: tn + 1, SharedPrefix: sp,
		Segments: []Segment{{key, sp}, {own, q}}}
}

// turn advances one of the open conversations, chosen by r.
func (s *Sampler) turn(r *rand.Rand) Shape {
	c := s.c
	n := max(c.Sessions, 1)
	k := r.IntN(n)
	out := c.Output.Sample(r)
	if len(s.open) < n {
		s.open = append(s.open, make([]conversation, n-len(s.open))...)
	}
	cv := &s.open[k]
	if cv.id == 0 || cv.turns >= c.Turns {
		s.sessions++
		*cv = conversation{id: s.sessions, segs: cv.segs[:0]}
	}
	// The turn's size is keyed by (conversation, turn): the same
	// conversation has the same turns whichever requests carry them.
	t := c.Prompt.Sample(s.key(saltSession^cv.id, uint64(cv.turns)))
	shared := cv.sum
	cv.segs = append(cv.segs, Segment{contentKey(contentTurn, s.seed^cv.id, uint64(cv.turns)), t})
	cv.turns++
	cv.sum += t
	return Shape{Prompt: cv.sum, Output: out, Turn: cv.turns, Session: cv.id, SharedPrefix: shared,
		Segments: append([]Segment(nil), cv.segs...)}
}

// rag draws a document by popularity and a question about it.
func (s *Sampler) rag(r *rand.Rand, own uint64) Shape {
	c := s.c
	doc := s.zipf.Uint64() // uses r: s.zipf wraps the keyed source
	q := c.Question.Sample(r)
	out := c.Output.Sample(r)
	dl := c.Prompt.Sample(s.key(saltDoc, doc))
	shared := 0
	if s.seenDoc[doc] {
		shared = dl
	}
	s.seenDoc[doc] = true
	return Shape{Prompt: dl + q, Output: out, Session: doc + 1, SharedPrefix: shared,
		Segments: []Segment{{contentKey(contentDoc, s.seed, doc), dl}, {own, q}}}
}
