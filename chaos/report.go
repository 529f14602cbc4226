package chaos

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/internal/quantile"
)

// Percentiles in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Success holds success fractions in [0,1]; nil where no request fell in
// the phase.
type Success struct {
	Before *float64 `json:"before"`
	During *float64 `json:"during"`
	After  *float64 `json:"after"`
}

// Requests counts requests by phase: Before those that started and ended
// before the injection, During and After by start time.
type Requests struct {
	Before int `json:"before"`
	During int `json:"during"`
	After  int `json:"after"`
	// InFlight were in flight when the fault hit (in no phase);
	// InFlightFailed of them failed: the unavoidable loss, not counted in
	// Lost.
	InFlight       int `json:"in_flight"`
	InFlightFailed int `json:"in_flight_failed"`
	// FailedOver went to another region's ingress because their own
	// refused connections (the site was down).
	FailedOver int `json:"failed_over"`
	// ClientShed arrivals were dropped by the load generator's in-flight
	// bound (not sent).
	ClientShed int `json:"client_shed"`
}

// Report is one drill's result. A figure that does not apply to the drill
// is null.
type Report struct {
	Drill  string `json:"drill"`
	Passed bool   `json:"passed"`
	// Failures say why it did not pass.
	Failures []string `json:"failures,omitempty"`
	// Faults as injected, and when (the fleet's clock).
	Faults     []adminapi.Fault `json:"faults"`
	InjectedAt time.Time        `json:"injected_at"`
	// DetectMS: injection to the controllers' state change.
	DetectMS *float64 `json:"detect_ms"`
	// RerouteAtMS: injection to the data planes' weights or plan
	// reflecting it (the drill's RTO).
	RerouteAtMS *float64 `json:"reroute_at_ms"`
	// RerouteMS: TTFT percentiles of the requests that arrived between the
	// injection and the reroute (at least the first 2 s): what the
	// requests exposed to the failure saw. Successful requests only; the
	// failed ones are in Success.During and Lost.
	RerouteMS *Percentiles `json:"reroute_ms"`
	// HealedMS: heal to the fleet healthy again.
	HealedMS *float64 `json:"healed_ms"`
	Success  Success  `json:"success"`
	// Lost counts failed requests that started after the injection.
	Lost int `json:"lost"`
	// LeakRate: share of long prompts sent during the drill that reached a
	// replica that could not take them (capability-mismatch only).
	LeakRate *float64 `json:"leak_rate"`
	// LeakedAfterReroute counts the long prompts among them that started
	// after every data plane listing the cell carried its new context
	// length: the leak that is not a matter of detection time, which must
	// be none. LeakRate depends on how fast a heartbeat travels (slower on
	// a busy machine); this does not.
	LeakedAfterReroute int `json:"leaked_after_reroute"`
	// NoRoute counts requests started after the injection that a data
	// plane answered 404 (no route for the model): the model had vanished
	// from its routing, which a restart must never cause.
	NoRoute int `json:"no_route"`
	// Cells, for static-stability drills, per region: how many of its own
	// cells its data plane routed to before the injection, the fewest seen
	// from the injection to the end, and at the end.
	Cells map[string]CellCounts `json:"cells,omitempty"`
	// Errors counts the failed requests by phase (before, in flight,
	// during, heal, after), status and reason (the first few distinct
	// ones of each phase).
	Errors map[string]int `json:"errors,omitempty"`
	// TTFTms of the successful requests by phase.
	TTFTms   map[string]Percentiles `json:"ttft_ms"`
	Requests Requests               `json:"requests"`
	// What detect and reroute measure for this drill.
	Detects  string `json:"detects,omitempty"`
	Reroutes string `json:"reroutes,omitempty"`
	// Residency holds the residency drill's figures (nil for the others).
	Residency *ResidencyReport `json:"residency,omitempty"`
}

// CellCounts is one region's local endpoints in its data plane.
type CellCounts struct {
	Before int `json:"before"`
	Min    int `json:"min"`
	After  int `json:"after"`
}

// Thresholds make a drill fail. Nil fields are not checked.
type Thresholds struct {
	// MaxErrorRate bounds 1 - success.during.
	MaxErrorRate *float64 `json:"max_error_rate,omitempty"`
	// MaxRTO bounds reroute_at_ms (detect_ms for drills without a
	// reroute figure).
	MaxRTO *time.Duration `json:"max_rto,omitempty"`
	// MaxDetect bounds detect_ms.
	MaxDetect *time.Duration `json:"max_detect,omitempty"`
	// MaxLost bounds lost.
	MaxLost *int `json:"max_lost,omitempty"`
	// MaxLeak bounds leak_rate.
	MaxLeak *float64 `json:"max_leak,omitempty"`
}

