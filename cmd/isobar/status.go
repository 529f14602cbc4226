package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional"
)

// Limits of `isobar status`.
const (
	// statusMaxBody caps one debug answer (10,000 cells are about 20 MB).
	statusMaxBody = 64 << 20
	// statusMinWatch is the shortest --watch period.
	statusMinWatch = 100 * time.Millisecond
	// statusMaxText caps a string printed in a table cell.
	statusMaxText = 64
	// statusSnippet is how much of a bad answer an error quotes.
	statusSnippet = 120
)

// errStatusSources reports that some sources could not be read; the
// report was still printed with the error in each failed source's place.
var errStatusSources = errors.New("status: some sources could not be read")

// errStatusUnreachable marks a request that got no HTTP answer at all.
var errStatusUnreachable = errors.New("cannot reach")

type statusFlags struct {
	controllers []string
	globals     []string
	output      string
	watch       time.Duration
	timeout     time.Duration
}

// statusDeps are the command's collaborators; tests inject a fake clock
// and the httptest client.
type statusDeps struct {
	clock  clockwork.Clock
	client *http.Client
}

// newStatusCmd builds `isobar status`, the live fleet view read from the
// controllers' debug HTTP APIs. It writes to the command's output writer.
func newStatusCmd(ro *rootOpts) *cobra.Command {
	return newStatusCmdWith(ro, statusDeps{clock: clockwork.NewRealClock(), client: &http.Client{}})
}

