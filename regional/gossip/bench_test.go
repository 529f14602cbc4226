package gossip

import (
	"fmt"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// maximal is a summary at the proto's stated limits: 64 models, 8 context
// classes each, an RTT entry per other region.
func maximal(region string, seq uint64, regions int) *isobarpb.RegionSummary {
	s := summary(region, "incarnation-0123456789abcdef", seq, 64)
	for _, m := range s.Models {
		m.CellsLoading, m.CellsDraining, m.CellsFailed, m.CellsTerminated, m.FallbackCells = 1, 2, 3, 4, 5
		m.ContextClasses = nil
		for c := range 8 {
			m.ContextClasses = append(m.ContextClasses, &isobarpb.ContextClass{
				MaxTokens: uint32(2048 << c), Cells: uint32(c + 1), CapacityRps: 10.1 + float64(c)})
		}
	}
	for r := range regions - 1 {
		s.Rtt = append(s.Rtt, &isobarpb.PeerRTT{Region: fmt.Sprintf("region-%02d", r), RttMs: 42.42})
	}
	return s
}

// A summary at the proto's stated limits fits the default cap.
func TestMaximalSummarySize(t *testing.T) {
	for _, regions := range []int{3, 32} {
		n := len(mustMarshal(t, maximal("eu-west-1", 1, regions)))
		t.Logf("maximal summary, %d regions: %d bytes (cap %d)", regions, n, DefaultMaxSummaryBytes)
		if n > DefaultMaxSummaryBytes {
			t.Errorf("a summary within the proto's limits (%d bytes) exceeds DefaultMaxSummaryBytes", n)
		}
	}
}

// BenchmarkReceive is the cost of judging and applying one new summary
// (decode, signature check, store) for a typical and a maximal summary.
func BenchmarkReceive(b *testing.B) {
	x := newPeer(b, "regional/x", RoleRegional, "x")
	for _, tc := range []struct {
		name string
		make func(seq uint64) *isobarpb.RegionSummary
	}{
		{"models=2", func(seq uint64) *isobarpb.RegionSummary { return summary("x", "i", seq, 2) }},
		{"models=64", func(seq uint64) *isobarpb.RegionSummary { return maximal("x", seq, 32) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const n = 256
			envs := make([][]byte, n)
			for i := range envs {
				envs[i] = x.env(b, tc.make(uint64(i+1)))
			}
			b.SetBytes(int64(len(envs[0])))
			bk := testBook(b, clockwork.NewFakeClockAt(t0), nil, x)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%n == 0 {
					bk.held = map[string]*heldSummary{}
				}
				if v := bk.receive(envs[i%n]); v != applied {
					b.Fatalf("verdict %q", v)
				}
			}
		})
	}
}
