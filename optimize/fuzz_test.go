package optimize

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// problemFromBytes decodes arbitrary bytes into a small problem: every
// number, including NaN, ±Inf and negatives, can come out, so Validate
// and Solve see the outside input's worst.
func problemFromBytes(data []byte) Problem {
	next := func() float64 {
		if len(data) < 8 {
			data = nil
			return 0
		}
		v := math.Float64frombits(binary.LittleEndian.Uint64(data))
		data = data[8:]
		return v
	}
	if len(data) == 0 {
		return Problem{}
	}
	n := int(data[0]%5) + 1
	flags := data[0] >> 3
	data = data[1:]
	p := Problem{Regions: make([]Region, n), RTTms: make([][]float64, n)}
	if flags&1 != 0 {
		p.Headroom, p.Beta, p.K, p.ShedPenaltyMs = next(), next(), next(), next()
	}
	for i := range n {
		p.Regions[i] = Region{Name: regionName(i), DemandRPS: next(), CapacityRPS: next(), EngineLatencyMs: next(), Down: flags&2 != 0 && i == 0}
		p.RTTms[i] = make([]float64, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			v := next()
			p.RTTms[i][j], p.RTTms[j][i] = v, v
		}
	}
	return p
}

func f64s(vs ...float64) []byte {
	out := []byte{}
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint64(out, math.Float64bits(v))
	}
	return out
}

func FuzzSolve(f *testing.F) {
	// The worked example, an overloaded pair, garbage numbers.
	f.Add(append([]byte{2}, f64s(90, 100, 300, 120, 100, 300, 40, 80, 300, 20, 60, 30)...))
	f.Add(append([]byte{1 | 1<<3}, f64s(0.9, 0.1, 4, 10000, 500, 100, 300, 10, 100, 250, 15)...))
	f.Add(append([]byte{3 | 2<<3}, f64s(math.NaN(), -1, math.Inf(1), 1e300, 0, 5e-324)...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := problemFromBytes(data)
		if err := p.Validate(); err != nil {
			if !errors.Is(err, ErrInvalidProblem) {
				t.Fatalf("Validate error %v does not wrap ErrInvalidProblem", err)
			}
			if _, err := Solve(p); err == nil {
				t.Fatalf("Solve accepted a problem Validate refused")
			}
			return
		}
		p.MaxIterations = 200
		pl, err := Solve(p)
		if err != nil {
			t.Fatalf("Solve: %v", err)
		}
		checkPlan(t, p, pl)
		if got := Damp(p, LocalOnly(p), pl, 0.3); got.CostMs > LocalOnly(p).CostMs*(1+1e-9) {
			t.Fatalf("Damp cost %v above local-only", got.CostMs)
		}
	})
}
