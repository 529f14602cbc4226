package lab

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/statusview"
)

// Report is the JSON written by --report.
type Report struct {
	Total Summary `json:"total"`
	// PrefixCache is every engine's automatic prefix caching over the run
	// (the regions' PrefixCache added up).
	PrefixCache PrefixCacheReport       `json:"prefix_cache"`
	Regions     map[string]RegionReport `json:"regions"`
	Globals     []GlobalReport          `json:"globals,omitempty"`
	// Shed counts requests the routing plan shed (a gateway's 429 with
	// x-isobar-shed: plan), over every region: Total.Failures.ShedByPlan.
	Shed int `json:"shed"`
	// ClientDropped counts arrivals dropped at the client because
	// MaxInFlight requests were open (Total.Failures.ClientDrop). They are
	// failures: a user's request that was never served.
	ClientDropped int `json:"client_dropped"`
	// Abandoned counts requests cut off when the run ended; they are not
	// counted in any summary.
	Abandoned int `json:"abandoned"`
	// ByCriticality is Total split by the requests' criticality (every
	// class that sent a request; all standard without a mix), ByTenant by
	// their tenant (only with Config.Tenants).
	ByCriticality map[string]Summary `json:"by_criticality"`
	ByTenant      map[string]Summary `json:"by_tenant,omitempty"`
}

// Summary is request counts, failures by cause and TTFT and end-to-end
// latency percentiles (of successful requests, at the client). Requests
// counts every arrival, client drops included, so SuccessRate is what the
// region's users saw.
type Summary struct {
	Requests    int         `json:"requests"`
	Succeeded   int         `json:"succeeded"`
	SuccessRate float64     `json:"success_rate"`
	Failures    Failures    `json:"failures"`
	TTFTms      Percentiles `json:"ttft_ms"`
	E2Ems       Percentiles `json:"e2e_ms"`
}

// Failures counts failed requests by cause (see the Cause constants).
type Failures struct {
	ShedByPlan     int `json:"shed_by_plan"`
	Saturated      int `json:"saturated"`
	Queue          int `json:"queue"`
	Residency      int `json:"residency"`
	EngineError    int `json:"engine_error"`
	GatewayError   int `json:"gateway_error"`
	TransportError int `json:"transport_error"`
	Timeout        int `json:"timeout"`
	ClientDrop     int `json:"client_drop"`
}

// add counts one failure of cause c.
func (f *Failures) add(c string) {
	switch c {
	case CauseShedByPlan:
		f.ShedByPlan++
	case CauseSaturated:
		f.Saturated++
	case CauseQueue:
		f.Queue++
	case CauseResidency:
		f.Residency++
	case CauseEngineError:
		f.EngineError++
	case CauseGatewayError:
		f.GatewayError++
	case CauseTimeout:
		f.Timeout++
	case CauseClientDrop:
		f.ClientDrop++
	default:
		f.TransportError++
	}
}

// Total is the number of failures.
func (f Failures) Total() int {
	return f.ShedByPlan + f.Saturated + f.Queue + f.Residency + f.EngineError + f.GatewayError + f.TransportError + f.Timeout + f.ClientDrop
}