// Merge returns t with o's set fields on top.
func (t Thresholds) Merge(o Thresholds) Thresholds {
	if o.MaxErrorRate != nil {
		t.MaxErrorRate = o.MaxErrorRate
	}
	if o.MaxRTO != nil {
		t.MaxRTO = o.MaxRTO
	}
	if o.MaxDetect != nil {
		t.MaxDetect = o.MaxDetect
	}
	if o.MaxLost != nil {
		t.MaxLost = o.MaxLost
	}
	if o.MaxLeak != nil {
		t.MaxLeak = o.MaxLeak
	}
	return t
}

// msString writes a threshold as the operator typed it (1.5s, 800ms, 1ns).
func msString(d time.Duration) string { return d.String() }

// check appends to r.Failures what the thresholds refuse.
func (t Thresholds) check(r *Report) {
	if t.MaxErrorRate != nil && r.Success.During != nil && 1-*r.Success.During > *t.MaxErrorRate+1e-12 {
		r.Failures = append(r.Failures, fmt.Sprintf("error rate during the drill %.4f is over --max-error-rate %g", 1-*r.Success.During, *t.MaxErrorRate))
	}
	if t.MaxRTO != nil {
		rto, what := r.RerouteAtMS, "reroute"
		if r.Reroutes == "" {
			rto, what = r.DetectMS, "detection"
		}
		switch {
		case r.Reroutes == "" && r.Detects == "":
			r.Failures = append(r.Failures, "--max-rto given but this drill measures no recovery time")
		case rto == nil:
			r.Failures = append(r.Failures, fmt.Sprintf("no %s observed, so --max-rto %s cannot hold", what, msString(*t.MaxRTO)))
		case *rto > float64(*t.MaxRTO)/float64(time.Millisecond):
			r.Failures = append(r.Failures, fmt.Sprintf("%s took %.1f ms, over --max-rto %s", what, *rto, msString(*t.MaxRTO)))
		}
	}
	if t.MaxDetect != nil {
		switch {
		case r.DetectMS == nil:
			r.Failures = append(r.Failures, fmt.Sprintf("no detection observed, so --max-detect %s cannot hold", msString(*t.MaxDetect)))
		case *r.DetectMS > float64(*t.MaxDetect)/float64(time.Millisecond):
			r.Failures = append(r.Failures, fmt.Sprintf("detection took %.1f ms, over --max-detect %s", *r.DetectMS, msString(*t.MaxDetect)))
		}
	}
	if t.MaxLost != nil && r.Lost > *t.MaxLost {
		r.Failures = append(r.Failures, fmt.Sprintf("%d requests lost, over --max-lost %d", r.Lost, *t.MaxLost))
	}
	if t.MaxLeak != nil && r.LeakRate != nil && *r.LeakRate > *t.MaxLeak {
		r.Failures = append(r.Failures, fmt.Sprintf("leak rate %.4f is over --max-leak %g", *r.LeakRate, *t.MaxLeak))
	}
}

func fptr(v float64) *float64 { return &v }

func durMS(d time.Duration) *float64 {
	return fptr(math.Round(float64(d)/float64(time.Microsecond)) / 1000)
}

func percentiles(ds []time.Duration) *Percentiles {
	if len(ds) == 0 {
		return nil
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) float64 { return *durMS(quantile.Sorted(s, p)) }
	return &Percentiles{P50: q(0.50), P95: q(0.95), P99: q(0.99)}
}

func fmtMS(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%.0f", *v)
}

func fmtFrac(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%.4f", *v)
}

// WriteTable writes reports as a terminal table.
func WriteTable(w io.Writer, reports []*Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DRILL\tRESULT\tDETECT ms\tREROUTE ms\tREROUTE TTFT p50/p95/p99 ms\tSUCCESS before/during/after\tLOST\tLEAK\tHEALED ms")
	for _, r := range reports {
		res := "PASS"
		if !r.Passed {
			res = "FAIL"
		}
		rr := "—"
		if r.RerouteMS != nil {
			rr = fmt.Sprintf("%.0f/%.0f/%.0f", r.RerouteMS.P50, r.RerouteMS.P95, r.RerouteMS.P99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s/%s/%s\t%d\t%s\t%s\n", r.Drill, res, fmtMS(r.DetectMS), fmtMS(r.RerouteAtMS), rr,
			fmtFrac(r.Success.Before), fmtFrac(r.Success.During), fmtFrac(r.Success.After), r.Lost, fmtFrac(r.LeakRate), fmtMS(r.HealedMS))
	}
	_ = tw.Flush()
	for _, r := range reports {
		if r.Residency != nil {
			writeResidency(w, r.Residency)
		}
	}
	for _, r := range reports {
		if len(r.Failures) > 0 {
			fmt.Fprintf(w, "%s FAILED: %s\n", r.Drill, strings.Join(r.Failures, "; "))
		}
	}
}
