package scale

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// series is one line of a chart: a topology (and region count) over the
// fleet sizes.
type series struct {
	name string
	xys  plotter.XYs
}

// seriesOf groups the measured points by topology and region count and
// keeps value(p) where it is finite and positive (the axes are
// logarithmic).
func seriesOf(rep *Report, value func(*Figures) float64) []series {
	byName := map[string]*series{}
	var order []string
	for _, p := range rep.Points {
		if p.Figures == nil {
			continue
		}
		v := value(p.Figures)
		if !(v > 0) || math.IsInf(v, 0) {
			continue
		}
		name := Flat
		if p.Topology == Hierarchical {
			name = fmt.Sprintf("hierarchical, %d regions", p.Regions)
		}
		s := byName[name]
		if s == nil {
			s = &series{name: name}
			byName[name] = s
			order = append(order, name)
		}
		s.xys = append(s.xys, plotter.XY{X: float64(p.Cells), Y: v})
	}
	out := make([]series, 0, len(order))
	for _, n := range order {
		s := byName[n]
		slices.SortFunc(s.xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
		out = append(out, *s)
	}
	return out
}

// chart is one PNG: a title, a y label and the lines.
type chart struct {
	file, title, ylabel string
	lines               []series
}

// writeCharts writes ChartFiles into dir.
func writeCharts(dir string, rep *Report) error {
	charts := []chart{
		{"cycle.png", "Cycle cost (score + project + xDS build) per controller", "cycle P50 (ms)",
			seriesOf(rep, func(f *Figures) float64 { return f.CycleP50Ms })},
		{"inbound.png", "Inbound bytes/s at the top of the control plane", "global inbound (bytes/s)",
			seriesOf(rep, func(f *Figures) float64 { return f.GlobalInboundBytesPerS })},
		{"cpu.png", "Controllers' process CPU per 1,000 cells (senders too when in-process)", "CPU s/s per 1k cells",
			seriesOf(rep, func(f *Figures) float64 { return f.CPUSPerSPer1kCells })},
		{"death.png", "Cell death to weight removed at an xDS client (P50 solid, P99 dashed)", "ms", nil},
	}
	p50 := seriesOf(rep, func(f *Figures) float64 { return f.DeathToRemovedP50Ms })
	p99 := seriesOf(rep, func(f *Figures) float64 { return f.DeathToRemovedP99Ms })
	for i := range p99 {
		p99[i].name += " P99"
	}
	charts[3].lines = append(p50, p99...)
	for i, c := range charts {
		if err := c.write(filepath.Join(dir, c.file), i == 3); err != nil {
			return err
		}
	}
	return nil
}

func (c chart) write(path string, linearY bool) error {
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = "cells"
	p.Y.Label.Text = c.ylabel
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	if !linearY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Legend.Top, p.Legend.Left = true, true
	half := (len(c.lines) + 1) / 2
	for i, s := range c.lines {
		ci := i
		if linearY && i >= half {
			ci = i - half // P99 keeps its P50's colour
		}
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return fmt.Errorf("scale: chart %s: %w", c.file, err)
		}
		l.Color, pts.Color = plotutil.Color(ci), plotutil.Color(ci)
		pts.Shape = plotutil.Shape(ci)
		if linearY && i >= half {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	if len(c.lines) > 0 {
		padLogRanges(p, c.lines, linearY)
	}
	if len(c.lines) == 0 {
		// An empty chart still says so rather than failing the report.
		p.Title.Text += " (no measured points)"
		p.X.Scale, p.Y.Scale = plot.LinearScale{}, plot.LinearScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.DefaultTicks{}, plot.DefaultTicks{}
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
	}
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("scale: chart %s: %w", c.file, err)
	}
	return nil
}

// padLogRanges gives a logarithmic axis whose points all share one value
// (one fleet size, or one measured figure) the range of that value ± a
// factor 2: gonum pads an empty range by ±1, which can reach 0 or below,
// where a log scale has no ticks (it panics).
func padLogRanges(p *plot.Plot, lines []series, linearY bool) {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range lines {
		for _, xy := range s.xys {
			xmin, xmax = min(xmin, xy.X), max(xmax, xy.X)
			ymin, ymax = min(ymin, xy.Y), max(ymax, xy.Y)
		}
	}
	if xmin == xmax {
		p.X.Min, p.X.Max = xmin/2, xmax*2
	}
	if !linearY && ymin == ymax {
		p.Y.Min, p.Y.Max = ymin/2, ymax*2
	}
}
