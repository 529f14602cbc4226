package lb

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func constWeights(w ...float64) func(int) float64 {
	return func(h int) float64 { return w[h] }
}

func edfPicks(t *testing.T, s *EDF, weight func(int) float64, n int) []int {
	t.Helper()
	got := make([]int, n)
	for i := range got {
		h, ok := s.PickAndAdd(weight)
		if !ok {
			t.Fatalf("pick %d: empty scheduler", i)
		}
		got[i] = h
	}
	return got
}

func TestEDF(t *testing.T) {
	tests := []struct {
		name    string
		weights []float64
		// build adds the hosts one by one with Add when picks < 0, and
		// uses NewEDFWithPicks(picks) otherwise.
		picks int64
		want  []int
	}{
		{
			// Add: h0 deadline 0.5 (order 0), h1 0.5 (1), h2 1.0 (2).
			// 1: h0@0.5 (earlier order) → re-add 1.0 (3)
			// 2: h1@0.5                 → 1.0 (4)
			// 3,4,5: three-way tie at 1.0, by order: h2 (2) → 2.0 (5),
			//        h0 (3) → 1.5 (6), h1 (4) → 1.5 (7)
			// 6,7: h0@1.5 (6) → 2.0 (8), h1@1.5 (7) → 2.0 (9)
			// 8,9,10: tie at 2.0 by order: h2 (5), h0 (8), h1 (9)
			name: "ties by insertion order", weights: []float64{2, 2, 1}, picks: -1,
			want: []int{0, 1, 2, 0, 1, 0, 1, 2, 0, 1},
		},
		{
			// createWithPicks(P=0): every host credited 0 picks, deadline
			// 1/(w+1e-13), so just below 1/w, orders 0,1,2; time 0.
			//  1: h2@1/3⁻ → 1/3⁻+1/3 = 2/3⁻      2: h1@1/2⁻ → 1⁻ (1-2.5e-14)
			//  3: h2@2/3⁻ → 1⁻ (1-1.1e-14)        4: h0@1-1e-13 → 2⁻
			//  5: h1@1-2.5e-14 → 3/2⁻             6: h2@1-1.1e-14 → 4/3⁻
			//  7: h2@4/3⁻ → 5/3⁻                  8: h1@3/2⁻ → 2-2.5e-14
			//  9: h2@5/3⁻ → 2-1.1e-14
			// 10-12: h0@2-1e-13, h1@2-2.5e-14, h2@2-1.1e-14.
			// (Without the epsilon the three would tie at 1 and 2 and the
			// insertion order would give the same h0, h1, h2.)
			name: "weights 1,2,3 from an empty schedule", weights: []float64{1, 2, 3}, picks: 0,
			want: []int{2, 1, 2, 0, 1, 2, 2, 1, 2, 0, 1, 2},
		},
		{
			// createWithPicks(P=5), W = 6+3e-13: floor(5·w/W) = 0, 1, 2
			// (0.83, 1.67, 2.5); none reaches P/W. Deadlines (p+1)/w:
			// h0 1-1e-13, h1 2/2⁻ = 1-2.5e-14, h2 3/3⁻ = 1-1.1e-14; time =
			// max p/w = 2/3⁻. 3 picks credited, 2 made for real:
			// h0@1-1e-13 → 2⁻, h1@1-2.5e-14 → 3/2⁻. From there the
			// schedule is the empty one's from pick 6 on: h2 h2 h1 h2 h0
			// h1 h2.
			name: "weights 1,2,3 five picks in", weights: []float64{1, 2, 3}, picks: 5,
			want: []int{2, 2, 1, 2, 0, 1, 2},
		},
		{
			// picks is reduced mod 429496729 first: same as P=5.
			name: "pre-picks modulo 429496729", weights: []float64{1, 2, 3}, picks: 429496729 + 5,
			want: []int{2, 2, 1, 2, 0, 1, 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := constWeights(tt.weights...)
			hosts := make([]int, len(tt.weights))
			for i := range hosts {
				hosts[i] = i
			}
			var s *EDF
			if tt.picks < 0 {
				s = NewEDF()
				for _, h := range hosts {
					s.Add(w(h), h)
				}
			} else {
				s = NewEDFWithPicks(hosts, w, uint32(tt.picks))
			}
			if got := edfPicks(t, s, w, len(tt.want)); !slices.Equal(got, tt.want) {
				t.Errorf("picks = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEDFEmpty(t *testing.T) {
	for name, s := range map[string]*EDF{
		"NewEDF":          NewEDF(),
		"NewEDFWithPicks": NewEDFWithPicks(nil, constWeights(), 7),
	} {
		if h, ok := s.PickAndAdd(constWeights()); ok || h != -1 {
			t.Errorf("%s: PickAndAdd = %d, %v; want -1, false", name, h, ok)
		}
	}
}

// TestEDFWeightReadOnlyOnAdd: the weight function is consulted for the
// picked host only, when it is re-added; a change of another host's weight
// does not move that host's deadline.
func TestEDFWeightReadOnlyOnAdd(t *testing.T) {
	w := []float64{1, 1}
	weight := func(h int) float64 { return w[h] }
	s := NewEDF()
	s.Add(1, 0) // deadline 1 (order 0)
	s.Add(1, 1) // deadline 1 (order 1)
	// h0@1 → re-added with weight 1 → 2.
	if h, _ := s.PickAndAdd(weight); h != 0 {
		t.Fatalf("pick 1 = %d, want 0", h)
	}
	// h1's weight rises to 100, but its deadline stays 1 until it is
	// picked: h1@1 → re-added with weight 100 → 1.01.
	w[1] = 100
	var got []int
	for range 3 {
		h, _ := s.PickAndAdd(weight)
		got = append(got, h)
	}
	// h1@1 → 1.01, h1@1.01 → 1.02, h1@1.02 → 1.03 (h0 waits at 2).
	if want := []int{1, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("picks = %v, want %v", got, want)
	}
	if s.Len() != 2 {
		t.Errorf("Len = %d, want 2", s.Len())
	}
}

// TestEDFVectors replays testdata/edf_vectors.txt: pick sequences from a
// C++ transcription of Envoy's EdfScheduler (createWithPicks with large and
// small pre-pick counts, weights that are multiples of each other, and
// weights that change between picks), to pin the floating-point arithmetic
// and tie-breaking to Envoy's.
func TestEDFVectors(t *testing.T) {
	f, err := os.Open("testdata/edf_vectors.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases := 0
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		cases++
		head, tail, ok := strings.Cut(text, "|")
		fields := strings.Fields(head)
		if !ok || len(fields) < 3 {
			t.Fatalf("line %d: malformed %q", line, text)
		}
		picks, err1 := strconv.ParseUint(fields[0], 10, 32)
		dynamic := fields[1] == "1"
		w := make([]float64, len(fields)-2)
		hosts := make([]int, len(w))
		for i, s := range fields[2:] {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || err1 != nil {
				t.Fatalf("line %d: %v %v", line, err1, err)
			}
			w[i], hosts[i] = v, i
		}
		var want []int
		for _, s := range strings.Fields(tail) {
			h, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("line %d: %v", line, err)
			}
			want = append(want, h)
		}
		made := 0
		weight := func(h int) float64 {
			if !dynamic {
				return w[h]
			}
			return w[h] / float64(1+(7*made+3*h)%5)
		}
		s := NewEDFWithPicks(hosts, weight, uint32(picks))
		got := make([]int, len(want))
		for i := range got {
			got[i], _ = s.PickAndAdd(weight)
			made++
		}
		if !slices.Equal(got, want) {
			t.Errorf("line %d (picks %d, dynamic %v, weights %v):\n got  %v\n want %v", line, picks, dynamic, w, got, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < 300 {
		t.Fatalf("only %d vectors read", cases)
	}
}
