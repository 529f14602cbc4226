package scale

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Topologies of a point.
const (
	Hierarchical = "hierarchical"
	Flat         = "flat"
)

// Report is what a run measured. It is written as scale.json, scale.md and
// the charts by Write.
type Report struct {
	Machine Machine      `json:"machine"`
	Config  ReportConfig `json:"config"`
	Started time.Time    `json:"started"`
	// Elapsed is the whole run, wall time.
	ElapsedS float64 `json:"elapsed_s"`
	// Interrupted: the run was cancelled; later points are marked skipped.
	Interrupted bool    `json:"interrupted,omitempty"`
	Points      []Point `json:"points"`
	// Notes explain how the figures were measured.
	Notes []string `json:"notes"`
}

// ReportConfig is the configuration a run used, defaults applied.
type ReportConfig struct {
	Cells               []int   `json:"cells"`
	Regions             []int   `json:"regions"`
	HeartbeatIntervalMs float64 `json:"heartbeat_interval_ms"`
	TTLMs               float64 `json:"ttl_ms"`
	SummaryIntervalMs   float64 `json:"summary_interval_ms"`
	CycleIntervalMs     float64 `json:"cycle_interval_ms"`
	WindowMs            float64 `json:"window_ms"`
	WarmupMs            float64 `json:"warmup_ms"`
	Deaths              int     `json:"deaths"`
	SilentDeaths        int     `json:"silent_deaths"`
	// CellProcs as configured (0: one per 4,000 cells); CellsInProcess:
	// the cells ran beside the controllers, in one process.
	CellProcs      int  `json:"cell_procs"`
	CellsInProcess bool `json:"cells_in_process"`
	// DeltaXDS: LEDS for delta clients and a delta timing client.
	DeltaXDS     bool   `json:"delta_xds,omitempty"`
	CycleSamples int    `json:"cycle_samples"`
	SolveSamples int    `json:"solve_samples"`
	MaxCells     int    `json:"max_cells,omitempty"`
	FDLimit      uint64 `json:"fd_limit"`
	Seed         uint64 `json:"seed"`
}

// Point is one (cells, regions, topology) combination: its figures, or why
// it was skipped or failed.
type Point struct {
	Cells    int    `json:"cells"`
	Regions  int    `json:"regions"`
	Topology string `json:"topology"`
	// CellsPerController is the most cells one controller held.
	CellsPerController int `json:"cells_per_controller"`
	// Skipped: not run, and why. Error: run, and failed (figures partial).
	Skipped string   `json:"skipped,omitempty"`
	Error   string   `json:"error,omitempty"`
	Figures *Figures `json:"figures,omitempty"`
}

