package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Sample phases.
const (
	PhaseWarmup  = "warmup"  // before the warm-up ended: not judged
	PhaseSoak    = "soak"    // under churn, judged for flatness
	PhaseSettled = "settled" // churn stopped, every cell back
	PhaseStopped = "stopped" // every cell stopped
)

// SoakReport is a soak run's series and verdicts (`--report FILE.json`).
type SoakReport struct {
	Config SoakReportConfig `json:"config"`
	// RSSSource says where rss_bytes comes from: "/proc/self/status VmRSS"
	// on Linux, else "runtime (Sys - HeapReleased)" (the Go runtime's view,
	// not the OS's).
	RSSSource string    `json:"rss_source"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	// BaselineGoroutines: goroutines with the fleet up, before any cell.
	BaselineGoroutines int           `json:"baseline_goroutines"`
	Samples            []Sample      `json:"samples"`
	Plans              []RegionPlans `json:"plans"`
	Churn              ChurnStats    `json:"churn"`
	Checks             []Check       `json:"checks"`
	Passed             bool          `json:"passed"`
	// Interrupted: the run was stopped (Ctrl-C) before its checks ran.
	Interrupted bool `json:"interrupted"`
}

// SoakReportConfig is the run's shape as the report records it.
type SoakReportConfig struct {
	Regions                  []string `json:"regions"`
	Cells                    int      `json:"cells"`
	DurationSeconds          float64  `json:"duration_seconds"`
	WarmupSeconds            float64  `json:"warmup_seconds"`
	ChurnIntervalSeconds     float64  `json:"churn_interval_seconds"`
	ChurnFraction            float64  `json:"churn_fraction"`
	ChurnDownSeconds         float64  `json:"churn_down_seconds"`
	SampleSeconds            float64  `json:"sample_seconds"`
	HeartbeatIntervalSeconds float64  `json:"heartbeat_interval_seconds"`
	PlanIntervalSeconds      float64  `json:"plan_interval_seconds"`
	PlanTTLSeconds           float64  `json:"plan_ttl_seconds"`
	MaxRSSGrowth             float64  `json:"max_rss_growth"`
	RSSAllowanceBytes        uint64   `json:"rss_allowance_bytes"`
	MaxGoroutineGrowth       float64  `json:"max_goroutine_growth"`
	GoroutineAllowance       int      `json:"goroutine_allowance"`
	GoroutineReturnAllowance int      `json:"goroutine_return_allowance"`
	MaxStreamErrors          int      `json:"max_stream_errors"`
	Transport                string   `json:"transport"`
}

func reportConfig(c SoakConfig) SoakReportConfig {
	return SoakReportConfig{
		Regions: c.Regions, Cells: c.Cells, DurationSeconds: c.Duration.Seconds(), WarmupSeconds: c.Warmup.Seconds(),
		ChurnIntervalSeconds: c.ChurnInterval.Seconds(), ChurnFraction: max(c.ChurnFraction, 0), ChurnDownSeconds: c.ChurnDown.Seconds(),
		SampleSeconds: c.SampleEvery.Seconds(), HeartbeatIntervalSeconds: c.HeartbeatInterval.Seconds(),
		PlanIntervalSeconds: c.PlanInterval.Seconds(), PlanTTLSeconds: c.PlanTTL.Seconds(),
		MaxRSSGrowth: c.MaxRSSGrowth, RSSAllowanceBytes: c.RSSAllowance, MaxGoroutineGrowth: c.MaxGoroutineGrowth,
		GoroutineAllowance: c.GoroutineAllowance, GoroutineReturnAllowance: c.GoroutineReturnAllowance,
		MaxStreamErrors: c.MaxStreamErrors, Transport: "plaintext gRPC on loopback (no TLS)",
	}
}

// Sample is the state of the process and the fleet at one instant.
type Sample struct {
	// TSeconds is the time since the churn phase began (every cell Ready).
	TSeconds       float64 `json:"t_seconds"`
	Phase          string  `json:"phase"`
	RSSBytes       uint64  `json:"rss_bytes"`
	HeapInuseBytes uint64  `json:"heap_inuse_bytes"`
	Goroutines     int     `json:"goroutines"`
	// Streams: open heartbeat streams on the controllers (their
	// isobar_regional_heartbeat_streams gauges); LiveCells: synthetic
	// cells whose stream is open and acked.
	Streams   int `json:"streams"`
	LiveCells int `json:"live_cells"`
	// Ready and Failed: cells by state in the controllers' registries.
	Ready   int            `json:"ready"`
	Failed  int            `json:"failed"`
	Regions []RegionSample `json:"regions"`
}

// RegionSample is one region at one instant.
type RegionSample struct {
	Region    string `json:"region"`
	Streams   int    `json:"streams"`
	LiveCells int    `json:"live_cells"`
	Ready     int    `json:"ready"`
	Failed    int    `json:"failed"`
	// Plan is the plan the region applied ("" source when none).
	Plan   PlanMark `json:"plan"`
	Source string   `json:"route_source"`
}

// ChurnStats counts what the churner and the cells did.
type ChurnStats struct {
	Kills        uint64 `json:"kills"`
	Returns      uint64 `json:"returns"`
	Heartbeats   uint64 `json:"heartbeats_sent"`
	StreamErrors uint64 `json:"stream_errors"`
	AckErrors    uint64 `json:"ack_errors"`
	// SlowKills: kills whose stream did not break within 2 s of its
	// sockets closing, and was cancelled instead.
	SlowKills uint64 `json:"slow_kills"`
	LastError string `json:"last_error,omitempty"`
}

// Check is one verdict.
type Check struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	Detail string `json:"detail"`
}

const mib = 1 << 20

// WriteSampleHeader and WriteSample print the series as rows of a
// fixed-width table; WriteSoakTable prints the whole report.
func WriteSampleHeader(w io.Writer) {
	fmt.Fprintf(w, "%8s  %-8s %8s %8s %10s %8s %6s %6s %6s  %s\n",
		"T", "PHASE", "RSS_MiB", "HEAP_MiB", "GOROUTINES", "STREAMS", "LIVE", "READY", "FAILED", "PLAN epoch:seq per region")
}

// WriteSample prints one row.
func WriteSample(w io.Writer, s Sample) {
	var plans []string
	for _, r := range s.Regions {
		p := r.Plan.String()
		if r.Source != "plan" {
			p = r.Source + "!"
		}
		plans = append(plans, r.Region+"="+p)
	}
	fmt.Fprintf(w, "%7.1fs  %-8s %8.1f %8.1f %10d %8d %6d %6d %6d  %s\n",
		s.TSeconds, s.Phase, float64(s.RSSBytes)/mib, float64(s.HeapInuseBytes)/mib, s.Goroutines,
		s.Streams, s.LiveCells, s.Ready, s.Failed, strings.Join(plans, " "))
}

// WriteSoakTable prints the series, the churn counts and the checks.
func WriteSoakTable(w io.Writer, r *SoakReport) {
	fmt.Fprintf(w, "soak: %d cells over %d regions, %v, churn %.0f%% every %vs (down %vs); RSS from %s\n",
		r.Config.Cells, len(r.Config.Regions), time.Duration(r.Config.DurationSeconds*float64(time.Second)),
		100*r.Config.ChurnFraction, r.Config.ChurnIntervalSeconds, r.Config.ChurnDownSeconds, r.RSSSource)
	WriteSampleHeader(w)
	for _, s := range r.Samples {
		WriteSample(w, s)
	}
	c := r.Churn
	fmt.Fprintf(w, "churn: %d kills (%d slow), %d returns, %d heartbeats sent, %d unexpected stream ends, %d refused heartbeats; baseline goroutines %d\n",
		c.Kills, c.SlowKills, c.Returns, c.Heartbeats, c.StreamErrors, c.AckErrors, r.BaselineGoroutines)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, ch := range r.Checks {
		res := "PASS"
		if !ch.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", ch.Name, res, ch.Detail)
	}
	_ = tw.Flush()
	switch {
	case r.Interrupted:
		fmt.Fprintln(w, "result: INTERRUPTED")
	case r.Passed:
		fmt.Fprintln(w, "result: PASS")
	default:
		fmt.Fprintln(w, "result: FAIL")
	}
}
