package xds

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestCanonicalizeFromEqualsFresh drives one Builder through random churn
// of a model whose endpoints come sorted by address, as the registry
// sends them (so that most builds canonicalise from the last one:
// canonicalizeFrom), and checks every build against a Builder that always
// takes the full path: the same resources, or the same error. The churn adds, removes and
// reweights endpoints, moves their round trips, writes IPv6 hosts in a
// non-canonical form, adds and removes a second locality, now and then
// sends the endpoints out of order, and breaks the state in every way the
// incremental path must hand to the full one: a cell twice, an address
// twice (in a locality and across two), a bad port, weight or host, a
// weight sum above 2^32−1.
func TestCanonicalizeFromEqualsFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	memo := mustBuilder(t, testConfig())
	// The reference is a Builder too, not a fresh one per step: a class
	// cluster stays once it has appeared (classes.go), so a Builder's
	// output depends on its history.
	ref := mustBuilder(t, testConfig())
	ref.scratch.full = true
	next := 0
	newEndpoint := func() Endpoint {
		next++
		e := Endpoint{CellID: fmt.Sprintf("cell-%04d", next), Host: fmt.Sprintf("10.2.%d.%d", next/250%250, next%250),
			Port: 8000, Weight: uint32(1 + rng.IntN(100)), MaxModelLen: []uint32{4096, 32768}[rng.IntN(2)]}
		if rng.IntN(8) == 0 { // IPv6, written as the canonical form would not
			e.Host = fmt.Sprintf("fd00:0:0::%x", next)
		}
		return e
	}
	live := make([]Endpoint, 40)
	for i := range live {
		live[i] = newEndpoint()
	}
	byAddr := func(a, b Endpoint) int {
		return cmp.Or(netip.MustParseAddr(a.Host).Compare(netip.MustParseAddr(b.Host)), cmp.Compare(a.Port, b.Port))
	}
	remote := false
	bad, from := 0, 0
	for step := range 600 {
		switch op := rng.IntN(12); {
		case op < 2 && len(live) > 1:
			i := rng.IntN(len(live))
			live = slices.Delete(live, i, i+1)
		case op < 4:
			live = append(live, newEndpoint())
		case op < 7:
			for range 1 + rng.IntN(3) {
				e := &live[rng.IntN(len(live))]
				e.Weight, e.Degraded = uint32(1+rng.IntN(100)), rng.IntN(4) == 0
				e.ClassWeight = uint32(rng.IntN(2) * rng.IntN(50))
			}
		case op < 8:
			e := &live[rng.IntN(len(live))]
			e.RTT, e.Jitter = time.Duration(rng.IntN(5000))*time.Microsecond, time.Duration(rng.IntN(100))*time.Microsecond
		case op < 9:
			remote = !remote
		}
		slices.SortFunc(live, byAddr)
		eps := slices.Clone(live)
		if rng.IntN(20) == 0 && len(eps) > 2 { // out of order: the full path sorts
			eps[0], eps[len(eps)-1] = eps[len(eps)-1], eps[0]
		}
		locs := []Locality{{Weight: 100, Endpoints: eps}}
		if remote {
			locs = append(locs, Locality{Region: "eu-west", Zone: "eu-west", Weight: 50, RTT: 40 * time.Millisecond,
				Endpoints: []Endpoint{{CellID: "region/eu-west", Host: "10.9.0.1", Port: 443, Weight: 1}}})
		}
		st := State{Models: []Model{{Name: "m", Localities: locs}, fleet("b", 3)}}
		if rng.IntN(6) == 0 { // broken, in one of these ways
			bad++
			eps := st.Models[0].Localities[0].Endpoints
			i := rng.IntN(len(eps))
			switch rng.IntN(7) {
			case 0:
				eps[i].CellID = eps[(i+1)%len(eps)].CellID
			case 1:
				if i+1 < len(eps) {
					eps[i+1].Host, eps[i+1].Port = eps[i].Host, eps[i].Port
				} else {
					eps[i].Port = 0
				}
			case 2:
				eps[i].Port = 70000
			case 3:
				eps[i].Weight = 0
			case 4:
				eps[i].Host = "cell.example"
			case 5:
				eps[i].Weight = math.MaxUint32
			case 6:
				if remote {
					r := &st.Models[0].Localities[1].Endpoints[0]
					r.Host, r.Port = eps[i].Host, eps[i].Port
				} else {
					eps[i].PrefillTokensPerSecond = math.NaN()
				}
			}
		}
		got, gotErr := memo.Build(st)
		want, wantErr := ref.Build(st)
		if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
			t.Fatalf("step %d: error %v, the full path's %v", step, gotErr, wantErr)
		}
		if gotErr == nil {
			if kind := differs(got, want); kind != "" {
				t.Fatalf("step %d: the %s resources differ from the full path's", step, kind)
			}
		}
		// The caller reuses its buffers.
		for _, l := range st.Models[0].Localities {
			for i := range l.Endpoints {
				l.Endpoints[i] = Endpoint{CellID: "scribbled", Host: "10.255.255.255", Port: 1, Weight: 1}
			}
		}
		from = memo.scratch.from
	}
	t.Logf("%d of 600 builds canonicalised from the last one; %d broken states", from, bad)
	if from < 200 || bad < 50 {
		t.Errorf("%d builds canonicalised from the last one, %d broken states: the churn missed the path under test", from, bad)
	}
}