func newStatusCmdWith(_ *rootOpts, deps statusDeps) *cobra.Command {
	f := &statusFlags{}
	cmd := &cobra.Command{
		Use:   "status --controller ADDR [--controller ADDR ...] [--global ADDR ...]",
		Short: "Show the live fleet of regional controllers and the global plan",
		Long: `status reads the debug HTTP API of one or more regional controllers
(their --http-listen address) and prints, per controller, one row per cell and
the cross-region routes in force; with --global, also a global member's view
of the regions and the plan it last published.

Cell columns: CELL id; STATE lifecycle state (+drain when an operator drained
it, +conflict when its endpoint collides with another cell's); PRESSURE the
composite pressure in [0,1]; WEIGHT the weight published to the data plane
and TARGET the weight the signals alone would give; PENALTY the error-rate
penalty (with "probation" while re-admitted on probation); FALLBACK "yes"
when a telemetry source is missing and the score renormalised over the rest;
HEARTBEAT the age of the last heartbeat on the controller's clock; ENDPOINT;
MODEL/MAX_LEN; REASON of the last state change.

Routes: the source (plan: the global leader's plan; fallback: local-first
with spill-over from gossiped summaries; local: everything local), the plan's
epoch and sequence, and per model the share of this region's ingress served
by each region and the share shed.

Addresses are host:port or http(s)://host:port. --controller and --global may
be repeated. --output json prints the same as JSON (the debug API's own
shapes); with --watch, one JSON document per line per refresh.

Exit status: 0 when every source answered, 1 when one could not be reached
or did not answer JSON (the others are still printed), 2 for a bad command
line. With --watch, status runs until interrupted and exits 0.`,
		Example: `  isobar status --controller 127.0.0.1:9090
  isobar status --controller 127.0.0.1:9090 --controller 127.0.0.1:9190 --watch 2s
  isobar status --global 127.0.0.1:9091 --output json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("status takes no arguments, got %q; give addresses with --controller", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), cmd.OutOrStdout(), deps)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.controllers, "controller", "c", nil, "regional controller debug address, host:port (repeatable)")
	fl.StringArrayVarP(&f.globals, "global", "g", nil, "global member debug address, host:port (repeatable)")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.DurationVarP(&f.watch, "watch", "w", 0, "refresh every DURATION until interrupted (0: print once)")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Second, "time limit of each HTTP request")
	return cmd
}

// statusSource is one address to read.
type statusSource struct {
	addr string // as given
	base string // scheme://host:port
}

func (f *statusFlags) sources() (ctrls, globals []statusSource, err error) {
	if len(f.controllers) == 0 && len(f.globals) == 0 {
		return nil, nil, usageError{errors.New("give at least one --controller ADDR (a regional controller's --http-listen address) or --global ADDR")}
	}
	parse := func(flag string, addrs []string) ([]statusSource, error) {
		var out []statusSource
		for _, a := range addrs {
			base, err := statusBaseURL(a)
			if err != nil {
				return nil, usageError{fmt.Errorf("--%s %q: %w", flag, a, err)}
			}
			out = append(out, statusSource{addr: a, base: base})
		}
		return out, nil
	}
	if ctrls, err = parse("controller", f.controllers); err != nil {
		return nil, nil, err
	}
	if globals, err = parse("global", f.globals); err != nil {
		return nil, nil, err
	}
	return ctrls, globals, nil
}

// statusBaseURL turns host:port or http(s)://host:port into a base URL.
func statusBaseURL(addr string) (string, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		switch {
		case err != nil:
			return "", errors.New("not a URL; want host:port or http://host:port")
		case u.Scheme != "http" && u.Scheme != "https":
			return "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
		case u.Host == "" || u.Port() == "":
			return "", errors.New("no host:port; want e.g. http://127.0.0.1:9090")
		case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil:
			return "", errors.New("give the address only, without path, query or user")
		}
		return u.Scheme + "://" + u.Host, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return "", errors.New("want host:port, e.g. 127.0.0.1:9090")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

func (f *statusFlags) run(ctx context.Context, w io.Writer, deps statusDeps) error {
	if f.output != "table" && f.output != "json" {
		return usageError{fmt.Errorf("--output %q: want table or json", f.output)}
	}
	if f.watch != 0 && f.watch < statusMinWatch {
		return usageError{fmt.Errorf("--watch %v: want 0 (print once) or at least %v", f.watch, statusMinWatch)}
	}
	if f.timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %v: want a positive duration", f.timeout)}
	}
	ctrls, globals, err := f.sources()
	if err != nil {
		return err
	}
	s := &statusFetcher{client: deps.client, timeout: f.timeout}
	if f.watch == 0 {
		rep := s.collect(ctx, ctrls, globals)
		if err := f.print(w, rep, false); err != nil {
			return err
		}
		if n := rep.failed(); n > 0 {
			return fmt.Errorf("%w: %d of %d could not be read (see above)", errStatusSources, n, len(ctrls)+len(globals))
		}
		return nil
	}
	tick := deps.clock.NewTicker(f.watch)
	defer tick.Stop()
	clearScreen := f.output == "table" && isTerminal(w)
	for {
		rep := s.collect(ctx, ctrls, globals)
		if ctx.Err() != nil {
			return nil
		}
		if f.output == "table" {
			if clearScreen {
				fmt.Fprint(w, "\x1b[H\x1b[2J")
			}
			fmt.Fprintf(w, "isobar status at %s, every %v (Ctrl-C to stop)\n\n", deps.clock.Now().Format(time.TimeOnly), f.watch)
		}
		if err := f.print(w, rep, true); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.Chan():
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (f *statusFlags) print(w io.Writer, rep statusReport, watching bool) error {
	if f.output == "json" {
		enc := json.NewEncoder(w)
		if !watching {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(rep)
	}
	return writeStatusTable(w, rep)
}

// statusReport is what one refresh read. Its JSON form is --output json.
type statusReport struct {
	Controllers []controllerStatus `json:"controllers,omitempty"`
	Globals     []globalStatus     `json:"globals,omitempty"`
}

// controllerStatus is one regional controller: GET /debug/cells and GET
// /debug/routes.
type controllerStatus struct {
	Controller string               `json:"controller"`
	Errors     []string             `json:"errors,omitempty"`
	At         *time.Time           `json:"at,omitempty"`
	Cycle      uint64               `json:"cycle,omitempty"`
	Cells      []regional.CellDebug `json:"cells"`
	Routes     *regional.RouteTable `json:"routes,omitempty"`
}

// globalStatus is one global member: GET /debug/regions and GET
// /debug/plan.
type globalStatus struct {
	Global   string                `json:"global"`
	Errors   []string              `json:"errors,omitempty"`
	Leader   bool                  `json:"leader"`
	Regions  []global.RegionStatus `json:"regions"`
	Plan     json.RawMessage       `json:"plan,omitempty"`
	PlanNote string                `json:"plan_note,omitempty"`
	plan     *isobarpb.RoutingPlan
}

func (r statusReport) failed() int {
	n := 0
	for _, c := range r.Controllers {
		if len(c.Errors) > 0 {
			n++
		}
	}
	for _, g := range r.Globals {
		if len(g.Errors) > 0 {
			n++
		}
	}
	return n
}

// statusCells is the JSON shape of GET /debug/cells.
type statusCells struct {
	At    time.Time            `json:"at"`
	Cycle uint64               `json:"cycle"`
	Cells []regional.CellDebug `json:"cells"`
}

// statusRegions is the JSON shape of GET /debug/regions.
type statusRegions struct {
	Leader  bool                  `json:"leader"`
	Regions []global.RegionStatus `json:"regions"`
}

// statusFetcher reads the debug APIs.
type statusFetcher struct {
	client  *http.Client
	timeout time.Duration
}

// collect reads every source concurrently; failures are recorded in the
// report, never returned.
func (s *statusFetcher) collect(ctx context.Context, ctrls, globals []statusSource) statusReport {
	rep := statusReport{
		Controllers: make([]controllerStatus, len(ctrls)),
		Globals:     make([]globalStatus, len(globals)),
	}
	var wg sync.WaitGroup
	for i, src := range ctrls {
		wg.Go(func() { rep.Controllers[i] = s.controller(ctx, src) })
	}
	for i, src := range globals {
		wg.Go(func() { rep.Globals[i] = s.global(ctx, src) })
	}
	wg.Wait()
	return rep
}

func (s *statusFetcher) controller(ctx context.Context, src statusSource) controllerStatus {
	st := controllerStatus{Controller: src.addr, Cells: []regional.CellDebug{}}
	var cells statusCells
	if _, err := s.get(ctx, src.base+"/debug/cells", &cells, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
		if errors.Is(err, errStatusUnreachable) {
			return st // the routes would fail the same way
		}
	} else {
		at := cells.At
		st.At, st.Cycle = &at, cells.Cycle
		if cells.Cells != nil {
			st.Cells = cells.Cells
		}
		slices.SortFunc(st.Cells, func(a, b regional.CellDebug) int { return strings.Compare(a.ID, b.ID) })
	}
	var routes regional.RouteTable
	if _, err := s.get(ctx, src.base+"/debug/routes", &routes, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
	} else {
		st.Routes = &routes
	}
	return st
}

func (s *statusFetcher) global(ctx context.Context, src statusSource) globalStatus {
	st := globalStatus{Global: src.addr, Regions: []global.RegionStatus{}}
	var regions statusRegions
	if _, err := s.get(ctx, src.base+"/debug/regions", &regions, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
		if errors.Is(err, errStatusUnreachable) {
			return st
		}
	} else {
		st.Leader = regions.Leader
		if regions.Regions != nil {
			st.Regions = regions.Regions
		}
	}
	var raw json.RawMessage
	code, err := s.get(ctx, src.base+"/debug/plan", &raw, true)
	switch {
	case err != nil:
		st.Errors = append(st.Errors, err.Error())
	case code == http.StatusNotFound:
		// No plan published by this member: {"error": ..., "leader": ...}.
		var none struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &none)
		st.PlanNote = none.Error
		if st.PlanNote == "" {
			st.PlanNote = "no plan"
		}
	default:
		plan := &isobarpb.RoutingPlan{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, plan); err != nil {
			st.Errors = append(st.Errors, fmt.Sprintf("GET %s/debug/plan: not a routing plan: %v", src.base, err))
			break
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err == nil {
			st.Plan = buf.Bytes()
		}
		st.plan = plan
	}
	return st
}

// get fetches url and decodes its JSON answer into v. A status other than
// 200 is an error, except 404 when allow404 is set (its JSON body is still
// decoded). Errors name the URL and quote the start of a bad answer.
func (s *statusFetcher) get(ctx context.Context, rawURL string, v any, allow404 bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", rawURL, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%w %s: %w", errStatusUnreachable, rawURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, statusMaxBody+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: reading the answer: %w", rawURL, err)
	}
	if len(body) > statusMaxBody {
		return resp.StatusCode, fmt.Errorf("GET %s: answer larger than %d bytes", rawURL, statusMaxBody)
	}
	if resp.StatusCode != http.StatusOK && (resp.StatusCode != http.StatusNotFound || !allow404) {
		return resp.StatusCode, fmt.Errorf("GET %s: HTTP %d: %s", rawURL, resp.StatusCode, statusQuote(body))
	}
	if !json.Valid(body) {
		what := "no content type"
		if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err == nil {
			what = mt
		}
		return resp.StatusCode, fmt.Errorf("GET %s: answered %s, not JSON: %s (is this the --http-listen address?)", rawURL, what, statusQuote(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: not the expected JSON: %v: %s", rawURL, err, statusQuote(body))
	}
	return resp.StatusCode, nil
}

// statusQuote quotes the start of a body for an error message.
func statusQuote(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "(empty)"
	}
	more := ""
	if len(b) > statusSnippet {
		b, more = b[:statusSnippet], "..."
	}
	return strconv.Quote(string(b)) + more
}

// statusText makes an outside string safe for a table cell: control
// characters, tabs and invalid UTF-8 are escaped, and long strings cut.
func statusText(s string) string {
	if s == "" {
		return "-"
	}
	clean := utf8.ValidString(s)
	for _, r := range s {
		if !unicode.IsPrint(r) || r == '\t' {
			clean = false
			break
		}
	}
	if !clean {
		s = strings.Trim(strconv.QuoteToGraphic(s), `"`)
	}
	if utf8.RuneCountInString(s) > statusMaxText {
		r := []rune(s)
		s = string(r[:statusMaxText-1]) + "…"
	}
	return s
}

func statusYesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// statusAge formats a duration for a table: 0.4s, 12s, 3m05s.
func statusAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 24*time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func writeStatusTable(w io.Writer, rep statusReport) error {
	for i, c := range rep.Controllers {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := writeControllerTable(w, c); err != nil {
			return err
		}
	}
	for i, g := range rep.Globals {
		if i > 0 || len(rep.Controllers) > 0 {
			fmt.Fprintln(w)
		}
		if err := writeGlobalTable(w, g); err != nil {
			return err
		}
	}
	return nil
}

func writeControllerTable(w io.Writer, c controllerStatus) error {
	head := "controller " + statusText(c.Controller)
	if c.At != nil {
		states := map[string]int{}
		for _, cell := range c.Cells {
			states[cell.State]++
		}
		parts := make([]string, 0, len(states))
		for _, s := range sortedKeys(states) {
			parts = append(parts, fmt.Sprintf("%d %s", states[s], statusText(s)))
		}
		head += fmt.Sprintf(": %d cells", len(c.Cells))
		if len(parts) > 0 {
			head += " (" + strings.Join(parts, ", ") + ")"
		}
		head += fmt.Sprintf(", cycle %d, at %s", c.Cycle, c.At.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "== %s\n", head)
	for _, e := range c.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	if c.At != nil && len(c.Cells) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CELL\tSTATE\tPRESSURE\tWEIGHT\tTARGET\tPENALTY\tFALLBACK\tHEARTBEAT\tENDPOINT\tMODEL/MAX_LEN\tREASON")
		for _, cell := range c.Cells {
			state := statusText(cell.State)
			if cell.OperatorDrain {
				state += "+drain"
			}
			if cell.EndpointConflict {
				state += "+conflict"
			}
			penalty := "-"
			if cell.Penalty > 0 || cell.Probation {
				penalty = strconv.FormatFloat(cell.Penalty, 'f', 2, 64)
				if cell.Probation {
					penalty += " probation"
				}
			}
			hb := "never"
			if !cell.LastSeen.IsZero() {
				hb = statusAge(c.At.Sub(cell.LastSeen))
			}
			model := statusText(cell.Model)
			if cell.MaxModelLen > 0 {
				model += "/" + strconv.FormatUint(uint64(cell.MaxModelLen), 10)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
				statusText(cell.ID), state, cell.Pressure, cell.Weight, cell.TargetWeight, penalty,
				statusYesNo(cell.Fallback), hb, statusText(cell.Endpoint), model, statusText(cell.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	} else if c.At != nil {
		fmt.Fprintln(w, "no cells")
	}
	if c.Routes != nil {
		return writeRoutes(w, *c.Routes, c.At)
	}
	return nil
}

// writeRoutes prints the cross-region routes in force; at (the
// controller's clock) turns the plan's validity into a remaining time.
func writeRoutes(w io.Writer, t regional.RouteTable, at *time.Time) error {
	line := "routes: " + statusText(t.Source)
	if t.Source == regional.RoutesPlan || t.Epoch > 0 {
		line += fmt.Sprintf(", epoch %d, sequence %d", t.Epoch, t.Sequence)
		if t.LeaderID != "" {
			line += ", leader " + statusText(t.LeaderID)
		}
	}
	if !t.ValidUntil.IsZero() {
		if at != nil {
			if left := t.ValidUntil.Sub(*at); left > 0 {
				line += ", valid " + statusAge(left) + " more"
			} else {
				line += ", expired " + statusAge(-left) + " ago"
			}
		} else {
			line += ", valid until " + t.ValidUntil.UTC().Format(time.RFC3339)
		}
	}
	fmt.Fprintln(w, line)
	if len(t.Models) == 0 {
		if t.Source == regional.RoutesLocal || t.Source == "" {
			fmt.Fprintln(w, "all traffic served locally")
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tROUTES\tSHED")
	for _, m := range sortedKeys(t.Models) {
		mr := t.Models[m]
		fmt.Fprintf(tw, "%s\t%s\t%.4f\n", statusText(m), statusShares(mr.Routes, t.Ingress), mr.Shed)
	}
	return tw.Flush()
}

// statusShares formats destination shares, largest first ("b 0.8000,
// c 0.2000"), with each remote destination's ingress address if known.
func statusShares(routes map[string]float64, ingress map[string]string) string {
	if len(routes) == 0 {
		return "-"
	}
	dests := sortedKeys(routes)
	slices.SortStableFunc(dests, func(a, b string) int {
		switch {
		case routes[a] > routes[b]:
			return -1
		case routes[a] < routes[b]:
			return 1
		}
		return 0
	})
	parts := make([]string, 0, len(dests))
	for _, d := range dests {
		p := fmt.Sprintf("%s %.4f", statusText(d), routes[d])
		if addr := ingress[d]; addr != "" {
			p += " (" + statusText(addr) + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func writeGlobalTable(w io.Writer, g globalStatus) error {
	head := "global " + statusText(g.Global)
	if len(g.Errors) == 0 || len(g.Regions) > 0 {
		head += ": leader " + statusYesNo(g.Leader) + fmt.Sprintf(", %d regions", len(g.Regions))
	}
	fmt.Fprintf(w, "== %s\n", head)
	for _, e := range g.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	if len(g.Regions) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REGION\tLIVE\tSUMMARY_AGE\tSEQUENCE\tMODELS\tINGRESS")
		for _, r := range g.Regions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", statusText(r.Region), statusYesNo(r.Live),
				statusAge(time.Duration(r.AgeSeconds*float64(time.Second))), r.Sequence, r.Models, statusText(r.Ingress))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if g.PlanNote != "" {
		fmt.Fprintf(w, "plan: %s\n", statusText(g.PlanNote))
	}
	if p := g.plan; p != nil {
		line := fmt.Sprintf("plan: epoch %d, sequence %d, leader %s", p.GetEpoch(), p.GetSequence(), statusText(p.GetLeaderId()))
		if p.GetIssuedAt() != nil {
			line += ", issued " + p.GetIssuedAt().AsTime().UTC().Format(time.RFC3339)
			if p.GetValidUntil() != nil {
				line += ", valid for " + statusAge(p.GetValidUntil().AsTime().Sub(p.GetIssuedAt().AsTime()))
			}
		}
		fmt.Fprintln(w, line)
		ingress := map[string]string{}
		for _, in := range p.GetIngress() {
			ingress[in.GetRegion()] = in.GetAddress()
		}
		plans := slices.Clone(p.GetPlans())
		slices.SortFunc(plans, func(a, b *isobarpb.ModelPlan) int {
			if c := strings.Compare(a.GetModel(), b.GetModel()); c != 0 {
				return c
			}
			return strings.Compare(a.GetIngressRegion(), b.GetIngressRegion())
		})
		if len(plans) > 0 {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tINGRESS\tROUTES\tSHED")
			for _, mp := range plans {
				routes := map[string]float64{}
				for _, r := range mp.GetRoutes() {
					routes[r.GetDestination()] += r.GetFraction()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\n", statusText(mp.GetModel()), statusText(mp.GetIngressRegion()),
					statusShares(routes, nil), mp.GetShed())
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
