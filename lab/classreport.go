package lab

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/isobar-mesh/isobar/reqclass"
)

// byCriticality summarises os by criticality: one entry per class that
// sent a request.
func byCriticality(os []Outcome) map[string]Summary {
	split := map[string][]Outcome{}
	for _, o := range os {
		k := o.Criticality.String()
		split[k] = append(split[k], o)
	}
	out := map[string]Summary{}
	for k, v := range split {
		out[k] = summarise(v)
	}
	return out
}

// byTenant summarises os by tenant (nil unless tenants is set); requests
// naming no tenant are under "".
func byTenant(os []Outcome, tenants bool) map[string]Summary {
	if !tenants {
		return nil
	}
	split := map[string][]Outcome{}
	for _, o := range os {
		split[o.Tenant] = append(split[o.Tenant], o)
	}
	out := map[string]Summary{}
	for k, v := range split {
		out[k] = summarise(v)
	}
	return out
}

// WriteClassTable writes the report's figures by criticality (in
// reqclass order) and, with tenants, by tenant: requests, success, TTFT
// P50 and P95 of the successful ones, and the failures by cause.
func WriteClassTable(w io.Writer, rep Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tREQUESTS\tSUCCESS\tTTFT P50\tTTFT P95\tFAILURES")
	row := func(name string, s Summary) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", name, s.Requests, pct(s.Succeeded, s.Requests),
			ms(s.TTFTms.P50, s.Succeeded), ms(s.TTFTms.P95, s.Succeeded), s.Failures)
	}
	for _, c := range reqclass.All() {
		if s, ok := rep.ByCriticality[c.String()]; ok {
			row(c.String(), s)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(rep.ByTenant)) {
		name := "tenant " + t
		if t == "" {
			name = "no tenant"
		}
		row(name, rep.ByTenant[t])
	}
	row("all", rep.Total)
	_ = tw.Flush()
}

// classLine summarises os by criticality for the live view: each class's
// success and requests, in reqclass order.
func classLine(os []Outcome) string {
	bc := byCriticality(os)
	var parts []string
	for _, c := range reqclass.All() {
		if s, ok := bc[c.String()]; ok {
			parts = append(parts, fmt.Sprintf("%s %s of %d", c, pct(s.Succeeded, s.Requests), s.Requests))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
