package xds

import (
	"errors"
	"math"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// placementState is a model with two local endpoints, one declaring its
// capacity and round trip, and a remote region's locality with its RTT,
// one of whose two ingress endpoints has a short context.
func placementState() State {
	return State{Models: []Model{{Name: "m", Localities: []Locality{
		local(
			Endpoint{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 32768,
				PrefillTokensPerSecond: 30000, MaxNumSeqs: 12, RTT: 400 * time.Microsecond, Jitter: 50 * time.Microsecond},
			Endpoint{CellID: "b", Host: "10.0.0.2", Port: 8000, Weight: 1},
		),
		{Region: "eu-west", Zone: "eu-west", Weight: 1, RTT: 60 * time.Millisecond, Jitter: 2500 * time.Microsecond, Endpoints: []Endpoint{
			{CellID: "region/eu-west", Host: "10.1.0.1", Port: 9000, Weight: 1},
			{CellID: "region/eu-west-short", Host: "10.1.0.2", Port: 9000, Weight: 1, MaxModelLen: 4096},
		}},
	}}}}
}

// numbers returns the number fields of md's isobar namespace; strings and
// other kinds are left out.
func numbers(md *core.Metadata) map[string]float64 {
	out := map[string]float64{}
	for k, v := range md.GetFilterMetadata()[xdscontract.MetadataKey].GetFields() {
		if n, ok := v.GetKind().(*structpb.Value_NumberValue); ok {
			out[k] = n.NumberValue
		}
	}
	return out
}

func sameNumbers(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The builder writes the pick's inputs: per endpoint its prefill rate,
// batch cap, RTT and jitter in milliseconds (each only when known), per
// locality its RTT and jitter; every Envoy-only assignment keeps the
// locality's metadata, a locality cut down by a context class included.
func TestBuildPlacementMetadata(t *testing.T) {
	res, err := mustBuilder(t, testConfig()).Build(placementState())
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	wantEP := map[string]map[string]float64{
		"a":                    {"max_model_len": 32768, xdscontract.MetadataPrefillRate: 30000, xdscontract.MetadataMaxNumSeqs: 12, xdscontract.MetadataRTT: 0.4, xdscontract.MetadataJitter: 0.05},
		"b":                    {},
		"region/eu-west":       {},
		"region/eu-west-short": {"max_model_len": 4096},
	}
	wantLoc := map[string]map[string]float64{
		"us-east": {},
		"eu-west": {xdscontract.MetadataRTT: 60, xdscontract.MetadataJitter: 2.5},
	}
	byName := map[string]*endpoint.ClusterLoadAssignment{}
	for _, cla := range res.Envoy.Endpoints {
		byName[cla.GetClusterName()] = cla
	}
	for _, name := range []string{xdscontract.ClusterName("m"), xdscontract.LocalClusterName("m"), xdscontract.ClassClusterName("m", 8192), xdscontract.LocalClassClusterName("m", 8192)} {
		cla := byName[name]
		if cla == nil {
			t.Fatalf("no assignment %s among %d", name, len(byName))
		}
		seen := 0
		for _, loc := range cla.GetEndpoints() {
			region := loc.GetLocality().GetRegion()
			if got := numbers(loc.GetMetadata()); !sameNumbers(got, wantLoc[region]) {
				t.Errorf("%s: locality %s metadata %v, want %v", name, region, got, wantLoc[region])
			}
			for _, lb := range loc.GetLbEndpoints() {
				cell, _ := xdscontract.EndpointMetadata(lb.GetMetadata())
				seen++
				if got := numbers(lb.GetMetadata()); !sameNumbers(got, wantEP[cell]) {
					t.Errorf("%s: endpoint %s metadata %v, want %v", name, cell, got, wantEP[cell])
				}
			}
		}
		if seen == 0 {
			t.Errorf("%s: no endpoint", name)
		}
	}
	for _, loc := range byName[xdscontract.ClassClusterName("m", 8192)].GetEndpoints() {
		if loc.GetLocality().GetRegion() == "eu-west" && len(loc.GetLbEndpoints()) != 1 {
			t.Errorf("class 8192 assignment's remote locality %v: want it cut to one endpoint", loc)
		}
	}

	// A changed round trip rebuilds the assignment with the new values.
	b := mustBuilder(t, testConfig())
	if _, err := b.Build(placementState()); err != nil {
		t.Fatal(err)
	}
	st := placementState()
	st.Models[0].Localities[0].Endpoints[0].RTT = 2 * time.Millisecond
	st.Models[0].Localities[1].RTT = 90 * time.Millisecond
	res2, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, loc := range res2.Envoy.Endpoints[0].GetEndpoints() {
		if loc.GetLocality().GetRegion() == "eu-west" && numbers(loc.GetMetadata())[xdscontract.MetadataRTT] != 90 {
			t.Errorf("remote locality after the change: %v", numbers(loc.GetMetadata()))
		}
		for _, lb := range loc.GetLbEndpoints() {
			if cell, _ := xdscontract.EndpointMetadata(lb.GetMetadata()); cell == "a" && numbers(lb.GetMetadata())[xdscontract.MetadataRTT] != 2 {
				t.Errorf("endpoint a after the change: %v", numbers(lb.GetMetadata()))
			}
		}
	}
}

// Placement inputs that are not numbers, negative or absurd make the state
// invalid.
func TestValidatePlacementInputs(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*State)
	}{
		{"NaN rate", func(s *State) { s.Models[0].Localities[0].Endpoints[0].PrefillTokensPerSecond = math.NaN() }},
		{"negative rate", func(s *State) { s.Models[0].Localities[0].Endpoints[0].PrefillTokensPerSecond = -1 }},
		{"infinite rate", func(s *State) { s.Models[0].Localities[0].Endpoints[0].PrefillTokensPerSecond = math.Inf(1) }},
		{"absurd rate", func(s *State) {
			s.Models[0].Localities[0].Endpoints[0].PrefillTokensPerSecond = 2 * xdscontract.MaxPrefillTokensPerSecond
		}},
		{"negative RTT", func(s *State) { s.Models[0].Localities[0].Endpoints[0].RTT = -time.Millisecond }},
		{"absurd jitter", func(s *State) { s.Models[0].Localities[0].Endpoints[0].Jitter = xdscontract.MaxRTT + 1 }},
		{"negative locality RTT", func(s *State) { s.Models[0].Localities[1].RTT = -time.Millisecond }},
		{"absurd locality jitter", func(s *State) { s.Models[0].Localities[1].Jitter = 2 * xdscontract.MaxRTT }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := placementState()
			tc.mut(&st)
			if _, err := mustBuilder(t, testConfig()).Build(st); !errors.Is(err, ErrInvalidState) {
				t.Fatalf("Build = %v, want ErrInvalidState", err)
			}
		})
	}
}
