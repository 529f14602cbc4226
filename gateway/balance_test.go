package gateway

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// lockedRand is a seeded lb.Rand safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(a, b uint64) *lockedRand { return &lockedRand{r: rand.New(rand.NewPCG(a, b))} }

func (l *lockedRand) Uint64() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Uint64()
}

// testCluster builds a cluster of one priority whose endpoints have the
// given weights, localities (index into locWeights; nil: all in one) and
// in-flight counts, for picker pk.
func testCluster(t *testing.T, pol *xdsclient.ClusterPolicy, weights []uint32, inflight []int64, loc []int, locWeights []uint32,
	pk *balancer) (*clusterRT, []*hostState) {
	t.Helper()
	var eps []xdsclient.Endpoint
	hs := map[string]*hostState{}
	var states []*hostState
	for i, w := range weights {
		e := xdsclient.Endpoint{Cell: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Weight: w, Region: "r1",
			Zone: "z0", LocalityWeight: 1}
		if loc != nil {
			e.Zone, e.LocalityWeight = fmt.Sprintf("z%d", loc[i]), locWeights[loc[i]]
		}
		eps = append(eps, e)
		st := &hostState{addr: e.Address}
		if inflight != nil {
			st.inflight.Store(inflight[i])
		}
		hs[e.Address] = st
		states = append(states, st)
	}
	return buildCluster("c", pol, eps, &clusterState{}, hs, "r1", map[string]struct{}{}, pk), states
}

// indexOf returns the index of h among the cluster's endpoints.
func indexOf(c *clusterRT, h *hostRT) int {
	for i, x := range c.all {
		if x == h {
			return i
		}
	}
	return -1
}

