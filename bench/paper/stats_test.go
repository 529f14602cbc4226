package paper

import (
	"testing"
	"time"
)

func TestOverAllCountsFailuresAsMisses(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		name   string
		sorted []time.Duration
		n      int
		q      float64
		want   time.Duration
		wantOK bool
	}{
		{"all answered", ms(1, 2, 3, 4), 4, 0.5, 2 * time.Millisecond, true},
		{"failure above the quantile", ms(1, 2, 3), 4, 0.5, 2 * time.Millisecond, true},
		{"quantile on a failure", ms(1, 2, 3), 4, 0.95, 0, false},
		{"none answered", nil, 3, 0.5, 0, false},
		{"no requests", nil, 0, 0.5, 0, false},
	}
	for _, c := range cases {
		got, ok := overAll(c.sorted, c.n, c.q)
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: overAll = %v, %v; want %v, %v", c.name, got, ok, c.want, c.wantOK)
		}
	}
}

// A policy that fails its slowest requests fast must not hold an SLO that
// it would miss by answering them.
func TestMeetsSLOFailuresAreMisses(t *testing.T) {
	slo := 100 * time.Millisecond
	var answered []time.Duration
	for range 97 {
		answered = append(answered, 50*time.Millisecond)
	}
	s := reqStats{n: 100, ok: 97, ttft: answered, success: 0.97}
	// Over the answered requests alone the P95 is 50 ms; with the three
	// failures as misses the P95 is still an answer (rank 95 of 100).
	if !s.meetsSLO(slo) {
		t.Fatal("97 of 100 answered within the SLO: want held")
	}
	// 92 answered within, 3 late, 5 failed: over the answered 95 the P95
	// (rank 91) is within the SLO; over all 100 it (rank 95) is late.
	s = reqStats{n: 100, ok: 95, success: 0.95,
		ttft: append(append([]time.Duration{}, answered[:92]...), 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond)}
	if s.meetsSLO(slo) {
		t.Fatal("92 within, 3 late, 5 failed: want missed (the failures count as misses)")
	}
	// Six failures: success 0.94.
	s = reqStats{n: 100, ok: 94, ttft: answered[:94], success: 0.94}
	if s.meetsSLO(slo) {
		t.Fatal("success 0.94: want missed")
	}
}
