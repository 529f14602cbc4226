package cycle

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
)

// Map's error rate is the worse of the engine's (while the engine
// reports) and the data plane's, with the window of the one that wins.
func TestMapErrorRateIsTheWorse(t *testing.T) {
	engine := func(rate float64, ok bool) score.Reading {
		return score.Reading{AppOK: ok, ErrorRate: score.Some(rate)}
	}
	for _, tc := range []struct {
		name    string
		r       score.Reading
		dp      ErrorWindow
		rate    float64
		req     float64
		present bool
	}{
		{"none", score.Reading{AppOK: true}, ErrorWindow{}, 0, 0, false},
		{"engine only", engine(0.1, true), ErrorWindow{}, 0.1, 50, true},
		{"engine down", engine(0.1, false), ErrorWindow{}, 0, 0, false},
		{"data plane only", score.Reading{}, ErrorWindow{Rate: 0.3, Requests: 7, OK: true}, 0.3, 7, true},
		{"data plane worse", engine(0.1, true), ErrorWindow{Rate: 0.3, Requests: 7, OK: true}, 0.3, 7, true},
		{"engine worse", engine(0.5, true), ErrorWindow{Rate: 0.3, Requests: 7, OK: true}, 0.5, 50, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, _ := Map(score.DefaultConfig(), []Cell{{ID: "a", State: lifecycle.Ready, Reading: tc.r, EngineRequests: 50, DataPlane: tc.dp}})
			got := pc[0]
			if got.ErrorOK != tc.present || got.ErrorRate != tc.rate || got.ErrorRequests != tc.req {
				t.Errorf("error rate %v over %v (ok %v), want %v over %v (ok %v)", got.ErrorRate, got.ErrorRequests, got.ErrorOK, tc.rate, tc.req, tc.present)
			}
		})
	}
}

// A cell's context share is over its own model's longest declared
// context; an excluded cell is failed whatever its state.
func TestMapContextShareAndExclusion(t *testing.T) {
	pc, _ := Map(score.DefaultConfig(), []Cell{
		{ID: "a", Model: "m", MaxModelLen: 4096, State: lifecycle.Ready},
		{ID: "b", Model: "m", MaxModelLen: 1024, State: lifecycle.Ready, Excluded: true},
		{ID: "c", Model: "n", MaxModelLen: 1024, State: lifecycle.Ready},
		{ID: "d", Model: "n", State: lifecycle.Ready},
	})
	want := []struct {
		share float64
		state lifecycle.State
	}{{1, lifecycle.Ready}, {0.25, lifecycle.Failed}, {1, lifecycle.Ready}, {0, lifecycle.Ready}}
	for i, w := range want {
		if pc[i].ContextShare != w.share || pc[i].State != w.state {
			t.Errorf("%s: share %v state %s, want %v %s", pc[i].ID, pc[i].ContextShare, pc[i].State, w.share, w.state)
		}
	}
}

// BuildState reads its arguments only: the same views give the same
// offer, and the views are left as they were.
func TestBuildStateIsPure(t *testing.T) {
	vals := []CellView{
		{ID: "a", Endpoint: "10.0.0.1:8000", Model: "m", State: lifecycle.Ready, RTT: time.Millisecond, RTTOK: true,
			Weight: projection.Weight{Published: 100}},
		{ID: "b", Endpoint: "10.0.0.2:8000", Model: "m", State: lifecycle.Ready, RTT: 30 * time.Millisecond, RTTOK: true,
			Weight: projection.Weight{Published: 50}},
		{ID: "c", Endpoint: "10.0.0.3:8000", Model: "m", State: lifecycle.Failed},
	}
	before := append([]CellView(nil), vals...)
	views := ptrs(vals)
	p := Params{Region: "r1", Zone: "z", RTTs: map[string]time.Duration{"r2": 40 * time.Millisecond},
		Routes: &Routes{Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.7, "r2": 0.3}}},
			Ingress: map[string]string{"r2": "10.1.0.1:443"}}}
	a, b := BuildState(p, views), BuildState(p, views)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two calls, two offers:\n%+v\n%+v", a, b)
	}
	if !reflect.DeepEqual(vals, before) {
		t.Fatal("BuildState changed its views")
	}
	if l := localOf(a, "m"); len(l) != 2 || l[0].CellID != "a" || l[0].Weight != 100 || l[1].CellID != "b" || l[1].Weight != 50 {
		t.Errorf("local endpoints %+v", l)
	}
	if a.Placement[RemoteKey("r2")].RTT != 40*time.Millisecond || a.Placement["b"].RTT != 30*time.Millisecond {
		t.Errorf("placement %v", a.Placement)
	}
	if m := a.State.Models; len(m) != 1 || len(m[0].Localities) != 2 || m[0].Localities[0].Weight != 700 || m[0].Localities[1].Weight != 300 {
		t.Errorf("state %+v", a.State.Models)
	}
	if Drifted(a.Placement, Weighted(views, []projection.Weight{{Published: 100}, {Published: 50}, {}}), p.RTTs) {
		t.Error("the placement just offered drifted")
	}
}

