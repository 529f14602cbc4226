package scalemodel

import (
	"encoding/json"
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
// (testdata/xeon-scale.json, the 10–10,000-cell points that did not
// saturate the machine): at one controller of 10,000 cells, flat and
// hierarchical, in both runs, the cycle's cost (its CPU time), the
// controllers' CPU and the global inbound are each within Tolerance.
// The points of 10 and 100 controllers are compared too, and reported by
// the command, but not held here: the same cells per controller cost 15–30
// % more CPU in a process that holds 10,000 cells than in one that holds
// 1,000 (docs/scale-model.md).
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
	one := 0
	for _, c := range cs {
		if c.Regions != 1 {
			continue
		}
		one++
		gated := 0
		for _, k := range c.Checks {
			if k.Gated {
				gated++
			}
		}
		if gated != 3 || !c.Pass() {
			t.Errorf("%d regions %s: %d gated checks, pass %v: %+v", c.Regions, c.Topology, gated, c.Pass(), c.Checks)
		}
	}
	if one != 4 {
		t.Errorf("%d comparisons at one controller, want 4", one)
	}
}
