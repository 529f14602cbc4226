package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Check names.
const (
	CheckRSSFlat          = "rss_flat"
	CheckGoroutinesFlat   = "goroutines_flat"
	CheckStreamsMatch     = "streams_match_cells"
	CheckGoroutinesReturn = "goroutines_return"
	CheckStreamErrors     = "stream_errors"
	CheckPlansMonotonic   = "plan_epochs_monotonic"
	CheckPlansAdvance     = "plans_advance"
	CheckPlanGap          = "plan_gap"
)

// minFlatSamples: a flatness check needs this many post-warm-up samples
// (a first and a last third of at least one each, apart).
const minFlatSamples = 3

// flatCheck judges a series for growth: the median of its last third must
// not exceed the median of its first third × (1 + growth) + allowance.
// unit formats values in the detail.
func flatCheck(name string, vals []float64, growth, allowance float64, unit func(float64) string) Check {
	if len(vals) < minFlatSamples {
		return Check{Name: name, Detail: fmt.Sprintf("%d post-warm-up samples, need %d: lengthen --duration or shorten --sample/--warmup",
			len(vals), minFlatSamples)}
	}
	third := (len(vals) + 2) / 3
	first, last := median(vals[:third]), median(vals[len(vals)-third:])
	bound := first*(1+growth) + allowance
	ok := last <= bound
	rel := "<="
	if !ok {
		rel = ">"
	}
	return Check{Name: name, Passed: ok, Detail: fmt.Sprintf("last-third median %s %s first-third median %s × %.2f + %s = %s (%d samples)",
		unit(last), rel, unit(first), 1+growth, unit(allowance), unit(bound), len(vals))}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fmtMiB(v float64) string   { return fmt.Sprintf("%.1f MiB", v/mib) }
func fmtCount(v float64) string { return fmt.Sprintf("%.0f", v) }

// soakSeries returns the judged samples' values.
func soakSeries(samples []Sample, f func(Sample) float64) []float64 {
	var out []float64
	for _, s := range samples {
		if s.Phase == PhaseSoak {
			out = append(out, f(s))
		}
	}
	return out
}

// flatnessChecks judges RSS and goroutines over the soak samples.
func flatnessChecks(cfg SoakConfig, samples []Sample) []Check {
	return []Check{
		flatCheck(CheckRSSFlat, soakSeries(samples, func(s Sample) float64 { return float64(s.RSSBytes) }),
			cfg.MaxRSSGrowth, float64(cfg.RSSAllowance), fmtMiB),
		flatCheck(CheckGoroutinesFlat, soakSeries(samples, func(s Sample) float64 { return float64(s.Goroutines) }),
			cfg.MaxGoroutineGrowth, float64(cfg.GoroutineAllowance), fmtCount),
	}
}

// streamsCheck judges the settled sample: in every region the open
// streams equal the live cells, and every cell is live and Ready.
func streamsCheck(settled Sample, cellsPerRegion map[string]int, reached bool) Check {
	var bad []string
	for _, r := range settled.Regions {
		want := cellsPerRegion[r.Region]
		if r.Streams != r.LiveCells || r.LiveCells != want || r.Ready != want {
			bad = append(bad, fmt.Sprintf("%s: %d streams open, %d of %d cells live, %d Ready", r.Region, r.Streams, r.LiveCells, want, r.Ready))
		}
	}
	if len(bad) == 0 && reached {
		return Check{Name: CheckStreamsMatch, Passed: true, Detail: fmt.Sprintf("after churn stopped: %d streams open = %d live cells, all Ready, at t=%.1fs",
			settled.Streams, settled.LiveCells, settled.TSeconds)}
	}
	if len(bad) == 0 {
		bad = append(bad, "never settled within --settle")
	}
	return Check{Name: CheckStreamsMatch, Detail: "within --settle after churn stopped: " + strings.Join(bad, "; ")}
}

// goroutinesReturnCheck judges the count after every cell stopped.
func goroutinesReturnCheck(stopped Sample, baseline, allowance int) Check {
	ok := stopped.Goroutines <= baseline+allowance && stopped.Streams == 0
	rel := "<="
	if stopped.Goroutines > baseline+allowance {
		rel = ">"
	}
	return Check{Name: CheckGoroutinesReturn, Passed: ok, Detail: fmt.Sprintf("after every cell stopped: %d goroutines %s baseline %d + %d; %d streams open",
		stopped.Goroutines, rel, baseline, allowance, stopped.Streams)}
}

// streamErrorsCheck judges streams that ended on their own and refused
// heartbeats.
func streamErrorsCheck(c ChurnStats, maxErrors int) Check {
	n := c.StreamErrors + c.AckErrors
	d := fmt.Sprintf("%d streams ended without a kill, %d heartbeats refused (limit %d in all)", c.StreamErrors, c.AckErrors, maxErrors)
	if c.LastError != "" {
		d += "; last: " + c.LastError
	}
	if maxErrors < 0 {
		return Check{Name: CheckStreamErrors, Passed: true, Detail: d + " (check off)"}
	}
	return Check{Name: CheckStreamErrors, Passed: n <= uint64(maxErrors), Detail: d}
}

// planChecks judges each region's plans: the applied plan never goes
// backwards (watcher and samples), it advances over the run, and no region
// goes longer than the plan TTL without a new one or off the plan.
func planChecks(plans []RegionPlans, samples []Sample, planTTLSeconds float64) []Check {
	mono := Check{Name: CheckPlansMonotonic, Passed: true}
	adv := Check{Name: CheckPlansAdvance, Passed: true}
	gap := Check{Name: CheckPlanGap, Passed: true}
	var monoBad, advBad, gapBad, advOK []string
	maxGap := 0.0
	for _, p := range plans {
		if len(p.Regressions) > 0 {
			monoBad = append(monoBad, p.Region+": "+strings.Join(p.Regressions, ", "))
		}
		if !p.First.Less(p.Last) {
			advBad = append(advBad, fmt.Sprintf("%s stayed at %s", p.Region, p.Last))
		} else {
			advOK = append(advOK, fmt.Sprintf("%s %s→%s (%d changes, epochs %v)", p.Region, p.First, p.Last, p.Changes, p.Epochs))
		}
		if p.MaxGapSeconds > planTTLSeconds || p.NotOnPlan > 0 {
			gapBad = append(gapBad, fmt.Sprintf("%s: longest gap %.1fs, %d polls off the plan", p.Region, p.MaxGapSeconds, p.NotOnPlan))
		}
		maxGap = max(maxGap, p.MaxGapSeconds)
		if n := p.Plans["invalid"] + p.Plans["expired"]; n > 0 {
			gapBad = append(gapBad, fmt.Sprintf("%s: %.0f plans refused as invalid or expired", p.Region, n))
		}
	}
	prev := map[string]PlanMark{}
	for _, s := range samples {
		for _, r := range s.Regions {
			if r.Source != "plan" {
				continue
			}
			if r.Plan.Less(prev[r.Region]) {
				monoBad = append(monoBad, fmt.Sprintf("%s: sample at %.1fs has %s after %s", r.Region, s.TSeconds, r.Plan, prev[r.Region]))
			}
			prev[r.Region] = r.Plan
		}
	}
	if len(plans) == 0 {
		advBad = append(advBad, "no region watched")
	}
	if mono.Passed = len(monoBad) == 0; mono.Passed {
		mono.Detail = fmt.Sprintf("%d regions: applied epoch:sequence never decreased", len(plans))
	} else {
		mono.Detail = strings.Join(monoBad, "; ")
	}
	if adv.Passed = len(advBad) == 0; adv.Passed {
		adv.Detail = strings.Join(advOK, "; ")
	} else {
		adv.Detail = strings.Join(advBad, "; ")
	}
	if gap.Passed = len(gapBad) == 0; gap.Passed {
		gap.Detail = fmt.Sprintf("longest time without a new plan %.1fs <= plan TTL %.0fs; always on the plan", maxGap, planTTLSeconds)
	} else {
		gap.Detail = strings.Join(gapBad, "; ")
	}
	return []Check{mono, adv, gap}
}
