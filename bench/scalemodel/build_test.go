package scalemodel

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildOnFixture is the tiny size of `isobar bench scale-model`: the
// frozen constants beside the fixture's largest points, a hold-out fit,
// a small grid (one hierarchical fleet, its one-controller machine, flat)
// and the files. No wall-clock figure is asserted.
func TestBuildOnFixture(t *testing.T) {
	rep, err := ReadReport("testdata/xeon-scale.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Build(rep, "testdata/xeon-scale.json", Options{
		HoldoutMaxCells: 100, Item4SummaryBytes: 475, NearestRTT: CalibratedNearestRTT,
		Cells: []int{2000}, Regions: []int{10, 0}, Cores: []float64{2}, Horizon: 200 * time.Millisecond, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.ValidationCells != 10000 || len(r.Validation) != 8 || r.Holdout == nil || len(r.HoldoutValidation) != 8 {
		t.Fatalf("validated %d cells: %d comparisons, hold-out %v with %d", r.ValidationCells, len(r.Validation), r.Holdout != nil, len(r.HoldoutValidation))
	}
	// Global inbound is bytes × rate: it must match wherever the summary
	// size was fitted on the run itself.
	for _, c := range r.Validation {
		for _, k := range c.Checks {
			if k.Figure == "global inbound B/s" && !k.Pass() {
				t.Errorf("%d/%d %s: global inbound %g vs measured %g", c.Cells, c.Regions, c.Topology, k.Model, k.Measured)
			}
		}
	}
	if len(r.Projections) != 3 || r.Projections[1].Scenario.OneOf != 10 || r.Projections[1].CellsPerController != 200 {
		t.Fatalf("projections: %+v", r.Projections)
	}
	dir := t.TempDir()
	if err := Write(dir, r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("model.json: %v", err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "model.md"))
	for _, want := range []string{"Hold-out", "one controller", "Where it bends", "inbound, 475 B summaries"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("model.md lacks %q", want)
		}
	}
}

// TestAMDModelOnItsMeasured10kPoints checks the constants fitted on the
// AMD EPYC's runs (testdata/amd-scale.json, the frozen constants until
// 2026-12-06) against that machine's 10,000-cell run
// (testdata/amd-scale10k.json, never fitted on): every point saturated the
// 2-core machine (controllers and senders used ≥ 90 % of it, cells not
// Ready), and the model must say so at each; the global inbound, bytes ×
// rate, must be within Tolerance of the measured.
func TestAMDModelOnItsMeasured10kPoints(t *testing.T) {
	fitted, err := ReadReport("testdata/amd-scale.json")
	if err != nil {
		t.Fatal(err)
	}
	amd, err := Fit(fitted, FitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ReadReport("testdata/amd-scale10k.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Fit(rep, FitOptions{}); err == nil {
		t.Error("fitted on points that all saturated the machine")
	}
	cs, err := Validate(amd, rep, 10000, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 4 {
		t.Fatalf("%d comparisons, want 4", len(cs))
	}
	for _, c := range cs {
		if !c.Saturated {
			t.Errorf("%d regions %s: the model does not saturate where the machine did", c.Regions, c.Topology)
		}
		for _, k := range c.Checks {
			if k.Figure == "global inbound B/s" && !k.Pass() {
				t.Errorf("%d regions %s: global inbound model %g, measured %g", c.Regions, c.Topology, k.Model, k.Measured)
			}
		}
	}
}

// TestFrozenModelOnItsMeasured10kPoints checks the frozen constants
// against the 10,000-cell points of the runs they were fitted on
// (testdata/xeon-scale.json): at every point, flat and 1, 10 and 100
// controllers, in both runs, the controllers' CPU and the global inbound
// are within Tolerance. The cycle's cost (its CPU time) moved up to 1.4×
// between the two runs at the same point (18.97 and 24.45 ms, flat), the
// machine's speed moving by the minute (docs/scale-model.md): no one
// constant is within Tolerance of both, and the model's is held within
// the two runs' range widened by Tolerance.
func TestFrozenModelOnItsMeasured10kPoints(t *testing.T) {
	rep, err := ReadReport("testdata/xeon-scale.json")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := Validate(Calibrated(), rep, 10000, CalibratedNearestRTT, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 8 {
		t.Fatalf("%d comparisons, want 8 (two runs of 4)", len(cs))
	}
	type span struct{ lo, hi, model float64 }
	cycle := map[string]*span{} // per point: the runs' measured range and the model
	for _, c := range cs {
		gated := 0
		for _, k := range c.Checks {
			if !k.Gated {
				continue
			}
			gated++
			if k.Figure == figCycleCPU {
				key := fmt.Sprintf("%d %s", c.Regions, c.Topology)
				if cycle[key] == nil {
					cycle[key] = &span{lo: k.Measured, hi: k.Measured}
				}
				cycle[key].lo, cycle[key].hi, cycle[key].model = min(cycle[key].lo, k.Measured), max(cycle[key].hi, k.Measured), k.Model
				continue
			}
			if !k.Pass() {
				t.Errorf("%d regions %s: %s measured %.4g, model %.4g: beyond %.0f %%", c.Regions, c.Topology, k.Figure, k.Measured, k.Model, Tolerance*100)
			}
		}
		if gated != 3 {
			t.Errorf("%d regions %s: %d gated checks, want 3", c.Regions, c.Topology, gated)
		}
	}
	if len(cycle) != 4 {
		t.Fatalf("cycle costs at %d points, want 4", len(cycle))
	}
	for key, s := range cycle {
		if s.model < s.lo*(1-Tolerance) || s.model > s.hi*(1+Tolerance) {
			t.Errorf("%s: the cycle's cost %.4g ms is beyond the runs' %.4g–%.4g ms widened by %.0f %%", key, s.model, s.lo, s.hi, Tolerance*100)
		}
	}
}
