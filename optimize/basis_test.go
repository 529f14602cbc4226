package optimize

import (
	"math"
	"testing"
)

// checkBasis asserts what the pivots and settles keep of the basis: every
// destination lists exactly the edges into it, at their index; every tree
// edge satisfies rtt + pot[option] = pot[source]; parents are tree
// neighbours one level up.
func checkBasis(t *testing.T, s *solver, when string) {
	t.Helper()
	listed := 0
	for j := range s.n {
		for _, r := range s.dsrc[j] {
			listed++
			if e := s.edges[r.i][r.k]; e.o != j {
				t.Fatalf("%s: destination %d lists edge %d of source %d, which goes to %d", when, j, r.k, r.i, e.o)
			}
		}
	}
	for i := range s.n {
		for _, e := range s.edges[i] {
			if e.o < s.n {
				listed--
			}
			on := s.optNode(i, e.o)
			if d := e.rtt + s.nd[on].pot - s.nd[i].pot; math.Abs(d) > 1e-9*math.Max(1, math.Abs(s.nd[i].pot)) {
				t.Fatalf("%s: edge %d→%d: rtt + pot[option] − pot[source] = %v", when, i, e.o, d)
			}
			if e.rtt != s.rttTo(i, e.o) {
				t.Fatalf("%s: edge %d→%d: rtt %v, want %v", when, i, e.o, e.rtt, s.rttTo(i, e.o))
			}
		}
	}
	if listed != 0 {
		t.Fatalf("%s: the destinations list %d edges more than there are", when, listed)
	}
	for v, x := range s.nd {
		if x.par < 0 {
			continue
		}
		a, b := v, x.par
		if a >= s.n {
			a, b = b, a
		}
		if a >= s.n || b < s.n {
			t.Fatalf("%s: node %d has parent %d: not a source and an option", when, v, x.par)
		}
		src, o := s.edgeEnds(a, b)
		if s.findEdge(src, o) < 0 {
			t.Fatalf("%s: node %d has parent %d, but no edge joins them", when, v, x.par)
		}
		if x.depth != s.nd[x.par].depth+1 {
			t.Fatalf("%s: node %d at depth %d under %d at depth %d", when, v, x.depth, x.par, s.nd[x.par].depth)
		}
	}
}

// TestBasisInvariants drives the solver phase by phase and checks the
// basis after the start, after the edges enter and after the settles.
func TestBasisInvariants(t *testing.T) {
	for seed := range uint64(3) {
		for _, n := range []int{50, 300} {
			p := randomProblem(newRand(seed, uint64(n)), n)
			m := compile(p.withDefaults())
			s := newSolver(&m)
			s.start()
			checkBasis(t, s, "start")
			for range 40 {
				if s.price(); len(s.cands) == 0 {
					break
				}
				s.enterAll()
				checkBasis(t, s, "enter")
				s.settlePending()
				checkBasis(t, s, "settle")
			}
		}
	}
}
