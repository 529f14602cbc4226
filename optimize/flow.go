package optimize

import "math"

// flowNet is a directed network for maximum flow (Dinic's algorithm) with
// float capacities. Edge e's reverse is e^1; res holds the residual
// capacities, cap the capacities maxFlow starts from.
type flowNet struct {
	head  []int
	next  []int
	to    []int
	cap   []float64
	res   []float64
	level []int
	iter  []int
	queue []int
}

func (f *flowNet) init(nodes int) {
	f.head = make([]int, nodes)
	for v := range f.head {
		f.head[v] = -1
	}
	f.level = make([]int, nodes)
	f.iter = make([]int, nodes)
}

// add adds an edge u→v of capacity c and returns its index.
func (f *flowNet) add(u, v int, c float64) int {
	e := len(f.to)
	f.to = append(f.to, v, u)
	f.cap = append(f.cap, c, 0)
	f.res = append(f.res, 0, 0)
	f.next = append(f.next, f.head[u], f.head[v])
	f.head[u], f.head[v] = e, e+1
	return e
}

// maxFlow returns the maximum flow from s to t from scratch; residual
// capacities at or below eps count as saturated.
func (f *flowNet) maxFlow(s, t int, eps float64) float64 {
	copy(f.res, f.cap)
	var total float64
	for f.levels(s, t, eps) {
		copy(f.iter, f.head)
		for {
			pushed := f.push(s, t, math.Inf(1), eps)
			if pushed <= eps {
				break
			}
			total += pushed
		}
	}
	return total
}

// levels builds the BFS levels from s over edges with residual above eps
// and reports whether t is reached.
func (f *flowNet) levels(s, t int, eps float64) bool {
	for v := range f.level {
		f.level[v] = -1
	}
	f.level[s] = 0
	q := append(f.queue[:0], s)
	for k := 0; k < len(q); k++ {
		v := q[k]
		for e := f.head[v]; e >= 0; e = f.next[e] {
			if w := f.to[e]; f.res[e] > eps && f.level[w] < 0 {
				f.level[w] = f.level[v] + 1
				q = append(q, w)
			}
		}
	}
	f.queue = q
	return f.level[t] >= 0
}

// push sends up to limit from v to t along level-increasing edges (a
// blocking-flow step) and returns what it sent.
func (f *flowNet) push(v, t int, limit, eps float64) float64 {
	if v == t {
		return limit
	}
	for ; f.iter[v] >= 0; f.iter[v] = f.next[f.iter[v]] {
		e := f.iter[v]
		w := f.to[e]
		if f.res[e] <= eps || f.level[w] != f.level[v]+1 {
			continue
		}
		if d := f.push(w, t, min(limit, f.res[e]), eps); d > eps {
			f.res[e] -= d
			f.res[e^1] += d
			return d
		}
	}
	return 0
}

// reachesSink returns, per node, whether it reaches t over edges whose
// residual capacity exceeds eps (after maxFlow).
func (f *flowNet) reachesSink(t int, eps float64) []bool {
	seen := make([]bool, len(f.head))
	seen[t] = true
	q := append(f.queue[:0], t)
	for k := 0; k < len(q); k++ {
		v := q[k]
		// Edges into v are the reverses of the edges out of v.
		for e := f.head[v]; e >= 0; e = f.next[e] {
			u := f.to[e]
			if !seen[u] && f.res[e^1] > eps {
				seen[u] = true
				q = append(q, u)
			}
		}
	}
	f.queue = q
	return seen
}

// fromSource returns, per node, whether s reaches it over edges whose
// residual capacity exceeds eps (after maxFlow: the source side of a
// minimum cut).
func (f *flowNet) fromSource(s int, eps float64) []bool {
	seen := make([]bool, len(f.head))
	seen[s] = true
	q := append(f.queue[:0], s)
	for k := 0; k < len(q); k++ {
		v := q[k]
		for e := f.head[v]; e >= 0; e = f.next[e] {
			if w := f.to[e]; !seen[w] && f.res[e] > eps {
				seen[w] = true
				q = append(q, w)
			}
		}
	}
	f.queue = q
	return seen
}