// Figures are one point's measurements. Optional figures are null where
// they do not apply (the flat topology has no summaries and no optimiser).
type Figures struct {
	// OfferedHeartbeatsPerS is what the cells should send (cells /
	// interval); IngestHeartbeatsPerS what the controllers accepted.
	OfferedHeartbeatsPerS float64 `json:"offered_heartbeats_per_s"`
	IngestHeartbeatsPerS  float64 `json:"ingest_heartbeats_per_s"`
	// SentHeartbeatsPerS is what the cells did send over the window;
	// IngestFraction is ingest / offered (the target is ≥ 0.99).
	SentHeartbeatsPerS float64 `json:"sent_heartbeats_per_s"`
	IngestFraction     float64 `json:"ingest_fraction"`
	// IngestAlignedFraction is ingest over the span the accepted
	// heartbeats were sent in, not the span they were read in: per cell,
	// the heartbeats it numbered between the last one the controller had
	// applied at the window's start and at its end, less those refused,
	// over what the cell should have sent between those two heartbeats'
	// sent_at (the span / the interval). IngestFraction counts what was
	// read in the window, so a controller reading 100 ms later at the
	// window's end than at its start shows 0.5 % less on a 20 s window
	// (and 0.5 % more the other way); this one does not move with the
	// read lag. Null when no cell carried sent_at in both views.
	IngestAlignedFraction *float64 `json:"ingest_aligned_fraction"`
	// CellProcs is the number of child processes that held the cells (0:
	// they ran in this process).
	CellProcs int `json:"cell_procs"`
	// CPUSPerS is this process's CPU seconds per second over the window:
	// the controllers' (and the harness's xDS client and probe sink); the
	// cells' senders too when CellProcs is 0. CPUSPerSPer1kCells the same
	// per 1,000 cells. SenderCPUSPerS is the cell processes' CPU (null
	// when the cells ran in this process).
	CPUSPerS           float64  `json:"cpu_s_per_s"`
	CPUSPerSPer1kCells float64  `json:"cpu_s_per_s_per_1k_cells"`
	SenderCPUSPerS     *float64 `json:"sender_cpu_s_per_s"`
	// Cycle cost of one controller (CellsPerController cells): score +
	// project + xDS build/validate/set, timed over CycleSamples cycles.
	CycleP50Ms float64 `json:"cycle_p50_ms"`
	CycleP99Ms float64 `json:"cycle_p99_ms"`
	CycleRuns  int     `json:"cycle_runs"`
	// CycleCPUP50Ms and CycleCPUP99Ms are the same cycles' CPU time, on
	// the thread that ran them (null where the system has no thread
	// clock): the cycle's own cost, without its waits for a core, which
	// the wall times above include.
	CycleCPUP50Ms *float64 `json:"cycle_cpu_p50_ms"`
	CycleCPUP99Ms *float64 `json:"cycle_cpu_p99_ms"`
	// LiveProjectionMeanMs and LiveXDSBuildMeanMs are the live controllers'
	// own means over the window (score+project per cycle; build per push).
	LiveProjectionMeanMs float64 `json:"live_projection_mean_ms"`
	LiveXDSBuildMeanMs   float64 `json:"live_xds_build_mean_ms"`
	LivePushesPerS       float64 `json:"live_pushes_per_s"`
	// ProbesPerS are the controllers' RTT probes of their cells per
	// second (isobar_regional_probes_total, every result).
	ProbesPerS float64 `json:"probes_per_s"`
	// TTLFailuresPerS are live cells failed by their TTL per second over
	// the window (isobar_regional_ttl_failures_total): cells whose
	// heartbeats the controllers read too late, since no cell stops
	// sending in the window. IngestLagMaxMs is the greatest read lag
	// among the controllers at the window's end
	// (isobar_regional_ingest_lag_seconds: how late a controller reads
	// heartbeats, which widens its TTL).
	TTLFailuresPerS float64 `json:"ttl_failures_per_s"`
	IngestLagMaxMs  float64 `json:"ingest_lag_max_ms"`
	// HeartbeatBytes is the mean marshalled heartbeat.
	HeartbeatBytes float64 `json:"heartbeat_bytes"`
	// SummaryBytesPerRegion is the mean marshalled summary (hierarchical).
	SummaryBytesPerRegion *float64 `json:"summary_bytes_per_region"`
	// GlobalInboundBytesPerS: hierarchical, Σ regions summary bytes ×
	// publish rate; flat, the heartbeat bytes/s into the one controller.
	GlobalInboundBytesPerS float64 `json:"global_inbound_bytes_per_s"`
	// SolveMs/SolveP99Ms: optimiser solve time for the region count
	// (hierarchical).
	SolveMs    *float64 `json:"solve_ms"`
	SolveP99Ms *float64 `json:"solve_p99_ms"`
	// Cell death to the endpoint gone at a subscribed xDS client.
	DeathToRemovedP50Ms float64 `json:"death_to_removed_p50_ms"`
	DeathToRemovedP99Ms float64 `json:"death_to_removed_p99_ms"`
	DeathToRemovedMaxMs float64 `json:"death_to_removed_max_ms"`
	DeathsTimed         int     `json:"deaths_timed"`
	// DeathToRemovedMs is every timed death's figure, ascending.
	DeathToRemovedMs []float64 `json:"death_to_removed_ms"`
	// LiveFailoverMeanMs is the controller's own share of those deaths:
	// the mean of isobar_regional_failover_seconds (the cell's failure
	// detected → the push without it done) over the broken-stream deaths.
	LiveFailoverMeanMs *float64 `json:"live_failover_mean_ms"`
	// LiveStreamLossMeanMs is the part of those deaths before that share:
	// the mean of isobar_regional_stream_loss_seconds (the stream's
	// handler saw it break → the registry made the cell suspect: the
	// loss's wait for the registry loop, and for the heartbeat it names
	// when it overtook it). DeathToSentMean minus these two is mostly the
	// close reaching the stream's handler.
	LiveStreamLossMeanMs *float64 `json:"live_stream_loss_mean_ms"`
	// The same deaths at the wire, each traced from its first assignment
	// without the cell back to the ADS response it came in: kill → region
	// 0's controller wrote that response to the transport (sent), → the
	// xDS client read it (received); ClientApply is removed − received,
	// the client's decode, validation and apply. sent − the controller's
	// push is the response's marshal and the wait for the client's ACK of
	// the response before (a state-of-the-world server has one response
	// in flight per type).
	// Over delta xDS several responses can be in flight: sent is then the
	// last written before the client's read, possibly a later response
	// than the one read. All are over the DeathsTraced deaths that the
	// wire logs traced in full; nil when none is.
	DeathsTraced         int      `json:"deaths_traced"`
	DeathToSentP50Ms     *float64 `json:"death_to_sent_p50_ms"`
	DeathToSentP99Ms     *float64 `json:"death_to_sent_p99_ms"`
	DeathToSentMeanMs    *float64 `json:"death_to_sent_mean_ms"`
	DeathToReceivedP50Ms *float64 `json:"death_to_received_p50_ms"`
	DeathToReceivedP99Ms *float64 `json:"death_to_received_p99_ms"`
	ClientApplyP50Ms     *float64 `json:"client_apply_p50_ms"`
	ClientApplyP99Ms     *float64 `json:"client_apply_p99_ms"`
	// KillLag is what the deaths' times leave out: from the harness's ask
	// (a control request to the cell's process) to the cell closing its
	// sockets, the death. On a saturated machine it is the cell
	// process's and goroutine's wait for the CPU, tens of milliseconds.
	KillLagP50Ms *float64 `json:"kill_lag_p50_ms"`
	KillLagP99Ms *float64 `json:"kill_lag_p99_ms"`
	// A silent cell (stream open, no more heartbeats) to the endpoint gone
	// at the xDS client: the TTL path.
	SilentToRemovedP50Ms *float64 `json:"silent_to_removed_p50_ms"`
	SilentToRemovedP99Ms *float64 `json:"silent_to_removed_p99_ms"`
	SilentToRemovedMaxMs *float64 `json:"silent_to_removed_max_ms"`
	SilentDeathsTimed    int      `json:"silent_deaths_timed"`
	// Health of the point: streams that broke without a kill or were
	// refused, cells not Ready after the window, process RSS and
	// goroutines at the end of the window.
	StreamErrors        uint64  `json:"stream_errors"`
	NotReadyAfterWindow int     `json:"not_ready_after_window"`
	RSSMiB              float64 `json:"rss_mib"`
	Goroutines          int     `json:"goroutines"`
	// RSSPer1kCellsMiB and GoroutinesPerCell are what the cells added to
	// this process (the controllers' side of their streams, and the cells
	// themselves when they run here) since just before they started,
	// after a forced GC that returned the last point's garbage to the OS.
	RSSPer1kCellsMiB  float64 `json:"rss_per_1k_cells_mib"`
	GoroutinesPerCell float64 `json:"goroutines_per_cell"`
	// SenderRSSMiB is the cell processes' RSS, summed (null in-process).
	SenderRSSMiB *float64 `json:"sender_rss_mib"`
	// StartS is how long every cell took to be Ready and seen.
	// StartIncomplete: not every cell was, within Config.StartTimeout;
	// the window was measured anyway and no death was timed.
	StartS          float64 `json:"start_s"`
	StartIncomplete bool    `json:"start_incomplete"`
}

