package xds

import (
	"fmt"
	"testing"
)

var benchSizes = []int{10, 100, 1000}

// BenchmarkBuild measures building and fully validating the resources.
//
//   - cold: a new Builder every time, so every Listener, Route, Cluster and
//     assignment is built and validated (ValidateAll and every packed Any).
//   - weights: the controller's steady state, every endpoint weight changes
//     each cycle, so the assignment is rebuilt and validated and the rest
//     comes from the memo.
func BenchmarkBuild(b *testing.B) {
	for _, n := range benchSizes {
		m := fleet("meta-llama/Llama-3.1-70B-Instruct-AWQ", n)
		st := State{Models: []Model{m}}
		b.Run(fmt.Sprintf("cold/endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bl, err := NewBuilder(testConfig())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bl.Build(st); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("weights/endpoints=%d", n), func(b *testing.B) {
			bl := mustBuilder(b, testConfig())
			eps := m.Localities[0].Endpoints
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				for j := range eps {
					eps[j].Weight = uint32(1 + (i+j)%100)
				}
				if _, err := bl.Build(st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBuildPinned is BenchmarkBuild's weights case for a model with
// two residency sets over its localities and per-criticality shed shares:
// every cycle rebuilds the model's and the sets' assignments.
func BenchmarkBuildPinned(b *testing.B) {
	for _, n := range benchSizes {
		m := fleet("meta-llama/Llama-3.1-70B-Instruct-AWQ", n)
		m.Shed, m.ShedSheddable = 0.1, 0.4
		st := State{Models: []Model{m}}
		b.Run(fmt.Sprintf("weights/endpoints=%d", n), func(b *testing.B) {
			bl := mustBuilder(b, testConfig())
			eps := m.Localities[0].Endpoints
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				for j := range eps {
					eps[j].Weight = uint32(1 + (i+j)%100)
				}
				st.Models[0].Pinned = []Pinned{
					{Set: "us", Regions: []string{"us-east"}, Localities: m.Localities},
					{Set: "eu", Regions: []string{"eu-west"}},
				}
				if _, err := bl.Build(st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPush measures a whole Push: build, validation, per-type change
// detection, reference check, Consistent and SetSnapshot for both node
// kinds.
//
//   - all-weights: every endpoint weight changes each push.
//   - one-weight: one endpoint's weight changes (hysteresis at work).
//   - unchanged: the same State again.
func BenchmarkPush(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("one-weight/endpoints=%d", n), func(b *testing.B) { benchOneWeightPush(b, testConfig(), n) })
		b.Run(fmt.Sprintf("unchanged/endpoints=%d", n), func(b *testing.B) {
			s, err := NewServer(testConfig(), Deps{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Stop()
			st := State{Models: []Model{fleet("meta-llama/Llama-3.1-70B-Instruct-AWQ", n)}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Push(st); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("all-weights/endpoints=%d", n), func(b *testing.B) {
			benchPush(b, testConfig(), n, func(eps []Endpoint, i int) {
				for j := range eps {
					eps[j].Weight = uint32(1 + (i+j)%100)
				}
			})
		})
	}
}

// BenchmarkPushLEDS is BenchmarkPush's one-weight case with Config.LEDS on
// and off: what the LEDS layout adds to a push (the changed assignments'
// endpoints are renamed and diffed) when no client is connected.
func BenchmarkPushLEDS(b *testing.B) {
	for _, n := range benchSizes {
		for _, leds := range []bool{false, true} {
			b.Run(fmt.Sprintf("one-weight/leds=%t/endpoints=%d", leds, n), func(b *testing.B) {
				cfg := testConfig()
				cfg.LEDS = leds
				benchOneWeightPush(b, cfg, n)
			})
		}
	}
}

// benchOneWeightPush times a push of n endpoints in which one endpoint's
// weight changed, on a server of cfg.
func benchOneWeightPush(b *testing.B, cfg Config, n int) {
	benchPush(b, cfg, n, func(eps []Endpoint, i int) {
		e := &eps[i%len(eps)]
		e.Weight = e.Weight%100 + 1 // always a different weight
	})
}

// benchPush times pushes of one model of n endpoints on a server of cfg,
// change(endpoints, i) moving them before push i.
func benchPush(b *testing.B, cfg Config, n int, change func(eps []Endpoint, i int)) {
	s, err := NewServer(cfg, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	m := fleet("meta-llama/Llama-3.1-70B-Instruct-AWQ", n)
	st := State{Models: []Model{m}}
	eps := m.Localities[0].Endpoints
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		change(eps, i)
		if _, err := s.Push(st); err != nil {
			b.Fatal(err)
		}
	}
}
