package summary

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// extreme draws a value from the edges a hostile or broken input reaches
// for: zero, negative, tiny, normal, at and past the bounds, huge, NaN and
// the infinities.
func extreme(rng *rand.Rand) float64 {
	switch rng.IntN(12) {
	case 0:
		return 0
	case 1:
		return -rng.Float64() * 1e6
	case 2:
		return math.NaN()
	case 3:
		return math.Inf(1)
	case 4:
		return math.Inf(-1)
	case 5:
		return math.MaxFloat64
	case 6:
		return MaxRateRPS * (1 + rng.Float64())
	case 7:
		return MaxTTFTSeconds * (1 + rng.Float64())
	case 8:
		return rng.Float64() * 1e12
	case 9:
		return math.SmallestNonzeroFloat64
	default:
		return rng.Float64() * 10
	}
}

func optExtreme(rng *rand.Rand) *float64 {
	if rng.IntN(5) == 0 {
		return nil
	}
	v := extreme(rng)
	return &v
}

// Whatever Aggregate is given, its summary passes Validate: every
// aggregate saturates at the shared bounds (bounds.go) rather than produce
// a summary the global controller and gossip peers would drop.
func TestAggregateAlwaysValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 3))
	states := []int32{0, 1, 2, 3, 4, 5, 6}
	for trial := range 300 {
		n := rng.IntN(40)
		if trial%50 == 0 {
			n = 5000 // sums of many saturated cells
		}
		in := Input{Region: "r1", Incarnation: "i", Sequence: 1, Now: now, DefaultEngineLatencyMs: extreme(rng),
			Demand: map[string]float64{"m0": extreme(rng), "m1": extreme(rng), "": 1, string(make([]byte, 300)): 1},
			RTT:    map[string]time.Duration{"r2": time.Duration(rng.Int64()), "r3": -time.Second, "r1": time.Second}}
		for range n {
			c := Cell{
				Model: []string{"m0", "m1", "m2"}[rng.IntN(3)], State: isobarpb.LifecycleState(states[rng.IntN(len(states))]),
				Pressure: extreme(rng), Fallback: rng.IntN(2) == 0, CapacityRPS: extreme(rng), CapacityConfidence: extreme(rng),
				LoadRPS: extreme(rng), TTFTP95: optExtreme(rng), ErrorRate: optExtreme(rng), WindowRequests: optExtreme(rng),
				KVUsage: optExtreme(rng), LowLoadTTFT: optExtreme(rng), MaxModelLen: rng.Uint32(),
			}
			if trial%50 == 0 {
				c.State, c.CapacityRPS, c.LoadRPS = ready, MaxRateRPS, MaxRateRPS
			}
			in.Cells = append(in.Cells, c)
		}
		s := Aggregate(in)
		if err := Validate(s); err != nil {
			t.Fatalf("trial %d (%d cells): Aggregate's summary fails Validate: %v", trial, n, err)
		}
		if err := ValidateAt(s, now); err != nil {
			t.Fatalf("trial %d: ValidateAt(now): %v", trial, err)
		}
	}
}

// The reproduction at the summary level: a cell's TTFT P95 of
// 1e5 s (above the 86,400 s bound) saturates instead of invalidating the
// region's summary.
func TestAggregateSaturatesTTFT(t *testing.T) {
	in := fleet(3)
	in.Cells[0].TTFTP95 = f64(1e5)
	in.Cells[0].Pressure = 0.1
	in.Cells[1].LowLoadTTFT = f64(1e6)
	s := Aggregate(in)
	if err := Validate(s); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got := s.Models[0].TtftP95Seconds; got != MaxTTFTSeconds {
		t.Fatalf("ttft_p95_seconds = %v, want saturated at %v", got, MaxTTFTSeconds)
	}
}

// ValidateAt refuses a summary dated beyond MaxFutureSkew ahead of the
// receiver's clock and accepts one within it (or in the past).
func TestValidateAtFuture(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration
		ok    bool
	}{
		{"past", -time.Hour, true},
		{"now", 0, true},
		{"within skew", MaxFutureSkew, true},
		{"just beyond", MaxFutureSkew + time.Millisecond, false},
		{"a year ahead", 365 * 24 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Aggregate(fleet(3))
			s.At = timestamppb.New(now.Add(tc.ahead))
			if err := Validate(s); err != nil {
				t.Fatalf("Validate (no clock) = %v, want nil", err)
			}
			err := ValidateAt(s, now)
			if tc.ok && err != nil {
				t.Fatalf("ValidateAt = %v, want nil", err)
			}
			if !tc.ok && (!errors.Is(err, ErrFuture) || !errors.Is(err, ErrInvalid)) {
				t.Fatalf("ValidateAt = %v, want ErrFuture and ErrInvalid", err)
			}
		})
	}
}
