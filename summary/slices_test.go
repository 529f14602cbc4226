package summary

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

const (
	critical  = isobarpb.Criticality_CRITICALITY_CRITICAL
	standard  = isobarpb.Criticality_CRITICALITY_STANDARD
	sheddable = isobarpb.Criticality_CRITICALITY_SHEDDABLE
)

func slicedFleet() Input {
	in := fleet(10)
	in.Demand["m"] = 10
	in.DemandSlices = map[string][]DemandSlice{"m": {
		{Criticality: sheddable, RPS: 3},
		{Criticality: critical, RPS: 2, AllowedRegions: []string{"eu-west", "eu-central", "eu-west"}},
		{Criticality: isobarpb.Criticality_CRITICALITY_UNSPECIFIED, RPS: 4},
		{Criticality: standard, RPS: 1},
		{Criticality: critical, RPS: 5, AllowedRegions: []string{"bad name!"}},
		{Criticality: isobarpb.Criticality(42), RPS: 0},
	}}
	return in
}

// Aggregate canonicalises the slices: unspecified and unknown are
// standard, equal keys merge, allowed regions are sorted and deduplicated,
// a pinned slice with no valid region is dropped (never made "any", its
// share taken out of demand_rps), and the rest add up to demand_rps.
func TestAggregateSlices(t *testing.T) {
	s := Aggregate(slicedFleet())
	if err := Validate(s); err != nil {
		t.Fatalf("Aggregate's output fails Validate: %v", err)
	}
	ds := s.GetModels()[0].GetDemandSlices()
	if len(ds) != 3 {
		t.Fatalf("slices %v, want critical (pinned), standard, sheddable", ds)
	}
	if ds[0].GetCriticality() != critical || !slices.Equal(ds[0].GetAllowedRegions(), []string{"eu-central", "eu-west"}) {
		t.Errorf("first slice %v, want critical pinned to eu-central, eu-west", ds[0])
	}
	if ds[1].GetCriticality() != standard || len(ds[1].GetAllowedRegions()) != 0 {
		t.Errorf("second slice %v, want standard unpinned", ds[1])
	}
	var sum float64
	for _, d := range ds {
		sum += d.GetRps()
	}
	// The dropped pinned slice (5 of the 15 rps measured) is taken out of
	// demand_rps, not given to the others.
	want := 10 * 10 / 15.0
	if d := s.GetModels()[0].GetDemandRps(); math.Abs(d-want) > 1e-9 {
		t.Errorf("demand_rps %v, want %v (the pinned slice with nowhere to go taken out)", d, want)
	}
	if math.Abs(sum-want) > 1e-9 || math.Abs(ds[1].GetRps()-5*want/10) > 1e-9 {
		t.Errorf("slices add up to %v (standard %v), want %v (%v)", sum, ds[1].GetRps(), want, 5*want/10)
	}
	// Equal inputs, equal bytes.
	a, _ := proto.Marshal(Aggregate(slicedFleet()))
	b, _ := proto.Marshal(Aggregate(slicedFleet()))
	if string(a) != string(b) {
		t.Error("two aggregates of the same input differ")
	}
	// Too many slices: the largest are kept.
	in := fleet(10)
	for k := range MaxDemandSlices + 5 {
		in.DemandSlices = map[string][]DemandSlice{"m": append(in.DemandSlices["m"], DemandSlice{Criticality: critical, RPS: float64(k + 1), AllowedRegions: []string{regionFor(k)}})}
	}
	ds = Aggregate(in).GetModels()[0].GetDemandSlices()
	if len(ds) != MaxDemandSlices {
		t.Errorf("%d slices, want %d", len(ds), MaxDemandSlices)
	}
}

func regionFor(k int) string { return "r" + strings.Repeat("x", k) }

func TestValidateSlices(t *testing.T) {
	good := func() *isobarpb.RegionSummary { return Aggregate(slicedFleet()) }
	for _, tc := range []struct {
		name string
		edit func(m *isobarpb.ModelSummary)
		want string
	}{
		{"too many", func(m *isobarpb.ModelSummary) {
			m.DemandSlices = nil
			for k := range MaxDemandSlices + 1 {
				m.DemandSlices = append(m.DemandSlices, &isobarpb.DemandSlice{Criticality: critical, AllowedRegions: []string{regionFor(k)}, Rps: m.DemandRps / (MaxDemandSlices + 1)})
			}
		}, "33 demand slices"},
		{"nan", func(m *isobarpb.ModelSummary) { m.DemandSlices[0].Rps = math.NaN() }, "demand_slices[0].rps is NaN"},
		{"negative", func(m *isobarpb.ModelSummary) { m.DemandSlices[1].Rps = -1 }, "demand_slices[1].rps is -1"},
		{"criticality", func(m *isobarpb.ModelSummary) { m.DemandSlices[1].Criticality = 9 }, "unknown criticality 9"},
		{"unsorted", func(m *isobarpb.ModelSummary) { m.DemandSlices[0].AllowedRegions = []string{"b", "a"} }, "not sorted"},
		{"repeat", func(m *isobarpb.ModelSummary) { m.DemandSlices[0].AllowedRegions = []string{"a", "a"} }, "not sorted without repeats"},
		{"bad name", func(m *isobarpb.ModelSummary) { m.DemandSlices[0].AllowedRegions = []string{"a b"} }, `region "a b" invalid`},
		{"twice", func(m *isobarpb.ModelSummary) {
			m.DemandSlices[1].Criticality = isobarpb.Criticality_CRITICALITY_UNSPECIFIED
			m.DemandSlices = append(m.DemandSlices, &isobarpb.DemandSlice{Criticality: standard})
		}, "repeats the criticality"},
		{"sum", func(m *isobarpb.ModelSummary) { m.DemandSlices[2].Rps += 1 }, "add up to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(s.Models[0])
			err := Validate(s)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
	// Within the tolerance is fine; no slices is fine.
	s := good()
	s.Models[0].DemandSlices[2].Rps += 1e-4
	if err := Validate(s); err != nil {
		t.Errorf("slices within the tolerance: %v", err)
	}
	s.Models[0].DemandSlices = nil
	if err := Validate(s); err != nil {
		t.Errorf("no slices: %v", err)
	}
}
