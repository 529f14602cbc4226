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

func TestExpectedTTFT(t *testing.T) {
	c := DefaultConfig()
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExpectedTTFT(c, tc.h, tc.prompt); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("ExpectedTTFT = %v s, want %v s", got, tc.want)
			}
		})
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
