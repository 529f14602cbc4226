package placement

import (
	"errors"
	"math"
	"testing"
	"time"
)

// script is a Rand that replays fixed values and counts the draws.
type script struct {
	vals  []uint64
	draws int
}

func (s *script) Uint64() uint64 {
	v := s.vals[s.draws%len(s.vals)]
	s.draws++
	return v
}

// formulaConfig is DefaultConfig with a 1 ms decode cost, the round
// figure the formula tests below are written in.
func formulaConfig() Config {
	c := DefaultConfig()
	c.DecodeCost = time.Millisecond
	return c
}

func TestExpectedTTFT(t *testing.T) {
	c := formulaConfig()
	for _, tc := range []struct {
		name   string
		h      Host
		prompt int64
		want   float64 // seconds
	}{
		{"idle host, default rate", Host{Weight: 1}, 2000, 2000.0 / 20000},
		{"pending tokens queue ahead", Host{Weight: 1, PendingPromptTokens: 8000}, 2000, 10000.0 / 20000},
		{"own rate", Host{Weight: 1, PrefillTokensPerSecond: 40000}, 2000, 2000.0 / 40000},
		{"rtt plus twice the jitter", Host{Weight: 1, RTT: 30 * time.Millisecond, Jitter: 5 * time.Millisecond}, 0, 0.040},
		{"decode contention", Host{Weight: 1, InFlight: 7}, 0, 0.007},
		{"everything", Host{Weight: 1, RTT: 10 * time.Millisecond, Jitter: time.Millisecond, PendingPromptTokens: 1000,
			PrefillTokensPerSecond: 10000, InFlight: 3}, 1000, 0.010 + 0.002 + 0.2 + 0.003},
		{"negative inputs count as zero", Host{Weight: 1, RTT: -time.Second, Jitter: -time.Second, PendingPromptTokens: -5,
			PrefillTokensPerSecond: -1, InFlight: -2}, -3, 0},
		{"infinite rate takes the default", Host{Weight: 1, PrefillTokensPerSecond: math.Inf(1)}, 20000, 1},
		{"NaN rate takes the default", Host{Weight: 1, PrefillTokensPerSecond: math.NaN()}, 20000, 1},
		// Slot wait: k = InFlight + 1 − Slots requests without a slot,
		// one slot frees every ServiceTime/Slots.
		{"free slot: no wait", Host{Weight: 1, InFlight: 7, Slots: 8, ServiceTime: 4 * time.Second}, 0, 0.007},
		{"last slot taken: wait for one", Host{Weight: 1, InFlight: 8, Slots: 8, ServiceTime: 4 * time.Second}, 0,
			0.008 + 1*4.0/8},
		{"three ahead of nine slots", Host{Weight: 1, InFlight: 11, Slots: 9, ServiceTime: 4500 * time.Millisecond}, 0,
			0.011 + 3*4.5/9},
		{"slot wait adds to the rest", Host{Weight: 1, RTT: 10 * time.Millisecond, PendingPromptTokens: 1000,
			PrefillTokensPerSecond: 10000, InFlight: 5, Slots: 4, ServiceTime: 2 * time.Second}, 1000,
			0.010 + 0.2 + 0.005 + 2*2.0/4},
		{"unknown slots: no slot term", Host{Weight: 1, InFlight: 20, ServiceTime: 4 * time.Second}, 0, 0.020},
		{"unknown service time: no slot term", Host{Weight: 1, InFlight: 20, Slots: 4}, 0, 0.020},
		{"negative slots and service time count as unknown", Host{Weight: 1, InFlight: 20, Slots: -4,
			ServiceTime: -time.Second}, 0, 0.020},
		{"one slot, nothing in flight: no wait", Host{Weight: 1, Slots: 1, ServiceTime: time.Second}, 0, 0},
		{"one slot, one in flight: a whole hold", Host{Weight: 1, InFlight: 1, Slots: 1, ServiceTime: time.Second}, 0,
			0.001 + 1},
		{"negative in flight: no wait", Host{Weight: 1, InFlight: -5, Slots: 1, ServiceTime: time.Second}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExpectedTTFT(c, tc.h, tc.prompt); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("ExpectedTTFT = %v s, want %v s", got, tc.want)
			}
		})
	}
}

