package statusview

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// maxText caps a string printed in a table cell, in runes.
const maxText = 64

// WriteTable prints rep as tables: per controller a header, its cells
// and the routes in force; per global member a header, its regions and
// the plan it last published. A source's errors are printed in its
// place. See `isobar status --help` for the columns.
func WriteTable(w io.Writer, rep Report) error {
	for i, c := range rep.Controllers {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := writeController(w, c); err != nil {
			return err
		}
	}
	for i, g := range rep.Globals {
		if i > 0 || len(rep.Controllers) > 0 {
			fmt.Fprintln(w)
		}
		if err := writeGlobal(w, g); err != nil {
			return err
		}
	}
	return nil
}

// Text makes an outside string safe for a table cell: control
// characters, tabs and invalid UTF-8 are escaped, strings longer than 64
// runes cut with an ellipsis, and "" shown as "-".
func Text(s string) string {
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
	if utf8.RuneCountInString(s) > maxText {
		r := []rune(s)
		s = string(r[:maxText-1]) + "…"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// age formats a duration for a table: 0.4s, 12s, 3m05s.
func age(d time.Duration) string {
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

func writeController(w io.Writer, c Controller) error {
	head := "controller " + Text(c.Controller)
	if c.At != nil {
		states := map[string]int{}
		for _, cell := range c.Cells {
			states[cell.State]++
		}
		parts := make([]string, 0, len(states))
		for _, s := range slices.Sorted(maps.Keys(states)) {
			parts = append(parts, fmt.Sprintf("%d %s", states[s], Text(s)))
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
			state := Text(cell.State)
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
				hb = age(c.At.Sub(cell.LastSeen))
			}
			model := Text(cell.Model)
			if cell.MaxModelLen > 0 {
				model += "/" + strconv.FormatUint(uint64(cell.MaxModelLen), 10)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
				Text(cell.ID), state, cell.Pressure, cell.Weight, cell.TargetWeight, penalty,
				yesNo(cell.Fallback), hb, Text(cell.Endpoint), model, Text(cell.Reason))
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

// RoutesSummary says in one line which routes are in force: the source
// and, for a plan, its epoch, sequence and leader and how long it stays
// valid. at is the controller's clock, against which the validity becomes
// a remaining time; with at nil the expiry time is given instead.
func RoutesSummary(t debugapi.RouteTable, at *time.Time) string {
	line := Text(t.Source)
	if t.Source == debugapi.RoutesPlan || t.Epoch > 0 {
		line += fmt.Sprintf(", epoch %d, sequence %d", t.Epoch, t.Sequence)
		if t.LeaderID != "" {
			line += ", leader " + Text(t.LeaderID)
		}
	}
	if !t.ValidUntil.IsZero() {
		if at != nil {
			if left := t.ValidUntil.Sub(*at); left > 0 {
				line += ", valid " + age(left) + " more"
			} else {
				line += ", expired " + age(-left) + " ago"
			}
		} else {
			line += ", valid until " + t.ValidUntil.UTC().Format(time.RFC3339)
		}
	}
	return line
}

// writeRoutes prints the cross-region routes in force: the summary line,
// then per model the shares by destination and the share shed.
func writeRoutes(w io.Writer, t debugapi.RouteTable, at *time.Time) error {
	fmt.Fprintln(w, "routes: "+RoutesSummary(t, at))
	if len(t.Models) == 0 {
		if t.Source == debugapi.RoutesLocal || t.Source == "" {
			fmt.Fprintln(w, "all traffic served locally")
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tROUTES\tSHED")
	for _, m := range slices.Sorted(maps.Keys(t.Models)) {
		mr := t.Models[m]
		fmt.Fprintf(tw, "%s\t%s\t%.4f\n", Text(m), Shares(mr.Routes, t.Ingress), mr.Shed)
	}
	return tw.Flush()
}

// Shares formats destination shares, largest first, ties by name ("b
// 0.8000, c 0.2000"), with a destination's ingress address when ingress
// has one; "-" when there are none.
func Shares(routes map[string]float64, ingress map[string]string) string {
	if len(routes) == 0 {
		return "-"
	}
	dests := slices.Sorted(maps.Keys(routes))
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
		p := fmt.Sprintf("%s %.4f", Text(d), routes[d])
		if addr := ingress[d]; addr != "" {
			p += " (" + Text(addr) + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func writeGlobal(w io.Writer, g Global) error {
	head := "global " + Text(g.Global)
	if len(g.Errors) == 0 || len(g.Regions) > 0 {
		head += ": leader " + yesNo(g.Leader) + fmt.Sprintf(", %d regions", len(g.Regions))
	}
	fmt.Fprintf(w, "== %s\n", head)
	for _, e := range g.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	if len(g.Regions) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REGION\tLIVE\tSUMMARY_AGE\tSEQUENCE\tMODELS\tINGRESS")
		for _, r := range g.Regions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", Text(r.Region), yesNo(r.Live),
				age(time.Duration(r.AgeSeconds*float64(time.Second))), r.Sequence, r.Models, Text(r.Ingress))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if g.PlanNote != "" {
		fmt.Fprintf(w, "plan: %s\n", Text(g.PlanNote))
	}
	if len(g.Plan) == 0 {
		return nil
	}
	p, err := parsePlan(g.Plan)
	if err != nil {
		fmt.Fprintf(w, "error: plan: not a routing plan: %s\n", Text(err.Error()))
		return nil
	}
	return writePlan(w, p)
}

// writePlan prints a global member's routing plan: the line on its epoch,
// sequence, leader and validity, then per model and ingress region the
// shares by destination and the share shed.
func writePlan(w io.Writer, p *isobarpb.RoutingPlan) error {
	line := fmt.Sprintf("plan: epoch %d, sequence %d, leader %s", p.GetEpoch(), p.GetSequence(), Text(p.GetLeaderId()))
	if p.GetIssuedAt() != nil {
		line += ", issued " + p.GetIssuedAt().AsTime().UTC().Format(time.RFC3339)
		if p.GetValidUntil() != nil {
			line += ", valid for " + age(p.GetValidUntil().AsTime().Sub(p.GetIssuedAt().AsTime()))
		}
	}
	fmt.Fprintln(w, line)
	plans := slices.Clone(p.GetPlans())
	slices.SortFunc(plans, func(a, b *isobarpb.ModelPlan) int {
		if c := strings.Compare(a.GetModel(), b.GetModel()); c != 0 {
			return c
		}
		return strings.Compare(a.GetIngressRegion(), b.GetIngressRegion())
	})
	if len(plans) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tINGRESS\tROUTES\tSHED")
	for _, mp := range plans {
		routes := map[string]float64{}
		for _, r := range mp.GetRoutes() {
			routes[r.GetDestination()] += r.GetFraction()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\n", Text(mp.GetModel()), Text(mp.GetIngressRegion()),
			Shares(routes, nil), mp.GetShed())
	}
	return tw.Flush()
}
