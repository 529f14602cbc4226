package optimize

import (
	"math"
)

// pricer finds every source's cheapest option, min(P, min_j rtt_ij + mu_j),
// exactly, without scanning every destination. The usable destinations
// are grouped into clusters of nearby regions, and the clusters into
// groups (farthest-first traversals on the RTTs, so that members lie
// within a small RTT of their centre). For each source and cluster (and
// group) it keeps the smallest RTT to a member, and for each cluster (and
// group) the smallest mu of the round. Their sum is a lower bound of every
// member's cost (IEEE addition is monotone), so a group or cluster whose
// bound exceeds the best cost found so far cannot hold the cheapest option
// and is skipped. Bounds equal to the best are scanned, so the result,
// ties included (the lowest index among equal costs), is the full scan's.
//
// The RTTs are copied in cluster order, so a scanned cluster is read as one
// contiguous run.
type pricer struct {
	n, m, g, ng int
	dest        []int32   // position → destination, clusters in order
	from        []int32   // cluster k holds positions from[k] to from[k+1]
	gfrom       []int32   // group s holds clusters gfrom[s] to gfrom[s+1]
	cl          []int32   // destination → its cluster (-1: not usable)
	rtt         []float64 // n×m: rtt[i*m+pos] = RTT from source i to dest[pos]
	lb          []float64 // n×g: smallest RTT from source i into cluster k
	glb         []float64 // n×ng: smallest RTT from source i into group s
	mu          []float64 // per position: mu of dest[pos], per round
	muMin       []float64 // per cluster: the smallest mu of the round
	gmuMin      []float64 // per group: the smallest mu of the round
	seed        []int32   // per source: the cluster scanned first (last best)
}

// pricerFrom is the number of regions from which Solve prices with a
// pricer; below it a full scan is as cheap.
const pricerFrom = 128

// farthestFirst partitions members into at most want clusters by a
// farthest-first traversal: each new centre is the member farthest from
// the centres so far (the first in members among ties), and every member
// joins its nearest centre. It sets cl[j] to first plus the cluster of
// member j and returns the number of clusters; dist is scratch.
func farthestFirst(rtt [][]float64, members []int32, want int, first int32, cl []int32, dist []float64) int {
	for _, j := range members {
		dist[j] = math.Inf(1)
		cl[j] = -1
	}
	c := members[0]
	g := 0
	for g < want {
		row := rtt[c]
		far, next := -1.0, int32(-1)
		for _, j := range members {
			if d := row[j]; d < dist[j] || cl[j] < 0 {
				dist[j], cl[j] = d, first+int32(g)
			}
			if dist[j] > far {
				far, next = dist[j], j
			}
		}
		g++
		if far <= 0 {
			break // every member sits on a centre
		}
		c = next
	}
	return g
}

// newPricer groups the usable destinations of m into about √(16n)
// clusters in about √√(16n) groups and copies the RTT matrix in cluster
// order.
func newPricer(m *model) *pricer {
	n := m.n
	var usable []int32
	for j := range n {
		if m.srv[j].usable {
			usable = append(usable, int32(j))
		}
	}
	pr := &pricer{n: n, m: len(usable), cl: make([]int32, n), seed: make([]int32, n)}
	for j := range pr.cl {
		pr.cl[j] = -1
	}
	if len(usable) == 0 {
		return pr
	}
	want := math.Sqrt(16 * float64(n))
	dist := make([]float64, n)
	// Groups first, then the clusters of each group, numbered in group
	// order, about want in all.
	grp := make([]int32, n)
	ng := farthestFirst(m.rtt, usable, int(math.Round(math.Sqrt(want))), 0, grp, dist)
	byGroup := make([][]int32, ng)
	for _, j := range usable {
		byGroup[grp[j]] = append(byGroup[grp[j]], j)
	}
	pr.gfrom = make([]int32, ng+1)
	g := 0
	for s, members := range byGroup {
		k := max(1, int(math.Round(want*float64(len(members))/float64(len(usable)))))
		g += farthestFirst(m.rtt, members, k, int32(g), pr.cl, dist)
		pr.gfrom[s+1] = int32(g)
	}
	pr.g, pr.ng = g, ng
	// Positions: clusters in order, members by index within each.
	pr.from = make([]int32, g+1)
	for _, j := range usable {
		pr.from[pr.cl[j]+1]++
	}
	for k := range g {
		pr.from[k+1] += pr.from[k]
	}
	pr.dest = make([]int32, len(usable))
	fill := append([]int32(nil), pr.from[:g]...)
	for _, j := range usable {
		k := pr.cl[j]
		pr.dest[fill[k]] = j
		fill[k]++
	}
	pr.gatherRTT(m)
	mm := pr.m
	pr.mu = make([]float64, mm)
	pr.muMin = make([]float64, g)
	pr.gmuMin = make([]float64, ng)
	return pr
}