// A count at the edge of int64 must not wrap round to a negative wait.
func TestSlotWaitDoesNotOverflow(t *testing.T) {
	got := slotWait(math.MaxInt64, 1, time.Second)
	if want := float64(math.MaxInt64); math.Abs(got-want) > want*1e-12 {
		t.Errorf("slotWait(MaxInt64, 1, 1 s) = %v s, want %v s", got, want)
	}
	// One request without a slot (k = 1), not 0 from float rounding.
	if got, want := slotWait(math.MaxInt64, math.MaxInt64, time.Second), 1/float64(math.MaxInt64); math.Abs(got-want) > want*1e-12 {
		t.Errorf("slotWait(MaxInt64, MaxInt64, 1 s) = %v s, want %v s", got, want)
	}
}

// The slot term moves a pick off a host whose batch is full: the near
// host wins on network distance while it has a free slot, and loses to
// the far one once its slots are taken.
func TestPickSlotWaitMovesOffFullHost(t *testing.T) {
	c := formulaConfig()
	const slots, hold = 9, 4500 * time.Millisecond
	near := Host{Weight: 1, RTT: 4 * time.Millisecond, Slots: slots, ServiceTime: hold}
	far := Host{Weight: 1, RTT: 40 * time.Millisecond, Slots: slots, ServiceTime: hold, InFlight: 2}
	// near 8 in flight: 4 ms + 8 ms = 0.012 s; far: 40 ms + 2 ms = 0.042 s.
	near.InFlight = 8
	if got, _ := Pick(c, []Host{near, far}, 1000, &script{vals: []uint64{0}}); got != 0 {
		t.Fatalf("near host with a free slot: Pick = %d, want 0", got)
	}
	// near 9 in flight: 4 ms + 9 ms + 1 × 4.5 s / 9 = 0.513 s against 0.042 s.
	near.InFlight = 9
	if got, _ := Pick(c, []Host{near, far}, 1000, &script{vals: []uint64{0}}); got != 1 {
		t.Errorf("near host full: Pick = %d, want 1 (the far host with free slots)", got)
	}
	// Without the slot facts the full near host still wins (the term is
	// what moves the pick).
	near.Slots, far.Slots = 0, 0
	if got, _ := Pick(c, []Host{near, far}, 1000, &script{vals: []uint64{0}}); got != 0 {
		t.Errorf("no slot facts: Pick = %d, want 0", got)
	}
	// Both full: the shorter slot queue wins, weighed by each host's
	// holding time: near 12 in flight, 4 over 9 slots of 1.8 s = 0.8 s;
	// far 10, 2 over 9 slots of 4.5 s = 1 s.
	near.Slots, far.Slots = slots, slots
	near.InFlight, near.ServiceTime = 12, 1800*time.Millisecond
	far.InFlight = 10
	if got, _ := Pick(c, []Host{near, far}, 1000, &script{vals: []uint64{0}}); got != 0 {
		t.Errorf("both full: Pick = %d, want 0 (its slots free sooner)", got)
	}
}

