package summary

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func f64(v float64) *float64 { return &v }

const (
	ready   = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	failed  = isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED
	loading = isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
)

func fleet(n int) Input {
	cells := make([]Cell, n)
	for i := range cells {
		st := ready
		if i%10 == 9 {
			st = failed
		}
		cells[i] = Cell{
			Model: "m", State: st, Pressure: float64(i%100) / 100, Fallback: i%7 == 0,
			CapacityRPS: 1.3, CapacityConfidence: float64(i%4) / 4, LoadRPS: 1.0, TTFTP95: f64(0.3 + float64(i%50)/100),
			ErrorRate: f64(0.01), WindowRequests: f64(10), KVUsage: f64(0.4),
			MaxModelLen: []uint32{8192, 32768}[i%2],
		}
	}
	return Input{
		Region: "us-east", Incarnation: "abc123", Sequence: 42, Now: now, Cells: cells,
		Demand:                 map[string]float64{"m": 0.9 * float64(n)},
		RTT:                    map[string]time.Duration{"us-west": 62 * time.Millisecond, "eu-west": 80 * time.Millisecond},
		IngressAddress:         "10.0.0.1:10001",
		DefaultEngineLatencyMs: 300,
		Coordinate:             &coordinate.Coordinate{Vec: []float64{0.01, -0.02, 0.003, 0, 0, 0, 0, 0}, Error: 0.3, Adjustment: -0.0005, Height: 0.0001},
	}
}

// The encoded size depends on models and regions, not on cells.
func TestSizeDoesNotGrowWithCells(t *testing.T) {
	small := proto.Size(Aggregate(fleet(10)))
	large := proto.Size(Aggregate(fleet(10_000)))
	t.Logf("summary bytes: 10 cells %d, 10,000 cells %d", small, large)
	if d := large - small; d < -16 || d > 16 {
		t.Fatalf("10 cells → %d bytes, 10,000 cells → %d bytes: grows with cells", small, large)
	}
	// Below DefaultNearestRTT peers one more region adds an RTT entry;
	// beyond, none (TestSizeFlatInRegions; global's
	// TestSummaryBytesFlatInRegions measures 10 to 1,000 regions).
	in := fleet(10)
	in.RTT["ap-south"] = 150 * time.Millisecond
	if more := proto.Size(Aggregate(in)); more <= small {
		t.Fatalf("an extra region did not add bytes (%d → %d)", small, more)
	}
}