// Write writes rep to dir as scale.json, scale.md and the PNG charts
// (creating dir).
func Write(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "scale.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	var md strings.Builder
	WriteMarkdown(&md, rep)
	if err := os.WriteFile(filepath.Join(dir, "scale.md"), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	return writeCharts(dir, rep)
}

// ChartFiles are the charts Write makes, relative to its directory.
func ChartFiles() []string {
	return []string{"cycle.png", "inbound.png", "cpu.png", "death.png"}
}

// writeRow writes one point's row of the table.
func writeRow(w io.Writer, p Point) {
	note := ""
	switch {
	case p.Skipped != "":
		note = "skipped: " + p.Skipped
	case p.Error != "":
		note = "error: " + p.Error
	}
	f := p.Figures
	if f == nil {
		fmt.Fprintf(w, "| %d | %d | %s | %d |%s %s |\n", p.Cells, p.Regions, p.Topology, p.CellsPerController,
			strings.Repeat(" — |", 20), mdEscape(note))
		return
	}
	if f.StreamErrors > 0 || f.NotReadyAfterWindow > 0 {
		note = strings.TrimPrefix(note+fmt.Sprintf("; %d stream errors, %d cells not Ready after the window", f.StreamErrors, f.NotReadyAfterWindow), "; ")
	}
	procs := "in-process"
	if f.CellProcs > 0 {
		procs = fmt.Sprint(f.CellProcs)
	}
	fmt.Fprintf(w, "| %d | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
		p.Cells, p.Regions, p.Topology, p.CellsPerController, procs,
		num(f.OfferedHeartbeatsPerS, 0), num(f.SentHeartbeatsPerS, 0), num(f.IngestHeartbeatsPerS, 0), num(100*f.IngestFraction, 1)+" ("+pct(f.IngestAlignedFraction)+")",
		num(f.CPUSPerS, 3), num(f.CPUSPerSPer1kCells, 3), opt(f.SenderCPUSPerS, 3),
		num(f.RSSPer1kCellsMiB, 1), num(f.GoroutinesPerCell, 2), num(f.CycleP50Ms, 3), num(f.CycleP99Ms, 3), opt(f.CycleCPUP50Ms, 3),
		opt(f.SummaryBytesPerRegion, 0), num(f.GlobalInboundBytesPerS, 0), opt(f.SolveMs, 3),
		num(f.DeathToRemovedP50Ms, 0), num(f.DeathToRemovedP99Ms, 0), opt(f.SilentToRemovedP50Ms, 0), opt(f.SilentToRemovedP99Ms, 0),
		mdEscape(note))
}

// WriteMarkdown renders rep: the machine, the configuration, the table of
// points and the notes.
func WriteMarkdown(w io.Writer, rep *Report) {
	m := rep.Machine
	fmt.Fprintf(w, "# isobar bench scale\n\n")
	fmt.Fprintf(w, "Machine: %s, %d CPUs (%s/%s), %.1f GiB memory, %s; file-descriptor limit %d.\n\n",
		orUnknown(m.CPUModel), m.NumCPU, m.GOOS, m.GOARCH, float64(m.MemoryBytes)/(1<<30), m.GoVersion, rep.Config.FDLimit)
	c := rep.Config
	fmt.Fprintf(w, "Run %s, %.0f s. Heartbeat interval %.0f ms (TTL %.0f ms), controller cycle %.0f ms, summary every %.0f ms; "+
		"window %.0f ms per point after %.0f ms warm-up; %d broken-stream deaths, %d silent cells, %d cycles and %d solves timed per point; seed %d.\n\n",
		rep.Started.UTC().Format(time.RFC3339), rep.ElapsedS, c.HeartbeatIntervalMs, c.TTLMs, c.CycleIntervalMs, c.SummaryIntervalMs,
		c.WindowMs, c.WarmupMs, c.Deaths, c.SilentDeaths, c.CycleSamples, c.SolveSamples, c.Seed)
	if rep.Interrupted {
		fmt.Fprintf(w, "**Interrupted**: the points after the interruption are marked skipped.\n\n")
	}
	fmt.Fprintln(w, "| cells | regions | topology | cells/ctrl | cell procs | offered hb/s | sent hb/s | ingest hb/s | ingest % (aligned %) | ctrl CPU s/s | ctrl CPU s/s per 1k cells | sender CPU s/s | ctrl RSS MiB per 1k cells | goroutines per cell | cycle P50 ms | cycle P99 ms | cycle CPU P50 ms | summary B/region | global inbound B/s | solve ms | broken→removed P50 ms | P99 ms | silent→removed P50 ms | P99 ms | note |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, p := range rep.Points {
		writeRow(w, p)
	}
	fmt.Fprintln(w)
	if len(rep.Notes) > 0 {
		fmt.Fprintln(w, "Notes:")
		for _, n := range rep.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "Charts: "+strings.Join(ChartFiles(), ", ")+". Every figure, with more per point, is in scale.json.")
}

func num(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// pct is v as a percentage to 0.1, or — when absent.
func pct(v *float64) string {
	if v == nil {
		return "—"
	}
	return num(100**v, 1)
}

func opt(v *float64, prec int) string {
	if v == nil {
		return "—"
	}
	return num(*v, prec)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown CPU"
	}
	return s
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
