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

// idealBand is the band f falls in without hysteresis.
func idealBand(f float64, n int) int {
	k := 0
	for k+1 < n && f < bandEdge(k+1) {
		k++
	}
	return k
}

// nextBand moves from band cur (−1: none yet) to the band f calls for,
// with hysteresis h on the edges.
func nextBand(cur int, f, h float64, n int) int {
	if cur < 0 || cur >= n {
		return idealBand(f, n)
	}
	for cur+1 < n && f < bandEdge(cur+1)*(1-h) {
		cur++
	}
	for cur > 0 && f >= bandEdge(cur)*(1+h) {
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