// The gateway's pick, through its own entry point and with an injected
// random source, is gateway/lb's Envoy pick on the same inputs: the same
// seed (the first value the source gives), the same random values, the
// same in-flight counts, and a refresh when outlier detection ejects a
// host. EDF for unequal weights, round robin, power of N choices and full
// scan for equal ones; the rr and lr baselines are Envoy's defaults over
// equal weights.
func TestPickMatchesEnvoy(t *testing.T) {
	lr := func(choice uint32, full bool, bias float64) *xdsclient.ClusterPolicy {
		return &xdsclient.ClusterPolicy{LBPolicy: xdsclient.LBLeastRequest, ChoiceCount: choice, FullScan: full, ActiveRequestBias: bias}
	}
	rrPol := &xdsclient.ClusterPolicy{LBPolicy: xdsclient.LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}
	unequal := []uint32{1, 2, 3, 4}
	equal := []uint32{5, 5, 5, 5}
	busy := []int64{3, 0, 2, 1}
	for _, tc := range []struct {
		name     string
		mode     LBMode
		pol      *xdsclient.ClusterPolicy
		weights  []uint32
		inflight []int64
		ref      lb.Policy
		refW     []uint32
		edf      bool // the reference runs EDF
	}{
		{"xds round robin, equal weights", LBXDS, rrPol, equal, busy, lb.DefaultPolicy(lb.RoundRobin), equal, false},
		{"xds round robin, unequal weights: EDF", LBXDS, rrPol, unequal, busy, lb.DefaultPolicy(lb.RoundRobin), unequal, true},
		{"xds least request P2C", LBXDS, lr(2, false, 1), equal, busy,
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 2, ActiveRequestBias: 1}, equal, false},
		{"xds least request 3 choices", LBXDS, lr(3, false, 1), equal, busy,
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 3, ActiveRequestBias: 1}, equal, false},
		{"xds least request full scan", LBXDS, lr(2, true, 1), equal, []int64{1, 0, 0, 1},
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 2, FullScan: true, ActiveRequestBias: 1}, equal, false},
		{"xds least request EDF, bias 1", LBXDS, lr(2, false, 1), unequal, busy,
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 2, ActiveRequestBias: 1}, unequal, true},
		{"xds least request EDF, bias 0", LBXDS, lr(2, false, 0), unequal, busy,
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 2, ActiveRequestBias: 0}, unequal, true},
		{"xds least request EDF, bias 2", LBXDS, lr(2, false, 2), unequal, busy,
			lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: 2, ActiveRequestBias: 2}, unequal, true},
		{"rr baseline ignores weights", LBRoundRobin, lr(2, false, 1), unequal, busy, lb.DefaultPolicy(lb.RoundRobin),
			[]uint32{1, 1, 1, 1}, false},
		{"lr baseline: Envoy's default least request", LBLeastRequest, rrPol, unequal, busy, lb.DefaultPolicy(lb.LeastRequest),
			[]uint32{1, 1, 1, 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pk := &balancer{mode: tc.mode, limit: 1 << 30, rand: newLockedRand(7, 9), place: placement.DefaultConfig()}
			c, states := testCluster(t, tc.pol, tc.weights, tc.inflight, nil, nil, pk)
			ref := newLockedRand(7, 9)
			b, err := lb.NewBalancer(tc.ref, ref.Uint64())
			if err != nil {
				t.Fatal(err)
			}
			counts := make(lb.Counts, len(tc.inflight))
			for i, n := range tc.inflight {
				counts[i] = uint64(n)
			}
			refW := append([]uint32(nil), tc.refW...)
			b.Update(refW, counts)
			if b.Weighted() != tc.edf {
				t.Fatalf("reference balancer %v: weighted %v, want %v", b, b.Weighted(), tc.edf)
			}
			const now = 1000
			var got, want []int
			var held []int
			for i := range 60 {
				if i == 30 {
					// Outlier detection ejects host 1: Envoy refreshes
					// with the host out of the healthy set.
					states[1].ejectedUntil.Store(now + 1)
					refW[1] = 0
					b.Update(refW, counts)
				}
				h, res := pk.pick(c, pickQuery{now: now})
				if res != pickOK {
					t.Fatalf("pick %d: result %v", i, res)
				}
				w, _ := b.Pick(ref, counts)
				got, want = append(got, indexOf(c, h)), append(want, w)
				counts[w]++ // the gateway's acquire counted h
				held = append(held, w)
				if i%3 == 2 { // a request ends on both sides
					states[held[0]].release()
					counts[held[0]]--
					held = held[1:]
				}
				if got[i] != want[i] {
					// Keep the two sides' counts apart no longer: stop.
					t.Fatalf("pick %d: gateway chose host %d, Envoy's algorithm %d\ngateway %v\nenvoy   %v", i, got[i], want[i], got, want)
				}
			}
			t.Logf("picks %v", got)
		})
	}
}

// With locality weighting the locality comes from LocalityWrr's EDF
// schedule (seeded like the hosts'), then the locality's own balancer.
func TestPickLocalityWeightedMatchesEnvoy(t *testing.T) {
	pol := &xdsclient.ClusterPolicy{LBPolicy: xdsclient.LBRoundRobin, LocalityWeighted: true, ChoiceCount: 2, ActiveRequestBias: 1}
	pk := &balancer{mode: LBXDS, limit: 1 << 30, rand: newLockedRand(3, 4), place: placement.DefaultConfig()}
	loc := []int{0, 0, 1, 1, 1}
	c, _ := testCluster(t, pol, []uint32{1, 1, 2, 2, 2}, nil, loc, []uint32{1, 3}, pk)

	ref := newLockedRand(3, 4)
	seed := ref.Uint64()    // seed_, drawn when the cluster's balancer is built
	locSeed := ref.Uint64() // LocalityWrr's seed, drawn at the first refresh
	eff := []float64{1, 3}
	locEDF := lb.NewEDFWithPicks([]int{0, 1}, func(l int) float64 { return eff[l] }, uint32(locSeed))
	var bals []*lb.Balancer
	for l := range 2 {
		b, err := lb.NewBalancer(lb.DefaultPolicy(lb.RoundRobin), seed)
		if err != nil {
			t.Fatal(err)
		}
		w := make([]uint32, len(loc))
		for j := range loc {
			if loc[j] == l {
				w[j] = []uint32{1, 1, 2, 2, 2}[j]
			}
		}
		b.Update(w, nil)
		bals = append(bals, b)
	}
	perLoc := [2]int{}
	for i := range 40 {
		h, res := pk.pick(c, pickQuery{})
		if res != pickOK {
			t.Fatalf("pick %d: %v", i, res)
		}
		h.st.release()
		r := &replay{first: ref.Uint64(), r: ref} // the priority's draw, replayed to the pick
		l, _ := locEDF.PickAndAdd(func(l int) float64 { return eff[l] })
		want, _ := bals[l].Pick(r, nil)
		if got := indexOf(c, h); got != want {
			t.Fatalf("pick %d: gateway chose host %d, Envoy's algorithm %d (locality %d)", i, got, want, l)
		}
		perLoc[l]++
	}
	if perLoc != [2]int{10, 30} {
		t.Errorf("picks per locality %v, want [10 30] (weights 1:3)", perLoc)
	}
}

