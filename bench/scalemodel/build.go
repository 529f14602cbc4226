package scalemodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/bench/scale"
)

// Options say what Build does with a measured report.
type Options struct {
	// Refit fits the constants on the report instead of using Calibrated;
	// CPUExp > 0 fixes the ingest CPU's exponent of that fit and of the
	// hold-out's (1: linear).
	Refit  bool
	CPUExp float64
	// NearestRTT is how many peers' RTTs the report's summaries carried
	// (0: every peer); ProjectNearestRTT the same for the projections.
	NearestRTT, ProjectNearestRTT int
	// Item4SummaryBytes > 0 adds the global inbound with summaries of that
	// size (475 B: issue 26 item 4, docs/summaries.md).
	Item4SummaryBytes float64
	// HoldoutMaxCells > 0 also fits on the points of at most this many
	// cells and validates that fit on the largest point (out of sample).
	HoldoutMaxCells int
	// Cells, Regions (0: flat) and Cores are the projections' grid.
	Cells   []int
	Regions []int
	Cores   []float64
	Seed    uint64
	// Horizon is each projection's simulated virtual time (0: 2 s).
	Horizon time.Duration
}

// Report is what Build gives: the constants used, the validation on the
// largest measured point, the projections and the bends.
type Report struct {
	Source            string       `json:"source"`
	ParamsFrom        string       `json:"params_from"`
	Params            Params       `json:"params"`
	ValidationCells   int          `json:"validation_cells"`
	Validation        []Comparison `json:"validation"`
	Holdout           *Params      `json:"holdout,omitempty"`
	HoldoutMaxCells   int          `json:"holdout_max_cells,omitempty"`
	HoldoutValidation []Comparison `json:"holdout_validation,omitempty"`
	Projections       []Result     `json:"projections"`
	Bends             []Bend       `json:"bends"`
	CycleInterval     Duration     `json:"cycle_interval"`
	Item4SummaryBytes float64      `json:"item4_summary_bytes,omitempty"`
}

// Duration marshals as its string.
type Duration time.Duration

// MarshalJSON writes the duration as a string ("100ms").
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ReadReport reads a bench scale scale.json. A file that is not one (not
// JSON, no points) is an error that says so.
func ReadReport(path string) (*scale.Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scalemodel: %w", err)
	}
	return parseReport(b, path)
}

func parseReport(b []byte, name string) (*scale.Report, error) {
	var rep scale.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("scalemodel: %s is not a bench scale report: %w", name, err)
	}
	if len(rep.Points) == 0 {
		return nil, fmt.Errorf("scalemodel: %s has no points", name)
	}
	return &rep, nil
}

// largestMeasured is the most cells of a point with figures.
func largestMeasured(rep *scale.Report) int {
	n := 0
	for _, p := range rep.Points {
		if p.Skipped == "" && p.Figures != nil && p.Figures.OfferedHeartbeatsPerS > 0 {
			n = max(n, p.Cells)
		}
	}
	return n
}

// Build validates the model on rep's largest measured point, then runs
// the projections' grid.
func Build(rep *scale.Report, source string, opt Options) (*Report, error) {
	out := &Report{Source: source, ParamsFrom: CalibratedSource, Params: Calibrated(), Item4SummaryBytes: opt.Item4SummaryBytes,
		CycleInterval: Duration(100 * time.Millisecond)}
	if ms := rep.Config.CycleIntervalMs; ms > 0 {
		out.CycleInterval = Duration(time.Duration(ms * float64(time.Millisecond)))
	}
	if opt.Refit {
		p, err := Fit(rep, FitOptions{NearestRTT: opt.NearestRTT, CPUExp: opt.CPUExp})
		if err != nil {
			return nil, err
		}
		out.Params, out.ParamsFrom = p, "refitted on "+source
	}
	out.ValidationCells = largestMeasured(rep)
	if out.ValidationCells == 0 {
		return nil, errors.New("scalemodel: the report has no measured point")
	}
	var err error
	if out.Validation, err = Validate(out.Params, rep, out.ValidationCells, opt.NearestRTT, opt.Seed); err != nil {
		return nil, err
	}
	if opt.HoldoutMaxCells > 0 && opt.HoldoutMaxCells < out.ValidationCells {
		h, err := Fit(rep, FitOptions{MaxCells: opt.HoldoutMaxCells, NearestRTT: opt.NearestRTT, CPUExp: opt.CPUExp})
		if err != nil {
			return nil, fmt.Errorf("scalemodel: hold-out fit on ≤ %d cells: %w", opt.HoldoutMaxCells, err)
		}
		out.Holdout, out.HoldoutMaxCells = &h, opt.HoldoutMaxCells
		if out.HoldoutValidation, err = Validate(h, rep, out.ValidationCells, opt.NearestRTT, opt.Seed); err != nil {
			return nil, err
		}
	}
	if err := out.project(rep, opt); err != nil {
		return nil, err
	}
	return out, nil
}