// gatherRTT copies m's RTT matrix in cluster order and computes each
// source's lower bound per cluster and per group.
func (pr *pricer) gatherRTT(m *model) {
	n, g, ng := pr.n, pr.g, pr.ng
	mm := pr.m
	pr.rtt = make([]float64, n*mm)
	pr.lb = make([]float64, n*g)
	pr.glb = make([]float64, n*ng)
	buf := make([]float64, n) // the source's row, in cache for the gather
	for i := range n {
		copy(buf, m.rtt[i])
		row := pr.rtt[i*mm : (i+1)*mm : (i+1)*mm]
		for pos, j := range pr.dest {
			row[pos] = buf[j]
		}
		lb := pr.lb[i*g : (i+1)*g : (i+1)*g]
		for k := range lb {
			lo := math.Inf(1)
			for _, v := range row[pr.from[k]:pr.from[k+1]] {
				lo = min(lo, v)
			}
			lb[k] = lo
		}
		glb := pr.glb[i*ng : (i+1)*ng : (i+1)*ng]
		for s := range glb {
			lo := math.Inf(1)
			for _, v := range lb[pr.gfrom[s]:pr.gfrom[s+1]] {
				lo = min(lo, v)
			}
			glb[s] = lo
		}
		if k := pr.cl[i]; k >= 0 {
			pr.seed[i] = k
		}
	}
}

// load takes the round's marginal latencies (per destination).
func (pr *pricer) load(mu []float64) {
	for pos, j := range pr.dest {
		pr.mu[pos] = mu[j]
	}
	for k := range pr.muMin {
		lo := math.Inf(1)
		for _, v := range pr.mu[pr.from[k]:pr.from[k+1]] {
			lo = min(lo, v)
		}
		pr.muMin[k] = lo
	}
	for s := range pr.gmuMin {
		lo := math.Inf(1)
		for _, v := range pr.muMin[pr.gfrom[s]:pr.gfrom[s+1]] {
			lo = min(lo, v)
		}
		pr.gmuMin[s] = lo
	}
}

// cheapest returns min(P, min_j rtt_ij + mu_j) for source i and its
// destination (-1: shed), exactly as model.cheapest does. It scans the
// cluster of i's last cheapest option first, then every cluster whose
// bound, and its group's, does not exceed the best so far. It writes only
// seed[i].
func (pr *pricer) cheapest(i int, P float64) (float64, int) {
	best, at := P, -1
	if pr.g == 0 {
		return best, at
	}
	mm, g, ng := pr.m, pr.g, pr.ng
	row := pr.rtt[i*mm : (i+1)*mm : (i+1)*mm]
	lb := pr.lb[i*g : (i+1)*g : (i+1)*g]
	glb := pr.glb[i*ng : (i+1)*ng : (i+1)*ng]
	mu := pr.mu[:mm:mm]
	from := pr.from[: g+1 : g+1]
	muMin := pr.muMin[:g:g]
	gmuMin := pr.gmuMin[:ng:ng]
	k0 := int(pr.seed[i])
	best, at = pr.scan(row, mu, from[k0], from[k0+1], best, at)
	bestK := k0
	for s := range ng {
		if glb[s]+gmuMin[s] > best {
			continue
		}
		k1, k2 := int(pr.gfrom[s]), int(pr.gfrom[s+1])
		lbs := lb[k1:k2]
		mins := muMin[k1:k2]
		mins = mins[:len(lbs)]
		for dk, l := range lbs {
			if l+mins[dk] > best {
				continue
			}
			if k := k1 + dk; k != k0 {
				was := at
				if best, at = pr.scan(row, mu, from[k], from[k+1], best, at); at != was {
					bestK = k
				}
			}
		}
	}
	if at >= 0 {
		pr.seed[i] = int32(bestK)
	}
	return best, at
}

// scan looks for options cheaper than best (or as cheap, at a lower index
// than at) among positions lo to hi of a source's row.
func (pr *pricer) scan(row, mu []float64, lo, hi int32, best float64, at int) (float64, int) {
	rs := row[lo:hi]
	ms := mu[lo:hi]
	ms = ms[:len(rs)]
	for q, r := range rs {
		if c := r + ms[q]; c <= best {
			if j := int(pr.dest[int(lo)+q]); c < best || (at >= 0 && j < at) {
				best, at = c, j
			}
		}
	}
	return best, at
}