// prioHosts is a priority of healthy, degraded and ejected hosts (ejected
// until 2, so at now 1).
func prioHosts(healthy, degraded, ejected int) *priorityRT {
	pr := &priorityRT{localities: []*localityRT{{weight: 1}}}
	for i := range healthy + degraded + ejected {
		h := &hostRT{ep: xdsclient.Endpoint{Weight: 1, Degraded: i >= healthy && i < healthy+degraded}, st: &hostState{}}
		if i >= healthy+degraded {
			h.st.ejectedUntil.Store(2)
		}
		pr.hosts = append(pr.hosts, h)
		pr.locOf = append(pr.locOf, 0)
		pr.localities[0].hosts = append(pr.localities[0].hosts, h)
	}
	return pr
}

// Priority loads, panic and the priority draw as Envoy computes them
// (load_balancer_impl.cc): health = min(100, 140 × healthy / total),
// degraded likewise; healthy load first, then degraded, normalised by the
// total availability capped at 100; no panic while that total is 100;
// total panic splits by host counts; hash%100+1 falls into the cumulative
// healthy, then degraded, loads.
func TestPriorityLoad(t *testing.T) {
	type hd struct{ healthy, degraded, ejected int }
	for _, tc := range []struct {
		name              string
		prios             []hd
		healthy, degraded []uint32
		panic             []bool
		draws             map[uint64][2]int // hash → (priority, 1 if degraded)
	}{
		{"one healthy priority", []hd{{3, 0, 0}}, []uint32{100}, []uint32{0}, []bool{false},
			map[uint64][2]int{0: {0, 0}, 99: {0, 0}}},
		{"P0 half ejected: 70/30", []hd{{1, 0, 1}, {2, 0, 0}}, []uint32{70, 30}, []uint32{0, 0}, []bool{false, false},
			map[uint64][2]int{69: {0, 0}, 70: {1, 0}}},
		{"P0 at a third, no panic while the total is 100", []hd{{1, 0, 2}, {3, 0, 0}}, []uint32{46, 54}, []uint32{0, 0},
			[]bool{false, false}, map[uint64][2]int{45: {0, 0}, 46: {1, 0}}},
		{"total panic splits by host counts", []hd{{1, 0, 3}, {1, 0, 4}}, []uint32{45, 55}, []uint32{0, 0},
			[]bool{true, true}, map[uint64][2]int{44: {0, 0}, 45: {1, 0}}},
		{"nothing healthy: total panic", []hd{{0, 0, 2}}, []uint32{100}, []uint32{0}, []bool{true},
			map[uint64][2]int{50: {0, 0}}},
		{"degraded take what healthy cannot", []hd{{1, 1, 0}}, []uint32{70}, []uint32{30}, []bool{false},
			map[uint64][2]int{69: {0, 0}, 70: {0, 1}, 99: {0, 1}}},
		{"a healthy lower priority before a degraded higher one", []hd{{0, 2, 0}, {2, 0, 0}}, []uint32{0, 100},
			[]uint32{0, 0}, []bool{false, false}, map[uint64][2]int{0: {1, 0}, 99: {1, 0}}},
		{"degraded share, an empty priority in panic", []hd{{1, 1, 1}, {0, 0, 3}}, []uint32{50, 0}, []uint32{50, 0},
			[]bool{false, true}, map[uint64][2]int{49: {0, 0}, 50: {0, 1}, 99: {0, 1}}},
		{"weak levels: total panic", []hd{{1, 1, 3}, {1, 0, 4}}, []uint32{50, 50}, []uint32{0, 0}, []bool{true, true},
			map[uint64][2]int{49: {0, 0}, 50: {1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &lbState{}
			var prios []*priorityRT
			for _, p := range tc.prios {
				prios = append(prios, prioHosts(p.healthy, p.degraded, p.ejected))
			}
			s.install(prios)
			s.refresh(newLockedRand(1, 1), 1, true)
			if !slices.Equal(s.healthyLoad, tc.healthy) || !slices.Equal(s.degradedLoad, tc.degraded) {
				t.Errorf("loads healthy %v degraded %v, want %v %v", s.healthyLoad, s.degradedLoad, tc.healthy, tc.degraded)
			}
			for i, want := range tc.panic {
				if s.per[i].panic != want {
					t.Errorf("priority %d panic %v, want %v", i, s.per[i].panic, want)
				}
			}
			for hash, want := range tc.draws {
				p, d := s.choosePriority(hash)
				if got := [2]int{p, map[bool]int{false: 0, true: 1}[d]}; got != want {
					t.Errorf("choosePriority(%d) = %v, want %v", hash, got, want)
				}
			}
		})
	}
}

// A host of weight 0 is never picked, in any mode; a cluster of weight-0
// hosts only has no host.
func TestWeightZeroNeverPicked(t *testing.T) {
	pols := map[string]*xdsclient.ClusterPolicy{
		"rr":      {LBPolicy: xdsclient.LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1},
		"lr":      {LBPolicy: xdsclient.LBLeastRequest, ChoiceCount: 2, ActiveRequestBias: 1},
		"lr-full": {LBPolicy: xdsclient.LBLeastRequest, ChoiceCount: 2, FullScan: true, ActiveRequestBias: 1},
		"random":  {LBPolicy: xdsclient.LBRandom, ChoiceCount: 2, ActiveRequestBias: 1},
	}
	for _, mode := range []LBMode{LBXDS, LBRoundRobin, LBLeastRequest, LBIsobar} {
		for name, pol := range pols {
			for _, weights := range [][]uint32{{0, 1, 3}, {0, 2, 2}} {
				t.Run(fmt.Sprintf("%s/%s/%v", mode, name, weights), func(t *testing.T) {
					pk := &balancer{mode: mode, limit: 1 << 30, rand: newLockedRand(1, 2), place: placement.DefaultConfig()}
					c, _ := testCluster(t, pol, weights, nil, nil, nil, pk)
					for i := range 100 {
						h, res := pk.pick(c, pickQuery{tokens: 10})
						if res != pickOK || h.ep.Weight == 0 {
							t.Fatalf("pick %d: %v %v, a weight-0 host or none", i, h, res)
						}
						if i%2 == 0 {
							h.st.release()
						}
					}
				})
			}
			t.Run(fmt.Sprintf("%s/%s/all zero", mode, name), func(t *testing.T) {
				pk := &balancer{mode: mode, limit: 1 << 30, rand: newLockedRand(1, 2), place: placement.DefaultConfig()}
				c, _ := testCluster(t, pol, []uint32{0, 0}, nil, nil, nil, pk)
				if h, res := pk.pick(c, pickQuery{tokens: 10}); h != nil || res != pickNoHost {
					t.Errorf("pick = %v, %v; want no host", h, res)
				}
			})
		}
	}
}

// --lb isobar sends a request where its expected TTFT is least: to the
// endpoint with fewer pending prompt tokens when in-flight counts are
// equal, to a faster one when it absorbs more, and ties go by the injected
// random source.
func TestPickIsobar(t *testing.T) {
	pol := &xdsclient.ClusterPolicy{LBPolicy: xdsclient.LBLeastRequest, ChoiceCount: 2, ActiveRequestBias: 1}
	for _, tc := range []struct {
		name     string
		weights  []uint32
		pending  []int64
		inflight []int64
		rates    []float64
		want     int
	}{
		{"fewer pending tokens", []uint32{1, 1, 1}, []int64{5000, 200, 3000}, []int64{1, 1, 1}, nil, 1},
		{"pending outweighs one more in flight", []uint32{1, 1}, []int64{4000, 0}, []int64{1, 2}, nil, 1},
		{"a faster engine absorbs more", []uint32{1, 1}, []int64{4000, 1000}, nil, []float64{100000, 10000}, 0},
		{"weight does not bias the pick", []uint32{100, 1}, []int64{10, 0}, nil, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pk := &balancer{mode: LBIsobar, limit: 1 << 30, rand: newLockedRand(1, 2), place: placement.DefaultConfig()}
			c, states := testCluster(t, pol, tc.weights, tc.inflight, nil, nil, pk)
			for i, p := range tc.pending {
				states[i].pending.Store(p)
			}
			for i, r := range tc.rates {
				c.all[i].ep.PrefillTokensPerSecond = r
			}
			h, res := pk.pick(c, pickQuery{tokens: 100})
			if res != pickOK || indexOf(c, h) != tc.want {
				t.Errorf("pick = host %d (%v), want %d", indexOf(c, h), res, tc.want)
			}
		})
	}
	// Idle identical hosts: the tie goes by the random source, so a
	// scripted source spreads the picks over every host.
	pk := &balancer{mode: LBIsobar, limit: 1 << 30, rand: newLockedRand(5, 6), place: placement.DefaultConfig()}
	c, _ := testCluster(t, pol, []uint32{1, 1, 1}, nil, nil, nil, pk)
	seen := map[int]int{}
	for range 60 {
		h, _ := pk.pick(c, pickQuery{tokens: 100})
		seen[indexOf(c, h)]++
		h.st.release()
	}
	if len(seen) != 3 {
		t.Errorf("idle ties picked hosts %v, want all three", seen)
	}
}