// ptrs returns pointers to each of vals (the views' shared form).
func ptrs(vals []CellView) []*CellView {
	out := make([]*CellView, len(vals))
	for i := range vals {
		out[i] = &vals[i]
	}
	return out
}

// MapKnown into the buffers of its last call, told which cells are the
// ones it mapped there from the same input (their score being results[i]
// itself), maps every cell as Map does afresh: through random steps of
// cells changing, pools' utilisation moving, a model's longest context
// coming and going, and the order changing (no score is then the
// buffer's own).
func TestMapKnownKeepsWhatItMapped(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 12))
	scorer := score.DefaultConfig()
	n := 40
	cells := make([]Cell, n)
	newCell := func(i int) Cell {
		q := float64(rng.IntN(20))
		longest := uint32(8192)
		if rng.IntN(30) == 0 {
			longest = 65536 // rare: the model's longest comes and goes
		}
		return Cell{ID: fmt.Sprintf("c%02d", i), Model: []string{"m", "n"}[i%2], MaxModelLen: []uint32{0, 4096, longest}[rng.IntN(3)],
			State: lifecycle.Ready, Reading: score.Reading{AppOK: true, QueueDepth: score.Some(q), ErrorRate: score.Some(rng.Float64() / 10)},
			EngineRequests: float64(rng.IntN(100)), DataPlane: ErrorWindow{Rate: rng.Float64() / 5, Requests: 9, OK: rng.IntN(2) == 0}}
	}
	for i := range cells {
		cells[i] = newCell(i)
	}
	var pcells []projection.Cell
	var results []score.Result
	skipped := 0
	for step := range 300 {
		sameOrder := step > 0 && rng.IntN(10) > 0
		if !sameOrder {
			rng.Shuffle(n, func(i, j int) { cells[i], cells[j] = cells[j], cells[i] })
		}
		changed := make([]bool, n)
		for i := range cells {
			if rng.IntN(5) == 0 {
				id, model := cells[i].ID, cells[i].Model
				cells[i] = newCell(0)
				cells[i].ID, cells[i].Model = id, model
				changed[i] = true
			}
		}
		util := map[string]float64{"m": float64(rng.IntN(3)) / 2, "n": 0.5}
		for i := range cells {
			cells[i].Utilisation = util[cells[i].Model]
		}
		want, wantRes := Map(scorer, cells)
		kept := make([]score.Result, n) // a copy where the order moved, as the registry's published scores
		copy(kept, wantRes)
		pcells, results = MapKnown(scorer, cells, func(i int) *score.Result {
			switch {
			case changed[i]:
				return nil
			case sameOrder:
				if pcells[i] == projectionCell(&cells[i], &results[i], longestOf(cells, cells[i].Model)) {
					skipped++
				}
				return &results[i]
			}
			return &kept[i]
		}, pcells, results)
		if !reflect.DeepEqual(pcells, want) || !reflect.DeepEqual(results, wantRes) {
			t.Fatalf("step %d: mapping into the last call's buffers differs from mapping afresh", step)
		}
	}
	if skipped < 3000 {
		t.Errorf("%d cells found as they were mapped: the test hardly exercises that", skipped)
	}
}

func longestOf(cells []Cell, model string) uint32 {
	n := uint32(0)
	for _, c := range cells {
		if c.Model == model {
			n = max(n, c.MaxModelLen)
		}
	}
	return n
}
