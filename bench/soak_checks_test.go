package bench

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFlatCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		vals      []float64
		growth    float64
		allowance float64
		want      bool
	}{
		{"flat", []float64{100, 101, 99, 100, 102, 100}, 0.1, 0, true},
		{"noisy within allowance", []float64{100, 130, 90, 120, 95, 125}, 0.1, 20, true},
		{"steady leak", []float64{100, 120, 140, 160, 180, 200}, 0.25, 10, false},
		{"shrinking is flat", []float64{200, 190, 150, 120, 110, 100}, 0, 0, true},
		{"one spike in the last third", []float64{100, 100, 100, 100, 100, 100, 100, 100, 400}, 0.1, 0, true},
		{"too few samples", []float64{100, 100}, 1, 1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := flatCheck("x", tc.vals, tc.growth, tc.allowance, fmtCount)
			if c.Passed != tc.want {
				t.Errorf("passed %v, want %v: %s", c.Passed, tc.want, c.Detail)
			}
			if c.Detail == "" {
				t.Error("no detail")
			}
		})
	}
}

func TestStreamsCheck(t *testing.T) {
	want := map[string]int{"a": 3, "b": 2}
	ok := Sample{Regions: []RegionSample{{Region: "a", Streams: 3, LiveCells: 3, Ready: 3}, {Region: "b", Streams: 2, LiveCells: 2, Ready: 2}}}
	leak := Sample{Regions: []RegionSample{{Region: "a", Streams: 4, LiveCells: 3, Ready: 3}, {Region: "b", Streams: 2, LiveCells: 2, Ready: 2}}}
	missing := Sample{Regions: []RegionSample{{Region: "a", Streams: 2, LiveCells: 2, Ready: 2}, {Region: "b", Streams: 2, LiveCells: 2, Ready: 2}}}
	for _, tc := range []struct {
		name    string
		s       Sample
		reached bool
		want    bool
		detail  string
	}{
		{"match", ok, true, true, "5 streams"},
		{"leaked stream", leak, false, false, "a: 4 streams open, 3 of 3 cells live"},
		{"cell never back", missing, false, false, "a: 2 streams open, 2 of 3 cells live"},
		{"timed out though matching now", ok, false, false, "never settled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.s.Streams == 0 {
				for _, r := range tc.s.Regions {
					tc.s.Streams += r.Streams
					tc.s.LiveCells += r.LiveCells
				}
			}
			c := streamsCheck(tc.s, want, tc.reached)
			if c.Passed != tc.want || !strings.Contains(c.Detail, tc.detail) {
				t.Errorf("got %v %q; want %v and a detail with %q", c.Passed, c.Detail, tc.want, tc.detail)
			}
		})
	}
}

func TestGoroutinesReturnCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Sample
		want bool
	}{
		{"back", Sample{Goroutines: 540}, true},
		{"leaked goroutines", Sample{Goroutines: 600}, false},
		{"stream still open", Sample{Goroutines: 500, Streams: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c := goroutinesReturnCheck(tc.s, 500, 50); c.Passed != tc.want {
				t.Errorf("passed %v, want %v: %s", c.Passed, tc.want, c.Detail)
			}
		})
	}
}

func TestStreamErrorsCheck(t *testing.T) {
	if c := streamErrorsCheck(ChurnStats{}, 0); !c.Passed {
		t.Errorf("no errors failed: %s", c.Detail)
	}
	c := streamErrorsCheck(ChurnStats{StreamErrors: 1, LastError: "c1: stream ended: EOF"}, 0)
	if c.Passed || !strings.Contains(c.Detail, "c1: stream ended") {
		t.Errorf("one error over a limit of 0: %v %s", c.Passed, c.Detail)
	}
	if c := streamErrorsCheck(ChurnStats{AckErrors: 9}, -1); !c.Passed {
		t.Errorf("check off still failed: %s", c.Detail)
	}
}