// String lists the non-zero causes, e.g. "shed_by_plan 3, engine_error 1",
// or "none".
func (f Failures) String() string {
	var parts []string
	for _, c := range []struct {
		name string
		n    int
	}{{CauseShedByPlan, f.ShedByPlan}, {CauseSaturated, f.Saturated}, {CauseQueue, f.Queue}, {CauseResidency, f.Residency},
		{CauseEngineError, f.EngineError},
		{CauseGatewayError, f.GatewayError}, {CauseTransport, f.TransportError}, {CauseTimeout, f.Timeout},
		{CauseClientDrop, f.ClientDrop}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c.name, c.n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// RegionReport is one region: its clients' requests (wherever served), the
// cells that served them, and the region's own state at the end.
type RegionReport struct {
	Summary
	// Cells that served this region's clients (local or remote), by id.
	Cells map[string]CellReport `json:"cells"`
	// ServedBy counts this region's requests by serving region.
	ServedBy map[string]int `json:"served_by"`
	// State of the region's own cells at the end of the run.
	CellStates map[string]CellState `json:"cell_states"`
	// Routes in force at the end: source, epoch and per-model shares.
	Routes RoutesReport `json:"routes"`
	// PlansSeen lists each distinct routing the region had in force, as
	// sampled every view interval (ViewEvery) and at the end, oldest first
	// (at most maxPlansSeen). LocalOnly: every one of them sent all of the
	// region's demand home and shed none.
	PlansSeen []PlanSeen `json:"plans_seen"`
	LocalOnly bool       `json:"local_only"`
	// PrefixCache is the automatic prefix caching of the region's own
	// engines, whichever region's clients they served (unlike the request
	// figures above, which follow the clients).
	PrefixCache PrefixCacheReport `json:"prefix_cache"`
	// ByCriticality and ByTenant split the region's clients' requests as
	// the report's do.
	ByCriticality map[string]Summary `json:"by_criticality"`
	ByTenant      map[string]Summary `json:"by_tenant,omitempty"`
}

// PrefixCacheReport is what engines' prefix caches did, read from each
// engine's /metrics when the report is made (an engine restarted during
// the run counts from its restart, as its counters do).
type PrefixCacheReport struct {
	// QueriesTokens and HitsTokens are vllm:prefix_cache_queries_total
	// and vllm:prefix_cache_hits_total: prompt tokens looked up in the
	// prefix cache at admission, and those found cached.
	QueriesTokens int64 `json:"queries_tokens"`
	HitsTokens    int64 `json:"hits_tokens"`
	// HitRate is HitsTokens / QueriesTokens (0 with no queries).
	HitRate float64 `json:"hit_rate"`
	// Engines counts the engines read; Unread those whose /metrics could
	// not be read (killed or down at the end).
	Engines int `json:"engines"`
	Unread  int `json:"unread,omitempty"`
}

// add counts one engine's counters, or an unread engine.
func (p *PrefixCacheReport) add(o PrefixCacheReport) {
	p.QueriesTokens += o.QueriesTokens
	p.HitsTokens += o.HitsTokens
	p.Engines += o.Engines
	p.Unread += o.Unread
	p.HitRate = 0
	if p.QueriesTokens > 0 {
		p.HitRate = float64(p.HitsTokens) / float64(p.QueriesTokens)
	}
}

// prefixScrapeTimeout bounds the read of one engine's /metrics.
const prefixScrapeTimeout = 5 * time.Second

// maxMetricsPage caps an engine's /metrics page read for the report.
const maxMetricsPage = 4 << 20

// prefixCache reads the prefix-cache counters of engines from their
// /metrics, with the cellagent's parser; an engine that cannot be read
// counts as unread.
func prefixCache(engines []*sim.Engine) PrefixCacheReport {
	c := &http.Client{Timeout: prefixScrapeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	var rep PrefixCacheReport
	for _, e := range engines {
		q, h, err := readPrefixCounters(c, e.Addr())
		if err != nil {
			rep.add(PrefixCacheReport{Unread: 1})
			continue
		}
		rep.add(PrefixCacheReport{QueriesTokens: q, HitsTokens: h, Engines: 1})
	}
	return rep
}

// readPrefixCounters scrapes one engine at addr.
func readPrefixCounters(c *http.Client, addr string) (queries, hits int64, err error) {
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("lab: %s/metrics: status %d", addr, resp.StatusCode)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsPage))
	if err != nil {
		return 0, 0, err
	}
	s, err := cellagent.ParseVLLM(page, cellagent.VLLMOptions{})
	if err != nil {
		return 0, 0, err
	}
	if s.PrefixQueries == nil || s.PrefixHits == nil {
		return 0, 0, fmt.Errorf("lab: %s/metrics: no prefix-cache counters", addr)
	}
	return int64(*s.PrefixQueries), int64(*s.PrefixHits), nil
}

// PlanSeen is one routing a region had in force.
type PlanSeen struct {
	// AtS is seconds since the lab started.
	AtS float64 `json:"at_s"`
	RoutesReport
}

// maxPlansSeen bounds the plans recorded per region.
const maxPlansSeen = 10000

// localOnly reports whether r sends every model wholly home, shedding none.
func (r RoutesReport) localOnly(home string) bool {
	for m, routes := range r.Models {
		if r.Shed[m] > 0 {
			return false
		}
		for d, f := range routes {
			if d != home && f > 0 {
				return false
			}
		}
	}
	return true
}

// routesReport renders a region's route table (nil: local routing, no
// global).
func routesReport(rt *regional.RouteTable) RoutesReport {
	if rt == nil {
		return RoutesReport{Source: "local"}
	}
	rr := RoutesReport{Source: rt.Source, Epoch: rt.Epoch, Models: map[string]map[string]float64{}, Shed: map[string]float64{}}
	for m, mr := range rt.Models {
		rr.Models[m] = maps.Clone(mr.Routes)
		rr.Shed[m] = mr.Shed
	}
	return rr
}

// notePlans records each region's routing when it differs from the last
// one recorded for that region.
func (l *Lab) notePlans() {
	now := l.clock.Now()
	routes := map[string]*regional.RouteTable{}
	for _, r := range l.Regions() {
		routes[r.Name] = r.Ctrl.Routes()
	}
	l.plans.note(now, routes)
}

// CellReport is what one cell served for a region's clients.
type CellReport struct {
	Requests  int `json:"requests"`
	Succeeded int `json:"succeeded"`
}

// CellState is a cell as its controller saw it at the end.
type CellState struct {
	State    string  `json:"state"`
	Weight   uint32  `json:"weight"`
	Pressure float64 `json:"pressure"`
}

// RoutesReport is a region's cross-region routing.
type RoutesReport struct {
	Source string                        `json:"source"`
	Epoch  uint64                        `json:"epoch"`
	Models map[string]map[string]float64 `json:"models,omitempty"`
	Shed   map[string]float64            `json:"shed,omitempty"`
}

// GlobalReport is one member of the pair.
type GlobalReport struct {
	ID     string `json:"id"`
	Leader bool   `json:"leader"`
}

func summarise(os []Outcome) Summary {
	s := Summary{Requests: len(os)}
	var ttft, e2e []time.Duration
	for _, o := range os {
		if o.OK {
			s.Succeeded++
			ttft = append(ttft, o.TTFT)
			e2e = append(e2e, o.End.Sub(o.Start))
		} else {
			s.Failures.add(o.Cause)
		}
	}
	if s.Requests > 0 {
		s.SuccessRate = float64(s.Succeeded) / float64(s.Requests)
	}
	s.TTFTms, s.E2Ems = percentiles(ttft), percentiles(e2e)
	return s
}

// Report returns the figures so far. It reads every engine's /metrics for
// the prefix-cache figures.
func (l *Lab) Report() Report {
	rep := Report{Regions: map[string]RegionReport{}}
	var all []Outcome
	for i, r := range l.Regions() {
		var os []Outcome
		if i < len(l.traffic) {
			t := l.traffic[i]
			os = t.Outcomes()
			t.mu.Lock()
			rep.Abandoned += t.abandoned
			t.mu.Unlock()
		}
		all = append(all, os...)
		rr := RegionReport{Summary: summarise(os), Cells: map[string]CellReport{}, ServedBy: map[string]int{},
			CellStates: map[string]CellState{}}
		for _, o := range os {
			if o.Cell == "" {
				continue
			}
			c := rr.Cells[o.Cell]
			c.Requests++
			if o.OK {
				c.Succeeded++
			}
			rr.Cells[o.Cell] = c
			if o.Region != "" {
				rr.ServedBy[o.Region]++
			}
		}
		for _, c := range r.Ctrl.Registry().View().Cells {
			rr.CellStates[c.ID] = CellState{State: c.State.String(), Weight: c.Weight.Published, Pressure: c.Score.Pressure}
		}
		rr.Routes = routesReport(r.Ctrl.Routes())
		rr.PlansSeen = l.plans.seen(r.Name)
		rr.LocalOnly = rr.Routes.localOnly(r.Name)
		for _, p := range rr.PlansSeen {
			rr.LocalOnly = rr.LocalOnly && p.localOnly(r.Name)
		}
		rr.ByCriticality, rr.ByTenant = byCriticality(os), byTenant(os, len(l.cfg.Tenants) > 0)
		rr.PrefixCache = prefixCache(r.Engines)
		rep.PrefixCache.add(rr.PrefixCache)
		rep.Regions[r.Name] = rr
	}
	rep.Total = summarise(all)
	rep.ByCriticality, rep.ByTenant = byCriticality(all), byTenant(all, len(l.cfg.Tenants) > 0)
	rep.Shed, rep.ClientDropped = rep.Total.Failures.ShedByPlan, rep.Total.Failures.ClientDrop
	for _, g := range l.Globals() {
		rep.Globals = append(rep.Globals, GlobalReport{ID: g.ID(), Leader: g.IsLeader()})
	}
	return rep
}

// render draws the live view: per region its routing and recent traffic,
// then one row per cell.
func (l *Lab) render(out io.Writer) {
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J")
	workload := l.cfg.Workload
	if workload == WorkloadMultiturn {
		workload += fmt.Sprintf(" (%d sessions)", l.cfg.Sessions)
	}
	fmt.Fprintf(&b, "isobar lab — %d regions × %d cells, %.1f RPS per region, %s, LB %s   (Ctrl-C to stop)\n",
		len(l.Regions()), l.cfg.Cells, l.cfg.RPS, workload, l.cfg.LB)
	for _, g := range l.Globals() {
		role := "standby"
		if g.IsLeader() {
			role = "LEADER"
		}
		fmt.Fprintf(&b, "global %-28s %s  http://%s/debug/plan\n", g.ID(), role, g.HTTPAddr())
	}
	now := l.clock.Now()
	var total []Outcome
	for _, r := range l.Regions() {
		var recent []Outcome
		for _, o := range l.Outcomes(r.Name) {
			if now.Sub(o.End) <= recentWindow {
				recent = append(recent, o)
			}
		}
		total = append(total, recent...)
		s := summarise(recent)
		fmt.Fprintf(&b, "\n■ %s  controller %s  gateway %s\n", r.Name, r.Ctrl.HTTPAddr(), r.Gateway.Addr())
		fmt.Fprintf(&b, "  routes: %s\n", routesLine(r, now))
		fmt.Fprintf(&b, "  last 10 s: %d requests, success %s, TTFT P50 %s P95 %s P99 %s\n",
			s.Requests, pct(s.Succeeded, s.Requests), ms(s.TTFTms.P50, s.Succeeded), ms(s.TTFTms.P95, s.Succeeded), ms(s.TTFTms.P99, s.Succeeded))
		fmt.Fprintf(&b, "  failures (10 s): %s\n", s.Failures)
		if l.cfg.mixSet() {
			fmt.Fprintf(&b, "  by criticality (10 s): %s\n", classLine(recent))
		}
		served := map[string]int{}
		for _, o := range recent {
			served[o.Cell]++
		}
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CELL\tSTATE\tPRESSURE\tWEIGHT\tSERVED/10s\tPREFIX HIT\tFALLBACK\tREASON")
		for _, c := range r.Ctrl.Registry().View().Cells {
			fb := ""
			if c.Fallback {
				fb = "yes"
			}
			hit := "-"
			if c.Signals != nil && c.Signals.PrefixCacheHitRate != nil {
				hit = fmt.Sprintf("%.0f%%", 100*c.Signals.GetPrefixCacheHitRate())
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%d\t%d\t%s\t%s\t%s\n", c.ID, c.State, c.Score.Pressure, c.Weight.Published, served[c.ID], hit, fb, c.Reason)
		}
		_ = tw.Flush()
	}
	s := summarise(total)
	fmt.Fprintf(&b, "\nall regions, last 10 s: %d requests, success %s, TTFT P50 %s P95 %s P99 %s; failures: %s\n",
		s.Requests, pct(s.Succeeded, s.Requests), ms(s.TTFTms.P50, s.Succeeded), ms(s.TTFTms.P95, s.Succeeded), ms(s.TTFTms.P99, s.Succeeded), s.Failures)
	_, _ = io.WriteString(out, b.String())
}

// routesLine summarises the region's routes in force as `isobar status`
// does (statusview): the source, for a plan its epoch, sequence, leader
// and remaining validity at now, then each model's shares by destination,
// largest first, and the share shed.
func routesLine(r *Region, now time.Time) string {
	rt := r.Ctrl.Routes()
	if rt == nil {
		return "local only (no global)"
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(rt.Models)) {
		mr := rt.Models[m]
		part := statusview.Shares(mr.Routes, nil)
		if mr.Shed > 0 {
			part += fmt.Sprintf(", shed %.4f", mr.Shed)
		}
		parts = append(parts, part)
	}
	line := statusview.RoutesSummary(*rt, &now)
	if len(parts) == 0 {
		return line
	}
	return line + " → " + strings.Join(parts, " | ")
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
