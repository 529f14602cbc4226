package lab

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the JSON written by --report.
type Report struct {
	Total   Summary                 `json:"total"`
	Regions map[string]RegionReport `json:"regions"`
	// Shed counts arrivals dropped because MaxInFlight requests were open.
	Shed int `json:"shed"`
	// Abandoned counts requests still in flight when the run ended and
	// the drain timeout cut them off (not counted as failures).
	Abandoned int `json:"abandoned"`
}

// Summary is request counts and TTFT percentiles (successful requests).
type Summary struct {
	Requests    int         `json:"requests"`
	Succeeded   int         `json:"succeeded"`
	SuccessRate float64     `json:"success_rate"`
	TTFTms      Percentiles `json:"ttft_ms"`
}

// RegionReport is one region's figures.
type RegionReport struct {
	Summary
	Cells map[string]CellReport `json:"cells"`
}

// CellReport is one cell's figures and its state at the end of the run.
type CellReport struct {
	Requests  int         `json:"requests"`
	Succeeded int         `json:"succeeded"`
	TTFTms    Percentiles `json:"ttft_ms"`
	State     string      `json:"state"`
	Weight    uint32      `json:"weight"`
	Pressure  float64     `json:"pressure"`
}

func summary(s *stats) Summary {
	out := Summary{Requests: s.requests, Succeeded: s.succeeded, TTFTms: percentiles(s.ttft)}
	if s.requests > 0 {
		out.SuccessRate = float64(s.succeeded) / float64(s.requests)
	}
	return out
}

// Report returns the figures so far.
func (l *Lab) Report() Report {
	t := l.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	rr := RegionReport{Summary: summary(&t.total), Cells: map[string]CellReport{}}
	for _, c := range l.ctrl.Registry().View().Cells {
		rr.Cells[c.ID] = CellReport{State: c.State.String(), Weight: c.Weight.Published, Pressure: c.Score.Pressure}
	}
	for id, s := range t.cells {
		cr := rr.Cells[id]
		cr.Requests, cr.Succeeded, cr.TTFTms = s.requests, s.succeeded, percentiles(s.ttft)
		rr.Cells[id] = cr
	}
	return Report{Total: rr.Summary, Regions: map[string]RegionReport{l.cfg.Region: rr}, Shed: t.shed, Abandoned: t.abandoned}
}

// render draws the live view: one row per cell with its lifecycle state,
// pressure, published weight and the last 10 s of traffic it served.
func (l *Lab) render(out io.Writer) {
	v := l.ctrl.Registry().View()
	t := l.traffic
	t.mu.Lock()
	type row struct {
		ok, n int
		ttft  []time.Duration
	}
	recent := map[string]row{}
	var all row
	for id, s := range t.cells {
		var r row
		for _, o := range s.recent {
			r.n++
			if o.ok {
				r.ok++
				r.ttft = append(r.ttft, o.ttft)
			}
		}
		recent[id] = r
		all.n, all.ok = all.n+r.n, all.ok+r.ok
		all.ttft = append(all.ttft, r.ttft...)
	}
	total, shed := t.total, t.shed
	t.mu.Unlock()

	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J")
	fmt.Fprintf(&b, "isobar lab — region %s, %d cells, %.1f RPS offered   (Ctrl-C to stop)\n", l.cfg.Region, len(l.engines), l.cfg.RPS)
	fmt.Fprintf(&b, "controller %s   debug http://%s/debug/cells   xDS version %s\n\n", l.ctrl.Addr(), l.ctrl.HTTPAddr(), l.ctrl.XDSVersion())
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tSTATE\tPRESSURE\tWEIGHT\tREQ/10s\tOK%\tTTFT P50\tP95\tP99\tFALLBACK\tREASON")
	ids := make([]string, 0, len(v.Cells))
	for _, c := range v.Cells {
		ids = append(ids, c.ID)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c, _ := v.Cell(id)
		r := recent[id]
		p := percentiles(r.ttft)
		fb := ""
		if c.Fallback {
			fb = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
			id, c.State, c.Score.Pressure, c.Weight.Published, r.n, pct(r.ok, r.n), ms(p.P50, len(r.ttft)), ms(p.P95, len(r.ttft)), ms(p.P99, len(r.ttft)), fb, c.Reason)
	}
	_ = tw.Flush()
	p := percentiles(all.ttft)
	fmt.Fprintf(&b, "\nlast 10 s: %d requests, success %s, TTFT P50 %s  P95 %s  P99 %s\n", all.n, pct(all.ok, all.n),
		ms(p.P50, len(all.ttft)), ms(p.P95, len(all.ttft)), ms(p.P99, len(all.ttft)))
	fmt.Fprintf(&b, "since start: %d requests, success %s, shed %d\n", total.requests, pct(total.succeeded, total.requests), shed)
	_, _ = io.WriteString(out, b.String())
}

func ms(v float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f ms", v)
}

func pct(ok, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(ok)/float64(n))
}