func TestPick(t *testing.T) {
	c := DefaultConfig()
	idle := Host{Weight: 1}
	for _, tc := range []struct {
		name      string
		hosts     []Host
		prompt    int64
		rand      []uint64
		want      int
		wantOK    bool
		wantDraws int
	}{
		{"fewer pending tokens wins", []Host{{Weight: 1, PendingPromptTokens: 5000}, {Weight: 1, PendingPromptTokens: 100}}, 10,
			[]uint64{0}, 1, true, 0},
		{"a faster host absorbs more pending", []Host{
			{Weight: 1, PendingPromptTokens: 4000, PrefillTokensPerSecond: 80000}, // 0.05 s + prompt
			{Weight: 1, PendingPromptTokens: 1000, PrefillTokensPerSecond: 10000}, // 0.1 s + prompt
		}, 100, []uint64{0}, 0, true, 0},
		{"absent rate takes the default", []Host{
			{Weight: 1, PendingPromptTokens: 3000},                                // 0.15 s at 20k/s
			{Weight: 1, PendingPromptTokens: 3000, PrefillTokensPerSecond: 10000}, // 0.3 s
		}, 0, []uint64{0}, 0, true, 0},
		{"rtt is added latency", []Host{
			{Weight: 1, RTT: 80 * time.Millisecond},
			{Weight: 1, PendingPromptTokens: 1000}, // 50 ms
		}, 0, []uint64{0}, 1, true, 0},
		{"weight 0 is never picked, however idle", []Host{
			{Weight: 0},
			{Weight: 5, PendingPromptTokens: 1 << 30, InFlight: 1000},
		}, 100, []uint64{0}, 1, true, 0},
		{"weight size does not matter", []Host{{Weight: 100, InFlight: 2}, {Weight: 1, InFlight: 1}}, 0, []uint64{0}, 1, true, 0},
		{"no eligible host", []Host{{Weight: 0}, {Weight: 0}}, 1, []uint64{0}, -1, false, 0},
		{"empty", nil, 1, []uint64{0}, -1, false, 0},
		// Three idle hosts tie: draws 1 and 2 are random()%2 and
		// random()%3; 0 replaces the candidate.
		{"tie: second draw keeps the first", []Host{idle, idle, idle}, 10, []uint64{1, 1}, 0, true, 2},
		{"tie: 0 at the second host", []Host{idle, idle, idle}, 10, []uint64{0, 1}, 1, true, 2},
		{"tie: 0 at the third host", []Host{idle, idle, idle}, 10, []uint64{1, 3}, 2, true, 2},
		{"tie among the best only", []Host{{Weight: 1, InFlight: 1}, idle, {Weight: 0}, idle}, 10, []uint64{2}, 3, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &script{vals: tc.rand}
			got, ok := Pick(c, tc.hosts, tc.prompt, r)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("Pick = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
			if r.draws != tc.wantDraws {
				t.Errorf("Pick drew %d random values, want %d", r.draws, tc.wantDraws)
			}
		})
	}
}