// project runs the grid and the bends.
func (out *Report) project(rep *scale.Report, opt Options) error {
	c := rep.Config
	for _, cores := range opt.Cores {
		for _, cells := range opt.Cells {
			for _, regions := range opt.Regions {
				s := Scenario{Cells: cells, Regions: regions, Topology: scale.Hierarchical, Cores: cores, NearestRTT: opt.ProjectNearestRTT,
					HeartbeatInterval: ms(c.HeartbeatIntervalMs), CycleInterval: ms(c.CycleIntervalMs), SummaryInterval: ms(c.SummaryIntervalMs),
					Horizon: opt.Horizon, Seed: opt.Seed}
				if regions == 0 {
					s.Topology, s.Regions = scale.Flat, 1
				}
				r, err := Run(out.Params, s)
				if err != nil {
					return err
				}
				out.Projections = append(out.Projections, r)
				if regions > 1 {
					// One of the fleet's controllers on a machine of its own.
					s.Cells, s.Regions, s.OneOf = (cells+regions-1)/regions, 1, regions
					r, err := Run(out.Params, s)
					if err != nil {
						return err
					}
					out.Projections = append(out.Projections, r)
				}
			}
		}
		for _, regions := range opt.Regions {
			out.Bends = append(out.Bends, out.Params.CPUBend(cores, regions))
		}
	}
	return nil
}

// Write writes model.json and model.md to dir.
func Write(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("scalemodel: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("scalemodel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("scalemodel: %w", err)
	}
	var md strings.Builder
	WriteMarkdown(&md, r)
	if err := os.WriteFile(filepath.Join(dir, "model.md"), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("scalemodel: %w", err)
	}
	return nil
}

// WriteMarkdown renders r.
func WriteMarkdown(w io.Writer, r *Report) {
	fmt.Fprintf(w, "# isobar bench scale-model\n\nMeasured run: %s. Constants: %s.\n\n", r.Source, r.ParamsFrom)
	WriteParams(w, r.Params)
	fmt.Fprintf(w, "\n## The model beside the measured %d-cell points\n\n", r.ValidationCells)
	WriteValidation(w, r.Validation)
	if r.Holdout != nil {
		fmt.Fprintf(w, "\n## Hold-out: fitted on the points of ≤ %d cells only, beside the measured %d-cell points\n\n", r.HoldoutMaxCells, r.ValidationCells)
		WriteValidation(w, r.HoldoutValidation)
	}
	fmt.Fprintf(w, "\n## Projections\n\n")
	WriteResults(w, r.Projections, r.Item4SummaryBytes)
	fmt.Fprintf(w, "\n## Where it bends\n\n")
	WriteBends(w, r.Params, r.Bends, time.Duration(r.CycleInterval))
	all := slices.ContainsFunc(r.Validation, func(c Comparison) bool { return !c.Pass() })
	fmt.Fprintf(w, "\nEvery gated figure within %.0f %% of the measured point: %v.\n", 100*Tolerance, !all)
}