// No weighted-random pick is left in the gateway: nothing draws a float in
// proportion to weights. (Envoy's only random choices are integers reduced
// modulo a count or 100; see balance.go.) This test fails if one is
// reintroduced.
func TestNoWeightedRandomPick(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	bad := regexp.MustCompile(`rand\.(New\([^)]*\)\.)?(Float64|Float32|ExpFloat64)\(\)|\bweightedRandom\b|\.Float64\(\)\s*\*`)
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for i, line := range strings.Split(string(b), "\n") {
			if code, _, _ := strings.Cut(line, "//"); bad.MatchString(code) {
				t.Errorf("%s:%d: a weighted-random draw: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d files; is the test running in the package directory?", checked)
	}
}

// counterRand returns 0, 1, 2, ...
type counterRand struct {
	mu sync.Mutex
	n  uint64
}

func (c *counterRand) Uint64() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n - 1
}

// EDS DEGRADED endpoints take only the share the healthy ones cannot: with
// one healthy and one degraded endpoint, 70 % and 30 % of the priority
// draws, in every mode.
func TestPickDegradedShare(t *testing.T) {
	pol := &xdsclient.ClusterPolicy{LBPolicy: xdsclient.LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}
	for _, mode := range []LBMode{LBXDS, LBRoundRobin, LBIsobar} {
		t.Run(string(mode), func(t *testing.T) {
			pk := &balancer{mode: mode, limit: 1 << 30, rand: &counterRand{}, place: placement.DefaultConfig()}
			c, _ := testCluster(t, pol, []uint32{1, 1}, nil, nil, nil, pk)
			c.all[1].ep.Degraded = true
			c.lb.sig = "" // as a new table with the flag would
			c.lb.install(c.lb.prios)
			got := [2]int{}
			for range 100 {
				h, res := pk.pick(c, pickQuery{tokens: 1})
				if res != pickOK {
					t.Fatal(res)
				}
				got[indexOf(c, h)]++
				h.st.release()
			}
			if got != [2]int{70, 30} {
				t.Errorf("healthy/degraded picks %v, want [70 30]", got)
			}
		})
	}
}
