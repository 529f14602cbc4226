package paper

import (
	"fmt"
	"image/color"
	"path/filepath"

	"github.com/isobar-mesh/isobar/bench/load"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writeCharts writes one ground's PNG charts — the TTFT CDF and the
// failover timeline of its first seed, sustainable RPS at the median over
// seeds (slo) — and returns their file names (relative to dir), each
// prefixed with the ground's name.
func writeCharts(dir string, r *runner, slo map[string]Figures) ([]string, error) {
	pre := r.cfg.Ground + "_"
	var out []string
	for _, c := range []struct {
		name string
		draw func() (*plot.Plot, error) // nil plot: nothing to draw
	}{
		{pre + "ttft_cdf.png", r.ttftChart},
		{pre + "failover_timeline.png", r.timelineChart},
		{pre + "slo_throughput.png", func() (*plot.Plot, error) { return r.sloChart(slo) }},
	} {
		p, err := c.draw()
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		if err := save(p, filepath.Join(dir, c.name)); err != nil {
			return nil, err
		}
		out = append(out, c.name)
	}
	return out, nil
}

// ttftChart is the calibration's TTFT distribution per policy; nil
// without a calibration.
func (r *runner) ttftChart() (*plot.Plot, error) {
	if len(r.calibTTFT) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Calibration: TTFT distribution (" + r.cfg.Ground + ", baseline_mixed, 10 RPS)"
	p.X.Label.Text = "TTFT (ms)"
	p.Y.Label.Text = "fraction of requests ≤ x"
	var lines []any
	for _, pol := range Policies() {
		ttft, ok := r.calibTTFT[pol]
		if !ok || len(ttft) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(ttft))
		for i, d := range ttft { // sorted by summarise
			pts[i].X = float64(d) / 1e6
			pts[i].Y = float64(i+1) / float64(len(ttft))
		}
		lines = append(lines, string(pol), pts)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, fmt.Errorf("paper: chart: %w", err)
	}
	return p, nil
}

// timelineChart is the failover's failed requests by arrival time per
// policy; nil without a failover stage.
func (r *runner) timelineChart() (*plot.Plot, error) {
	if len(r.timeline) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Failover: failed requests by arrival time (" + r.cfg.Ground + ", first kill)"
	p.X.Label.Text = "seconds from SIGKILL"
	p.Y.Label.Text = "failed requests per 250 ms"
	var lines []any
	for _, pol := range Policies() {
		bins, ok := r.timeline[pol]
		if !ok {
			continue
		}
		pts := make(plotter.XYs, len(bins))
		for i, b := range bins {
			pts[i].X = b.at.Seconds()
			pts[i].Y = float64(b.failed)
		}
		lines = append(lines, string(pol), pts)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, fmt.Errorf("paper: chart: %w", err)
	}
	return p, nil
}

// sloChart is the sustainable RPS per class and policy (st: the SLO
// stage's medians); nil when empty.
func (r *runner) sloChart(st map[string]Figures) (*plot.Plot, error) {
	if len(st) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Sustainable RPS at the tier-2 SLO (" + r.cfg.Ground + ", median over seeds)"
	p.Y.Label.Text = "RPS"
	names := sloClassesIn(st)
	w := vg.Points(10)
	k := 0
	pols := policyOrder(st)
	for _, pol := range pols {
		vals := make(plotter.Values, len(names))
		for i, c := range names {
			if v := st[pol][c+"_sustainable_rps"]; v != nil {
				vals[i] = *v
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, fmt.Errorf("paper: chart: %w", err)
		}
		bars.Color = plotutil.Color(k)
		bars.LineStyle.Color = color.Black
		bars.Offset = w * vg.Length(k-len(pols)/2)
		p.Add(bars)
		p.Legend.Add(pol, bars)
		k++
	}
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -0.1
	return p, nil
}

func sloClassesIn(st map[string]Figures) []string {
	var out []string
	for _, c := range classNames() {
		if _, ok := st["rr"][c+"_sustainable_rps"]; ok {
			out = append(out, c)
		}
	}
	return out
}

func save(p *plot.Plot, path string) error {
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("paper: chart %s: %w", filepath.Base(path), err)
	}
	return nil
}

func classNames() []string {
	var out []string
	for _, c := range load.Classes() {
		out = append(out, c.Name)
	}
	return out
}