func TestPlanChecks(t *testing.T) {
	good := RegionPlans{Region: "a", First: PlanMark{5, 1}, Last: PlanMark{5, 40}, Changes: 39, MaxGapSeconds: 1.2, Regressions: []string{}}
	sample := func(t float64, seq uint64) Sample {
		return Sample{TSeconds: t, Regions: []RegionSample{{Region: "a", Source: "plan", Plan: PlanMark{5, seq}}}}
	}
	for _, tc := range []struct {
		name    string
		plans   []RegionPlans
		samples []Sample
		failing string // the check expected to fail, "" for none
	}{
		{"healthy", []RegionPlans{good}, []Sample{sample(0, 1), sample(10, 20), sample(20, 40)}, ""},
		{"regressed in the watcher", []RegionPlans{func() RegionPlans { p := good; p.Regressions = []string{"5:3 after 5:4"}; return p }()}, nil, CheckPlansMonotonic},
		{"regressed between samples", []RegionPlans{good}, []Sample{sample(0, 9), sample(10, 8)}, CheckPlansMonotonic},
		{"never advanced", []RegionPlans{func() RegionPlans { p := good; p.Last = p.First; return p }()}, nil, CheckPlansAdvance},
		{"gap over the TTL", []RegionPlans{func() RegionPlans { p := good; p.MaxGapSeconds = 31; return p }()}, nil, CheckPlanGap},
		{"fell back", []RegionPlans{func() RegionPlans { p := good; p.NotOnPlan = 2; return p }()}, nil, CheckPlanGap},
		{"expired plans", []RegionPlans{func() RegionPlans { p := good; p.Plans = map[string]float64{"expired": 1}; return p }()}, nil, CheckPlanGap},
		{"no region", nil, nil, CheckPlansAdvance},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range planChecks(tc.plans, tc.samples, 30) {
				if wantFail := c.Name == tc.failing; c.Passed == wantFail {
					t.Errorf("%s: passed %v: %s", c.Name, c.Passed, c.Detail)
				}
			}
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"Name:\tisobar\nVmPeak:\t  2000 kB\nVmRSS:\t  1234 kB\nThreads: 9\n", 1234 << 10, true},
		{"Name:\tisobar\n", 0, false},
		{"VmRSS:\t  12x kB\n", 0, false},
		{"VmRSS:\t  12 MB\n", 0, false},
		{"VmRSS:\n", 0, false},
	} {
		got, ok := parseVmRSS([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseVmRSS(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSchedule(t *testing.T) {
	s := schedule(3*time.Second, 10*time.Second, 2*time.Second)
	var got []string
	for _, x := range s {
		got = append(got, x.phase+"@"+x.at.String())
	}
	want := "warmup@0s warmup@2s soak@3s soak@5s soak@7s soak@9s soak@10s"
	if strings.Join(got, " ") != want {
		t.Errorf("schedule = %v, want %s", got, want)
	}
}

func TestSoakConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  SoakConfig
		flag string
	}{
		{"too few cells", SoakConfig{Cells: 2}, "--cells"},
		{"too many cells", SoakConfig{Cells: maxSoakCells + 1}, "--cells"},
		{"duplicate region", SoakConfig{Regions: []string{"a", "a"}}, "--regions"},
		{"bad region", SoakConfig{Regions: []string{"a b"}}, "--regions"},
		{"negative duration", SoakConfig{Duration: -time.Second}, "--duration"},
		{"warm-up too long", SoakConfig{Duration: time.Minute, Warmup: 2 * time.Minute}, "--warmup"},
		{"churn over 1", SoakConfig{ChurnFraction: 1.5}, "--churn"},
		{"negative sample", SoakConfig{SampleEvery: -time.Second}, "--sample"},
		{"negative settle", SoakConfig{Settle: -time.Second}, "--settle"},
		{"negative growth", SoakConfig{MaxRSSGrowth: -1}, "--max-rss-growth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.withDefaults()
			err := cfg.validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("validate() = %v; want ErrInvalidConfig naming %s", err, tc.flag)
			}
		})
	}
	def := SoakConfig{}
	def.withDefaults()
	if err := def.validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
}
