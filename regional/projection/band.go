package projection

import "math"

// Bands: a cell's capacity fraction f in (0,1] (relative speed × lifecycle
// ramp) is quantised into Config.Bands levels. Band k (0 = top) carries
// weight MaxWeight/2^k. The edge between band k−1 and band k is the
// geometric middle of their levels, e_k = 2^−(k−½) (0.707, 0.354, ...).
// A cell in band c moves down only when f < e_{c+1}·(1−h) and up only when
// f ≥ e_c·(1+h), h = Config.BandHysteresis, so a value wandering around an
// edge by less than h·e cannot make the band flap. A cell seen for the first
// time takes the band its f falls in, without the margin.

// bandEdge is the lower edge of band k ≥ 1 (and the upper edge of band k).
func bandEdge(k int) float64 { return math.Exp2(-(float64(k) - 0.5)) }

// bands holds, for one Config, each band's edges with and without the
// hysteresis margin and its weight, computed once (New) from bandEdge and
// bandWeight: the projection looks at every cell's band every cycle, and
// math.Exp2 per cell was a sixth of its cost at 10,000 cells.
type bands struct {
	n int
	// edge[k] is bandEdge(k); down[k] = edge[k]·(1−h), up[k] = edge[k]·(1+h)
	// (k ≥ 1; index 0 unused).
	edge, down, up [maxBands]float64
	weight         [maxBands]uint32
}

func newBands(n int, h float64, maxWeight uint32) bands {
	b := bands{n: n}
	for k := range n {
		b.weight[k] = bandWeight(maxWeight, k)
		if k > 0 {
			b.edge[k] = bandEdge(k)
			b.down[k], b.up[k] = b.edge[k]*(1-h), b.edge[k]*(1+h)
		}
	}
	return b
}

// ideal is the band f falls in without hysteresis.
func (b *bands) ideal(f float64) int {
	k := 0
	for k+1 < b.n && f < b.edge[k+1] {
		k++
	}
	return k
}

// next moves from band cur (−1: none yet) to the band f calls for, with
// the hysteresis on the edges.
func (b *bands) next(cur int, f float64) int {
	if cur < 0 || cur >= b.n {
		return b.ideal(f)
	}
	for cur+1 < b.n && f < b.down[cur+1] {
		cur++
	}
	for cur > 0 && f >= b.up[cur] {
		cur--
	}
	return cur
}

// bandWeight is the weight of band k.
func bandWeight(maxWeight uint32, k int) uint32 {
	return uint32(math.Max(1, math.Round(float64(maxWeight)/math.Exp2(float64(k)))))
}

// Band names shown in Weight.Band.
const (
	BandOut   = "out"   // not in the load balancer
	BandProbe = "probe" // a probation probe slot (the lowest band's weight)
	BandFull  = "full"  // band 0
)

// bandNames are the names of bands 0 to maxBands−1.
var bandNames = [maxBands]string{BandFull, "1/2", "1/4", "1/8", "1/16", "1/32", "1/64"}

// maxBands bounds Config.Bands.
const maxBands = 7