// Ties are broken uniformly: over every residue of the draws, each of the
// tied hosts wins equally often.
func TestPickTieIsUniform(t *testing.T) {
	hosts := []Host{{Weight: 1}, {Weight: 2}, {Weight: 3}, {Weight: 4}}
	wins := make([]int, len(hosts))
	// Draw k is taken mod k+1 (k = 1, 2, 3): enumerate all 2×3×4 residues.
	for a := range uint64(2) {
		for b := range uint64(3) {
			for c := range uint64(4) {
				i, _ := Pick(DefaultConfig(), hosts, 1, &script{vals: []uint64{a, b, c}})
				wins[i]++
			}
		}
	}
	for i, w := range wins {
		if w != 6 {
			t.Errorf("host %d won %d of 24 residue combinations, want 6 (wins %v)", i, w, wins)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"zero rate", func(c *Config) { c.DefaultPrefillTokensPerSecond = 0 }, false},
		{"NaN rate", func(c *Config) { c.DefaultPrefillTokensPerSecond = math.NaN() }, false},
		{"infinite rate", func(c *Config) { c.DefaultPrefillTokensPerSecond = math.Inf(1) }, false},
		{"negative jitter factor", func(c *Config) { c.JitterFactor = -1 }, false},
		{"zero jitter factor", func(c *Config) { c.JitterFactor = 0 }, true},
		{"negative decode cost", func(c *Config) { c.DecodeCost = -time.Millisecond }, false},
		{"negative band", func(c *Config) { c.AffinityBand = -0.1 }, false},
		{"NaN band", func(c *Config) { c.AffinityBand = math.NaN() }, false},
		{"zero band", func(c *Config) { c.AffinityBand = 0 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func BenchmarkPick(b *testing.B) {
	hosts := make([]Host, 16)
	for i := range hosts {
		hosts[i] = Host{Weight: 1, PendingPromptTokens: int64(i * 37 % 11 * 1000), InFlight: int64(i % 5)}
	}
	r := &script{vals: []uint64{1, 2, 3}}
	for b.Loop() {
		Pick(DefaultConfig(), hosts, 500, r)
	}
}

func TestHeadProgress(t *testing.T) {
	for _, tc := range []struct {
		prompt  int64
		rate    float64
		elapsed time.Duration
		want    int64
	}{
		{4000, 2000, time.Second, 2000},
		{4000, 2000, 3 * time.Second, 4000}, // at most the prompt
		{4000, 2000, 0, 0},
		{4000, 2000, -time.Second, 0},
		{4000, 0, time.Second, 0},
		{4000, -5, time.Second, 0},
		{4000, math.NaN(), time.Second, 0},
		{4000, math.Inf(1), time.Second, 0},
		{0, 2000, time.Second, 0},
		{-3, 2000, time.Second, 0},
	} {
		if got := HeadProgress(tc.prompt, tc.rate, tc.elapsed); got != tc.want {
			t.Errorf("HeadProgress(%d, %v, %v) = %d, want %d", tc.prompt, tc.rate, tc.elapsed, got, tc.want)
		}
	}
}

func TestContextCeiling(t *testing.T) {
	for _, tc := range []struct{ served, refused, stated, want int64 }{
		{0, 0, 0, 0},        // nothing refused: no limit
		{900, 0, 0, 0},      // served only: no limit
		{300, 5000, 0, 300}, // proven size below the refusal
		{0, 2000, 0, 1999},  // nothing proven: one below the refusal
		{6000, 5000, 0, 4999},
		{300, 5000, 1024, 1024}, // a stated limit wins
		{0, 1, 0, 1},            // floor
	} {
		if got := ContextCeiling(tc.served, tc.refused, tc.stated); got != tc.want {
			t.Errorf("ContextCeiling(%d, %d, %d) = %d, want %d", tc.served, tc.refused, tc.stated, got, tc.want)
		}
	}
}

func TestUncachedTokens(t *testing.T) {
	for _, tc := range []struct{ prompt, cached, want int64 }{
		{1000, 0, 1000}, {1000, 600, 400}, {1000, 1000, 1}, {1000, 5000, 1},
		{1000, -5, 1000}, {0, 0, 0}, {-3, 10, 0},
	} {
		if got := UncachedTokens(tc.prompt, tc.cached); got != tc.want {
			t.Errorf("UncachedTokens(%d, %d) = %d, want %d", tc.prompt, tc.cached, got, tc.want)
		}
	}
}

// TestPickAffinityBand: a host expected to hold the prompt's prefix wins
// while its expected TTFT is within the band of the best, and loses once
// it is further; the cached tokens shorten its expected prefill either
// way.
func TestPickAffinityBand(t *testing.T) {
	c := formulaConfig()
	c.AffinityBand = 0.25
	// 10,000 tokens/s; a 2,000-token prompt of which host 1 holds 1,500.
	mk := func(pending1 int64) []Host {
		return []Host{
			{Weight: 1, PrefillTokensPerSecond: 10000},
			{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: pending1, CachedPromptTokens: 1500},
			{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: 100},
		}
	}
	for _, tc := range []struct {
		name     string
		pending1 int64
		band     float64
		want     int
	}{
		// Host 1: (pending + 500)/10,000 s; host 0: 0.2 s.
		{"cache makes it fastest", 0, 0.25, 1},
		{"slower but within the band", 1800, 0.25, 1},  // 0.23 s ≤ 0.25 s
		{"beyond the band", 2200, 0.25, 0},             // 0.27 s > 0.25 s
		{"no band: least expected TTFT", 1800, 0, 0},   // 0.23 s > 0.2 s
		{"no band, cache still counts", 1000, 0, 1},    // 0.15 s
		{"wide band", 5000, 3, 1},                      // 0.55 s ≤ 0.8 s
		{"band holds no cached host", 100000, 0.25, 0}, // host 1 far out
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.AffinityBand = tc.band
			got, ok := Pick(c, mk(tc.pending1), 2000, &script{vals: []uint64{0}})
			if !ok || got != tc.want {
				t.Fatalf("Pick = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}

// TestPickAffinityPrefersLongestPrefix: within the band the longest
// expected prefix wins; equal prefixes go to the least expected TTFT; a
// weight of 0 is never picked whatever it holds.
func TestPickAffinityPrefersLongestPrefix(t *testing.T) {
	c := formulaConfig()
	hosts := []Host{
		{Weight: 0, PrefillTokensPerSecond: 10000, CachedPromptTokens: 1900},
		{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: 900, CachedPromptTokens: 800},
		{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: 1300, CachedPromptTokens: 1200},
		{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: 1200, CachedPromptTokens: 1200},
		{Weight: 1, PrefillTokensPerSecond: 10000, PendingPromptTokens: 800},
	}
	// Expected: host1 0.21, host2 0.21, host3 0.20, host4 0.28; best 0.20.
	got, ok := Pick(c, hosts, 2000, &script{vals: []uint64{0}})
	if !ok || got != 3 {
		t.Fatalf("Pick = %d, %v; want 3 (1,200 cached, faster than host 2)", got, ok)
	}
}
