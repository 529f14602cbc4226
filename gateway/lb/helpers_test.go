package lb

import (
	"math/rand/v2"
	"testing"
)

var _ Rand = (*rand.Rand)(nil)

// x is the value scripted for the random draw chooseHostOnce makes for the
// host source; with one priority its value cannot matter.
const x = 0xdead

// script is a Rand that returns scripted values in order. It fails the test
// when asked for more draws than scripted, and done fails it when fewer
// were taken: a pick must consume exactly the draws Envoy would.
type script struct {
	t    testing.TB
	vals []uint64
	i    int
}

func newScript(t testing.TB, vals ...uint64) *script { return &script{t: t, vals: vals} }

func (s *script) Uint64() uint64 {
	s.t.Helper()
	if s.i >= len(s.vals) {
		s.t.Fatalf("random source exhausted after %d draws (%v)", s.i, s.vals)
	}
	v := s.vals[s.i]
	s.i++
	return v
}

func (s *script) done() {
	s.t.Helper()
	if s.i != len(s.vals) {
		s.t.Errorf("%d of %d scripted draws used (%v)", s.i, len(s.vals), s.vals)
	}
}

// hostSourceDraws is a script of n host-source draws and nothing else: the
// draws of n round-robin or EDF picks.
func hostSourceDraws(t testing.TB, n int) *script {
	vals := make([]uint64, n)
	for i := range vals {
		vals[i] = x
	}
	return newScript(t, vals...)
}

func mustBalancer(t testing.TB, p Policy, seed uint64) *Balancer {
	t.Helper()
	b, err := NewBalancer(p, seed)
	if err != nil {
		t.Fatalf("NewBalancer(%v, %d): %v", p, seed, err)
	}
	return b
}

// picks makes n picks with the given (constant) active counts and returns
// the hosts.
func picks(t testing.TB, b *Balancer, n int, active Active) []int {
	t.Helper()
	r := hostSourceDraws(t, n)
	got := make([]int, n)
	for i := range got {
		h, ok := b.Pick(r, active)
		if !ok {
			t.Fatalf("pick %d: ok=false (%v)", i, b)
		}
		got[i] = h
	}
	r.done()
	return got
}
