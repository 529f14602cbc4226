package lb

import (
	"math"
	"slices"
	"testing"
)

func TestRoundRobinEqualWeights(t *testing.T) {
	tests := []struct {
		name    string
		weights []uint32
		seed    uint64
		want    []int
	}{
		{
			// rr_index starts at seed_ = 4: 4%3=1, 5%3=2, 6%3=0, ...
			name: "rotation from seed", weights: []uint32{1, 1, 1}, seed: 4,
			want: []int{1, 2, 0, 1, 2, 0},
		},
		{
			// Equal is equal: weight 5 everywhere is unweighted too.
			name: "equal weights other than 1", weights: []uint32{5, 5}, seed: 0,
			want: []int{0, 1, 0, 1},
		},
		{
			// rr_index is a uint64: (2⁶⁴-1)%3 = 0, then it wraps to 0:
			// 0%3 = 0 again, then 1, 2.
			name: "index wraps at 2^64", weights: []uint32{1, 1, 1}, seed: math.MaxUint64,
			want: []int{0, 0, 1, 2},
		},
		{
			// Weight 0 leaves the set: the vector is {1, 3}; index 0, 1, ...
			name: "weight-0 hosts skipped", weights: []uint32{0, 1, 0, 1}, seed: 0,
			want: []int{1, 3, 1, 3},
		},
		{
			// One host (even with others at 0): no EDF, always that host.
			name: "single host", weights: []uint32{0, 7}, seed: 3,
			want: []int{1, 1, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustBalancer(t, DefaultPolicy(RoundRobin), tt.seed)
			b.Update(tt.weights, nil)
			if b.Weighted() {
				t.Fatalf("Weighted() = true for %v", tt.weights)
			}
			if got := picks(t, b, len(tt.want), nil); !slices.Equal(got, tt.want) {
				t.Errorf("picks = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRoundRobinWeightedEDF(t *testing.T) {
	tests := []struct {
		name    string
		weights []uint32
		seed    uint64
		want    []int
	}{
		{
			// uint32(seed) % 429496729 = 0 pre-picks; see TestEDF "weights
			// 1,2,3 from an empty schedule" for the derivation. 12 picks:
			// h0 twice, h1 four times, h2 six times.
			name: "weights 1,2,3 seed 0", weights: []uint32{1, 2, 3}, seed: 0,
			want: []int{2, 1, 2, 0, 1, 2, 2, 1, 2, 0, 1, 2},
		},
		{
			// 5 pre-picks (TestEDF "five picks in"): the sequence above
			// from its sixth pick.
			name: "weights 1,2,3 seed 5", weights: []uint32{1, 2, 3}, seed: 5,
			want: []int{2, 2, 1, 2, 0, 1, 2},
		},
		{
			// seed_ is a uint64 passed to createWithPicks' uint32: the
			// high half is dropped, leaving 5.
			name: "seed truncated to 32 bits", weights: []uint32{1, 2, 3}, seed: 1<<32 + 5,
			want: []int{2, 2, 1, 2, 0, 1, 2},
		},
		{
			// Vector {h0 w3, h2 w1}; 0 pre-picks. Deadlines h0 1/3⁻,
			// h2 1-1e-13. h0@1/3⁻ → 2/3⁻; h0@2/3⁻ → 1-1.1e-14;
			// h2@1-1e-13 → 2⁻; h0 → 4/3⁻, 5/3⁻, 2-1.1e-14; h2@2-1e-13.
			name: "weight-0 host excluded", weights: []uint32{3, 0, 1}, seed: 0,
			want: []int{0, 0, 2, 0, 0, 0, 2, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustBalancer(t, DefaultPolicy(RoundRobin), tt.seed)
			b.Update(tt.weights, nil)
			if !b.Weighted() {
				t.Fatalf("Weighted() = false for %v", tt.weights)
			}
			if got := picks(t, b, len(tt.want), nil); !slices.Equal(got, tt.want) {
				t.Errorf("picks = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLeastRequestNChoices(t *testing.T) {
	tests := []struct {
		name        string
		weights     []uint32
		active      Counts
		choiceCount uint32
		draws       []uint64 // after the host-source draw
		want        int
	}{
		// Hosts 0..3 with 3, 1, 1, 0 requests in flight.
		{name: "fewer active wins", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{0, 1}, want: 1},
		{name: "tie keeps the first draw", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{1, 2}, want: 1},
		{name: "tie keeps the first draw, reversed", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{2, 1}, want: 2},
		{name: "same host drawn twice", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{0, 0}, want: 0},
		// 7%4 = 3 (0 active) beats 4%4 = 0 (3 active).
		{name: "draws reduced mod n", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{7, 4}, want: 3},
		// (2⁶⁴-1)%4 = 3.
		{name: "full-range draw", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			draws: []uint64{1, math.MaxUint64}, want: 3},
		{name: "choice_count 3 sees the third draw", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			choiceCount: 3, draws: []uint64{0, 1, 3}, want: 3},
		{name: "choice_count 3 all the same", weights: []uint32{1, 1, 1, 1}, active: Counts{3, 1, 1, 0},
			choiceCount: 3, draws: []uint64{0, 0, 0}, want: 0},
		// The vector is {0, 2, 3}: draws 0, 1 are hosts 0 and 2. Host 1,
		// idle but weight 0, is never a candidate.
		{name: "weight-0 host never drawn", weights: []uint32{1, 0, 1, 1}, active: Counts{3, 0, 1, 0},
			draws: []uint64{0, 1}, want: 2},
		// Equal but not 1: still unweighted.
		{name: "equal weights other than 1", weights: []uint32{9, 9}, active: Counts{4, 2},
			draws: []uint64{0, 1}, want: 1},
		// One host: Envoy still draws choice_count times (random()%1).
		{name: "single host still draws", weights: []uint32{0, 5, 0}, active: Counts{0, 9, 0},
			draws: []uint64{8, 9}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultPolicy(LeastRequest)
			if tt.choiceCount != 0 {
				p.ChoiceCount = tt.choiceCount
			}
			b := mustBalancer(t, p, 0)
			b.Update(tt.weights, tt.active)
			if b.Weighted() {
				t.Fatalf("Weighted() = true for %v", tt.weights)
			}
			r := newScript(t, append([]uint64{x}, tt.draws...)...)
			if got, ok := b.Pick(r, tt.active); !ok || got != tt.want {
				t.Errorf("Pick = %d, %v; want %d, true", got, ok, tt.want)
			}
			r.done()
		})
	}
}

func TestLeastRequestFullScan(t *testing.T) {
	tests := []struct {
		name   string
		active Counts
		draws  []uint64 // after the host-source draw: one per tie met
		want   int
	}{
		// Counts 2,1,3,1,1. Scan: h0 candidate; h1 fewer → candidate,
		// tied=1; h2 more; h3 ties → tied=2, replace if draw%2==0; h4
		// ties → tied=3, replace if draw%3==0.
		{name: "reservoir keeps the second tie", active: Counts{2, 1, 3, 1, 1}, draws: []uint64{0, 1}, want: 3},
		{name: "reservoir keeps the last tie", active: Counts{2, 1, 3, 1, 1}, draws: []uint64{1, 0}, want: 4},
		{name: "reservoir keeps the first least", active: Counts{2, 1, 3, 1, 1}, draws: []uint64{1, 2}, want: 1},
		{name: "each tie redraws", active: Counts{2, 1, 3, 1, 1}, draws: []uint64{0, 3}, want: 4},
		// No tie: no draw beyond the host source.
		{name: "no ties no draws", active: Counts{0, 1, 2}, want: 0},
		// h0 least; h2 ties it (tied=2): 1%2 keeps h0, 2%2 takes h2.
		{name: "first host tied, kept", active: Counts{0, 5, 0}, draws: []uint64{1}, want: 0},
		{name: "first host tied, replaced", active: Counts{0, 5, 0}, draws: []uint64{2}, want: 2},
		// A lower count resets the tie count: h1 ties h0 (draw 1: keep
		// h0), h2 is lower (no draw), h3 ties h2 with tied=2 (draw 2%2=0:
		// h3).
		{name: "lower count resets ties", active: Counts{4, 4, 1, 1}, draws: []uint64{1, 2}, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy("least_request_full_scan")
			if err != nil {
				t.Fatal(err)
			}
			b := mustBalancer(t, p, 0)
			weights := make([]uint32, len(tt.active))
			for i := range weights {
				weights[i] = 1
			}
			b.Update(weights, tt.active)
			r := newScript(t, append([]uint64{x}, tt.draws...)...)
			if got, ok := b.Pick(r, tt.active); !ok || got != tt.want {
				t.Errorf("Pick = %d, %v; want %d, true", got, ok, tt.want)
			}
			r.done()
		})
	}
}

// TestLeastRequestEDFStaleWeights: with unequal weights a host's effective
// weight weight/(active+1) is computed when it is (re)added, so a host
// whose count rose after its last pick keeps its old deadline.
func TestLeastRequestEDFStaleWeights(t *testing.T) {
	// Weights h0=1, h1=2, seed 0, counts 0,0 at Update: deadlines
	// h0 1/(1+1e-13) = 1-1e-13, h1 1/(2+1e-13) = 0.5-2.5e-14.
	steps := []struct {
		active Counts // in flight when the pick is made
		want   int
		why    string
	}{
		{Counts{0, 0}, 1, "h1@0.5⁻ re-added with 2/(0+1)=2 → 1-2.5e-14"},
		{Counts{0, 1}, 0, "h0@1-1e-13 comes first; re-added with 1/1 → 2⁻"},
		{Counts{1, 10}, 1, "h1@1-2.5e-14: 10 in flight vs h0's 1, but its deadline is from 0 in flight; re-added with 2/11 → 6.5⁻"},
		{Counts{1, 0}, 0, "h0@2⁻ re-added with 1/2 → 4⁻; h1 is idle now but waits at 6.5"},
		{Counts{1, 0}, 0, "h0@4⁻ → 6⁻"},
		{Counts{1, 0}, 0, "h0@6⁻ → 8-1e-13"},
		{Counts{1, 0}, 1, "h1@6.5⁻ re-added with 2/1 → 7⁻"},
		{Counts{1, 0}, 1, "h1@7⁻ → 7.5⁻"},
		{Counts{1, 0}, 1, "h1@7.5⁻ → 8-2.5e-14"},
		{Counts{1, 0}, 0, "h0@8-1e-13 before h1@8-2.5e-14"},
	}
	b := mustBalancer(t, DefaultPolicy(LeastRequest), 0)
	b.Update([]uint32{1, 2}, Counts{0, 0})
	if !b.Weighted() {
		t.Fatal("Weighted() = false for weights 1,2")
	}
	for i, s := range steps {
		r := hostSourceDraws(t, 1)
		if got, ok := b.Pick(r, s.active); !ok || got != s.want {
			t.Fatalf("step %d (active %v): Pick = %d, %v; want %d (%s)", i+1, s.active, got, ok, s.want, s.why)
		}
		r.done()
	}
}

func TestLeastRequestEDFBias(t *testing.T) {
	// Weights h0=1, h1=8, constant counts 0 and 1, seed 0.
	tests := []struct {
		name string
		bias float64
		want []int
	}{
		{
			// h1 effective 8/(1+1)^0 = 8: h1 at 1/8⁻, 2/8, ..., 7/8
			// (seven picks), then h0@1-1e-13 before h1@1-1.5e-15, then h1.
			name: "bias 0 ignores active", bias: 0,
			want: []int{1, 1, 1, 1, 1, 1, 1, 0, 1},
		},
		{
			// h1 effective 8/2 = 4: h1 at 1/4⁻, 1/2, 3/4, then h0@1-1e-13
			// before h1@1-6e-15, then h1 four times (1 ... 7/4), h0@2⁻.
			name: "bias 1", bias: 1,
			want: []int{1, 1, 1, 0, 1, 1, 1, 1, 0},
		},
		{
			// h1 effective 8/2² = 2: h1@1/2⁻ → 1-2.5e-14; h0@1-1e-13 →
			// 2⁻; h1 → 3/2⁻, 2-2.5e-14; h0@2-1e-13; h1, h1; h0.
			name: "bias 2", bias: 2,
			want: []int{1, 0, 1, 1, 0, 1, 1, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultPolicy(LeastRequest)
			p.ActiveRequestBias = tt.bias
			b := mustBalancer(t, p, 0)
			active := Counts{0, 1}
			b.Update([]uint32{1, 8}, active)
			if got := picks(t, b, len(tt.want), active); !slices.Equal(got, tt.want) {
				t.Errorf("picks = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestUpdateRebuilds(t *testing.T) {
	t.Run("weight change switches to EDF and back", func(t *testing.T) {
		b := mustBalancer(t, DefaultPolicy(RoundRobin), 0)
		b.Update([]uint32{1, 1, 1}, nil)
		// Unweighted from index 0: h0, h1; the index is now 2.
		if got, want := picks(t, b, 2, nil), []int{0, 1}; !slices.Equal(got, want) {
			t.Fatalf("equal weights: picks = %v, want %v", got, want)
		}
		// Weights 1,1,4, 0 pre-picks: h2 at 1/4⁻, 1/2, 3/4, then the tie
		// region at 1: h0@1-1e-13 (order 0), h1@1-1e-13 (order 1), then
		// h2@1-6e-15.
		b.Update([]uint32{1, 1, 4}, nil)
		if got, want := picks(t, b, 6, nil), []int{2, 2, 2, 0, 1, 2}; !slices.Equal(got, want) {
			t.Fatalf("weights 1,1,4: picks = %v, want %v", got, want)
		}
		// Back to equal: the round-robin index survived both refreshes
		// (rr_indexes_.insert keeps it) and EDF picks do not move it: 2%3,
		// 3%3.
		b.Update([]uint32{1, 1, 1}, nil)
		if got, want := picks(t, b, 2, nil), []int{2, 0}; !slices.Equal(got, want) {
			t.Fatalf("equal again: picks = %v, want %v", got, want)
		}
	})
	t.Run("rebuild resets the schedule", func(t *testing.T) {
		b := mustBalancer(t, DefaultPolicy(RoundRobin), 0)
		b.Update([]uint32{1, 2, 3}, nil)
		first := picks(t, b, 4, nil)
		// Same weights again: a new schedule from the same seed, so the
		// sequence starts over rather than continuing.
		b.Update([]uint32{1, 2, 3}, nil)
		if again := picks(t, b, 4, nil); !slices.Equal(first, again) {
			t.Errorf("after Update picks = %v, want %v again", again, first)
		}
	})
	t.Run("least request snapshots counts at Update", func(t *testing.T) {
		// Weights 1,2. With counts 0,0 h1 (0.5⁻) goes first; with 0,3 h1's
		// effective weight is 2/4: deadline 1/(0.5+1e-13) = 2-4e-13, so
		// h0@1-1e-13 goes first, then h1 before h0's 2-1e-13.
		for _, tc := range []struct {
			active Counts
			want   []int
		}{
			{Counts{0, 0}, []int{1, 0}},
			{Counts{0, 3}, []int{0, 1}},
		} {
			b := mustBalancer(t, DefaultPolicy(LeastRequest), 0)
			b.Update([]uint32{1, 2}, tc.active)
			if got := picks(t, b, 2, tc.active); !slices.Equal(got, tc.want) {
				t.Errorf("counts %v: picks = %v, want %v", tc.active, got, tc.want)
			}
		}
	})
}

func TestEmptySet(t *testing.T) {
	for _, p := range []Policy{DefaultPolicy(RoundRobin), DefaultPolicy(LeastRequest)} {
		for name, weights := range map[string][]uint32{
			"never updated": nil,
			"empty":         {},
			"all zero":      {0, 0, 0},
		} {
			b := mustBalancer(t, p, 1)
			if weights != nil {
				b.Update(weights, nil)
			}
			// The host-source draw happens before Envoy finds no host.
			r := hostSourceDraws(t, 1)
			if h, ok := b.Pick(r, nil); ok || h != -1 {
				t.Errorf("%v %s: Pick = %d, %v; want -1, false", p, name, h, ok)
			}
			r.done()
		}
	}
}