func TestAggregate(t *testing.T) {
	in := Input{
		Region: "r", Incarnation: "i", Sequence: 1, Now: now, DefaultEngineLatencyMs: 300,
		Cells: []Cell{
			{Model: "m", State: ready, Pressure: 0.2, CapacityRPS: 1, LoadRPS: 0.5, TTFTP95: f64(0.4),
				ErrorRate: f64(0.1), WindowRequests: f64(10), KVUsage: f64(0.5), MaxModelLen: 8192},
			{Model: "m", State: ready, Pressure: 0.8, CapacityRPS: 2, LoadRPS: 1.5, TTFTP95: f64(1.2),
				ErrorRate: f64(0), WindowRequests: f64(30), KVUsage: f64(0.9), MaxModelLen: 32768, Fallback: true},
			{Model: "m", State: failed, Pressure: 1, CapacityRPS: 5},
			{Model: "m", State: loading},
			{Model: "other", State: ready, Pressure: 0.1, CapacityRPS: 1},
		},
		Demand: map[string]float64{"m": 2.5, "idle-model": 1},
		RTT:    map[string]time.Duration{"r2": 20 * time.Millisecond, "r": time.Second},
	}
	s := Aggregate(in)
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	if len(s.Models) != 3 || s.Models[0].Model != "idle-model" || s.Models[1].Model != "m" {
		t.Fatalf("models = %v", s.Models)
	}
	m := s.Models[1]
	checks := []struct {
		name      string
		got, want float64
	}{
		{"ready", float64(m.CellsReady), 2}, {"failed", float64(m.CellsFailed), 1}, {"loading", float64(m.CellsLoading), 1},
		{"capacity (ready only)", m.CapacityRps, 3}, {"load", m.LoadRps, 2}, {"demand", m.DemandRps, 2.5},
		{"pressure min", m.PressureMin, 0.2}, {"pressure mean", m.PressureMean, 0.5}, {"pressure p90", m.PressureP90, 0.8},
		{"ttft p95 (max)", m.TtftP95Seconds, 1.2}, {"error rate (request-weighted)", m.ErrorRate, 1.0 / 40},
		{"kv headroom", m.KvHeadroom, 0.3}, {"fallback", float64(m.FallbackCells), 1},
		{"engine latency from the low-pressure cell", m.EngineLatencyMs, 400},
	}
	for _, c := range checks {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	wantClasses := map[uint32][2]float64{4096: {2, 3}, 8192: {2, 3}, 32768: {1, 2}, 131072: {0, 0}}
	for _, c := range m.ContextClasses {
		w := wantClasses[c.MaxTokens]
		if float64(c.Cells) != w[0] || c.CapacityRps != w[1] {
			t.Errorf("class %d = %d cells %v rps, want %v", c.MaxTokens, c.Cells, c.CapacityRps, w)
		}
	}
	if len(s.Rtt) != 1 || s.Rtt[0].Region != "r2" || s.Rtt[0].RttMs != 20 {
		t.Errorf("rtt = %v (self must be left out)", s.Rtt)
	}
	if s.Models[0].EngineLatencyMs != 300 {
		t.Errorf("model without cells: engine latency %v, want the default", s.Models[0].EngineLatencyMs)
	}
	// Deterministic bytes.
	a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(Aggregate(in))
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(Aggregate(in))
	if string(a) != string(b) {
		t.Error("equal inputs gave different bytes")
	}
}

func TestValidateRejects(t *testing.T) {
	good := func() *isobarpb.RegionSummary { return Aggregate(fleet(20)) }
	if err := Validate(good()); err != nil {
		t.Fatalf("good summary refused: %v", err)
	}
	cases := map[string]struct {
		mut  func(*isobarpb.RegionSummary)
		want string
	}{
		"bad region":          {func(s *isobarpb.RegionSummary) { s.Region = "no spaces" }, "region"},
		"zero sequence":       {func(s *isobarpb.RegionSummary) { s.Sequence = 0 }, "sequence"},
		"no time":             {func(s *isobarpb.RegionSummary) { s.At = nil }, "time"},
		"NaN capacity":        {func(s *isobarpb.RegionSummary) { s.Models[0].CapacityRps = math.NaN() }, "capacity_rps"},
		"negative demand":     {func(s *isobarpb.RegionSummary) { s.Models[0].DemandRps = -1 }, "demand_rps"},
		"NaN confidence":      {func(s *isobarpb.RegionSummary) { s.Models[0].CapacityConfidence = math.NaN() }, "capacity_confidence"},
		"negative confidence": {func(s *isobarpb.RegionSummary) { s.Models[0].CapacityConfidence = -0.1 }, "capacity_confidence"},
		"confidence above 1":  {func(s *isobarpb.RegionSummary) { s.Models[0].CapacityConfidence = 1.5 }, "capacity_confidence"},
		"class confidence Inf": {func(s *isobarpb.RegionSummary) {
			s.Models[0].ContextClasses[0].CapacityConfidence = math.Inf(1)
		}, "capacity_confidence"},
		"class confidence negative": {func(s *isobarpb.RegionSummary) {
			s.Models[0].ContextClasses[2].CapacityConfidence = -1
		}, "capacity_confidence"},
		"pressure above 1":    {func(s *isobarpb.RegionSummary) { s.Models[0].PressureP90 = 1.5 }, "pressure_p90"},
		"error rate Inf":      {func(s *isobarpb.RegionSummary) { s.Models[0].ErrorRate = math.Inf(1) }, "error_rate"},
		"duplicate model":     {func(s *isobarpb.RegionSummary) { s.Models = append(s.Models, s.Models[0]) }, "twice"},
		"empty model name":    {func(s *isobarpb.RegionSummary) { s.Models[0].Model = "" }, "model name"},
		"rtt to itself":       {func(s *isobarpb.RegionSummary) { s.Rtt[0].Region = s.Region }, "itself"},
		"negative rtt":        {func(s *isobarpb.RegionSummary) { s.Rtt[0].RttMs = -3 }, "rtt"},
		"unsorted classes":    {func(s *isobarpb.RegionSummary) { s.Models[0].ContextClasses[1].MaxTokens = 1 }, "ascending"},
		"fallback > ready":    {func(s *isobarpb.RegionSummary) { s.Models[0].FallbackCells = s.Models[0].CellsReady + 1 }, "fallback"},
		"bad ingress address": {func(s *isobarpb.RegionSummary) { s.IngressAddress = "nowhere" }, "ingress"},
		"too many rtt entries": {func(s *isobarpb.RegionSummary) {
			for i := range MaxRegions {
				s.Rtt = append(s.Rtt, &isobarpb.PeerRTT{Region: fmt.Sprint("p", i), RttMs: 1})
			}
		}, "RTT entries"},
		"NaN rtt":                    {func(s *isobarpb.RegionSummary) { s.Rtt[0].RttMs = math.NaN() }, "rtt"},
		"absurd rtt":                 {func(s *isobarpb.RegionSummary) { s.Rtt[0].RttMs = 1e9 }, "rtt"},
		"coordinate NaN":             {func(s *isobarpb.RegionSummary) { s.Coordinate.Vec[1] = math.NaN() }, "vec[1]"},
		"coordinate absurd":          {func(s *isobarpb.RegionSummary) { s.Coordinate.Vec[0] = -1e6 }, "vec[0]"},
		"coordinate no dimensions":   {func(s *isobarpb.RegionSummary) { s.Coordinate.Vec = nil }, "dimensions"},
		"coordinate 17 dimensions":   {func(s *isobarpb.RegionSummary) { s.Coordinate.Vec = make([]float64, 17) }, "dimensions"},
		"coordinate negative error":  {func(s *isobarpb.RegionSummary) { s.Coordinate.Error = -0.1 }, "error"},
		"coordinate error above max": {func(s *isobarpb.RegionSummary) { s.Coordinate.Error = 2 }, "error"},
		"coordinate negative height": {func(s *isobarpb.RegionSummary) { s.Coordinate.Height = -1e-3 }, "height"},
		"coordinate Inf adjustment":  {func(s *isobarpb.RegionSummary) { s.Coordinate.Adjustment = math.Inf(1) }, "adjustment"},
		"too many models": {func(s *isobarpb.RegionSummary) {
			for i := range MaxModels {
				s.Models = append(s.Models, &isobarpb.ModelSummary{Model: fmt.Sprint("x", i)})
			}
		}, "models"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := good()
			tc.mut(s)
			err := Validate(s)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// The model's and each class's confidence is the capacity-weighted mean of
// their Ready cells' confidences; bad cell values count as 0.
func TestAggregateConfidence(t *testing.T) {
	in := Input{
		Region: "r", Incarnation: "i", Sequence: 1, Now: now,
		Cells: []Cell{
			{Model: "m", State: ready, CapacityRPS: 1, CapacityConfidence: 0.2, MaxModelLen: 8192},
			{Model: "m", State: ready, CapacityRPS: 3, CapacityConfidence: 0.6, MaxModelLen: 32768},
			{Model: "m", State: ready, CapacityRPS: 2, CapacityConfidence: math.NaN(), MaxModelLen: 32768},
			{Model: "m", State: failed, CapacityRPS: 5, CapacityConfidence: 1},
			{Model: "p", State: ready, CapacityRPS: 1.3},
		},
	}
	s := Aggregate(in)
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	m, p := s.Models[0], s.Models[1]
	if want := (0.2*1 + 0.6*3) / 6; math.Abs(m.CapacityConfidence-want) > 1e-9 {
		t.Errorf("model confidence = %v, want %v", m.CapacityConfidence, want)
	}
	if p.CapacityConfidence != 0 {
		t.Errorf("prior-only model confidence = %v, want 0", p.CapacityConfidence)
	}
	want := map[uint32]float64{4096: 2.0 / 6, 8192: 2.0 / 6, 32768: 1.8 / 5, 131072: 0}
	for _, c := range m.ContextClasses {
		if math.Abs(c.CapacityConfidence-want[c.MaxTokens]) > 1e-9 {
			t.Errorf("class %d confidence = %v, want %v", c.MaxTokens, c.CapacityConfidence, want[c.MaxTokens])
		}
	}
}

func TestNewer(t *testing.T) {
	a := Aggregate(fleet(1))
	b := proto.Clone(a).(*isobarpb.RegionSummary)
	b.Sequence++
	if !Newer(b, a) || Newer(a, b) || Newer(a, a) {
		t.Error("sequence order wrong")
	}
	c := proto.Clone(a).(*isobarpb.RegionSummary)
	c.Incarnation, c.Sequence = "restarted", 1
	c.At.Seconds++
	if !Newer(c, b) {
		t.Error("a restarted region's later summary must be newer")
	}
}

// FuzzValidate decodes arbitrary bytes as a summary, as Sync receives it:
// Validate never panics, and an accepted summary has only finite, bounded
// values.
func FuzzValidate(f *testing.F) {
	seed, _ := proto.Marshal(Aggregate(fleet(5)))
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 'r', '1', 0x18, 0x01})
	sliced, _ := proto.Marshal(Aggregate(slicedFleet()))
	f.Add(sliced)
	// The issue-26 fields: nearest RTTs and a coordinate, and the
	// pre-issue-26 full list without one.
	many := fleet(3)
	many.RTT = map[string]time.Duration{}
	for i := range 40 {
		many.RTT[fmt.Sprint("p", i)] = time.Duration(i+1) * time.Millisecond
	}
	reduced, _ := proto.Marshal(Aggregate(many))
	f.Add(reduced)
	many.NearestRTT, many.Coordinate = -1, nil
	full, _ := proto.Marshal(Aggregate(many))
	f.Add(full)
	bad := Aggregate(fleet(3))
	bad.Coordinate.Vec[0] = math.NaN()
	badCoord, _ := proto.Marshal(bad)
	f.Add(badCoord)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		var s isobarpb.RegionSummary
		if proto.Unmarshal(data, &s) != nil || Validate(&s) != nil {
			return
		}
		for _, m := range s.Models {
			for _, d := range m.DemandSlices {
				if math.IsNaN(d.Rps) || math.IsInf(d.Rps, 0) || d.Rps < 0 || !slices.IsSorted(d.AllowedRegions) {
					t.Fatalf("accepted slice %v", d)
				}
			}
			for _, v := range []float64{m.CapacityRps, m.LoadRps, m.DemandRps, m.PressureMean, m.ErrorRate, m.KvHeadroom} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("accepted %v", v)
				}
			}
		}
		if c := s.Coordinate; c != nil {
			for _, v := range append([]float64{c.Error, c.Adjustment, c.Height}, c.Vec...) {
				if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > MaxCoordinateSeconds {
					t.Fatalf("accepted coordinate %v", c)
				}
			}
		}
		// The matrix a receiver plans with is finite or +Inf, never NaN
		// or negative.
		mat := RTTMatrix([]string{s.Region, "p0", "p1"}, []*isobarpb.RegionSummary{&s, nil, &s}, nil)
		for _, row := range mat {
			for _, v := range row {
				if math.IsNaN(v) || v < 0 {
					t.Fatalf("matrix entry %v from an accepted summary", v)
				}
			}
		}
	})
}

func BenchmarkAggregate10000(b *testing.B) {
	in := fleet(10_000)
	for b.Loop() {
		_ = Aggregate(in)
	}
}
