package scale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
)

// Run measures every point of cfg, one at a time, and returns the report.
// A point that cannot run here is skipped with the reason; one that fails
// keeps its error and the run goes on. When ctx ends, the point in progress
// stops, the rest are marked skipped, and Run returns the report with
// ctx's error. An invalid cfg returns an error wrapping ErrInvalidConfig
// and no report.
func Run(ctx context.Context, cfg Config, deps Deps) (*Report, error) {
	cfg, err := NewConfig(cfg)
	if err != nil {
		return nil, err
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	start := deps.Clock.Now()
	fds := fdLimit()
	rc := regional.DefaultConfig("r")
	rep := &Report{
		Machine: describeMachine(),
		Config: ReportConfig{
			Cells: cfg.Cells, Regions: cfg.Regions,
			HeartbeatIntervalMs: ms(cfg.HeartbeatInterval), TTLMs: ms(cfg.HeartbeatInterval + cfg.TTLGrace),
			SummaryIntervalMs: ms(cfg.SummaryInterval), CycleIntervalMs: ms(controllerCycle(rc)),
			WindowMs: ms(cfg.Window), WarmupMs: ms(cfg.Warmup), Deaths: cfg.Deaths, SilentDeaths: cfg.SilentDeaths,
			CellProcs: cfg.CellProcs, CellsInProcess: deps.CellProcess == nil, DeltaXDS: cfg.DeltaXDS,
			CycleSamples: cfg.CycleSamples, SolveSamples: cfg.SolveSamples, MaxCells: cfg.MaxCells,
			FDLimit: fds, Seed: cfg.Seed,
		},
		Started: start,
		Notes:   notes(deps.CellProcess == nil),
	}
	for _, spec := range specs(cfg) {
		pt := Point{Cells: spec.cells, Regions: spec.regions, Topology: spec.topology, CellsPerController: spec.perController()}
		switch reason := skipReason(cfg, fds, spec, spec.cellProcs(cfg, deps)); {
		case reason != "":
			pt.Skipped = reason
		case ctx.Err() != nil:
			pt.Skipped = "the run was interrupted before this point"
		default:
			f, err := runPoint(ctx, cfg, deps, spec)
			var skip skipError
			switch {
			case errors.As(err, &skip):
				pt.Skipped = skip.reason
			case err != nil:
				pt.Figures, pt.Error = f, err.Error()
			default:
				pt.Figures = f
			}
		}
		rep.Points = append(rep.Points, pt)
		progress(deps, pt)
	}
	rep.ElapsedS = deps.Clock.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		rep.Interrupted = true
		return rep, err
	}
	return rep, nil
}

// controllerCycle is the controllers' scoring cycle (regional's default).
func controllerCycle(rc regional.Config) time.Duration {
	if rc.CycleInterval > 0 {
		return rc.CycleInterval
	}
	return 100 * time.Millisecond
}

// specs lists the points in order: per fleet size, the flat topology, then
// the hierarchical one per region count.
func specs(cfg Config) []pointSpec {
	runs := func(t string) bool { return len(cfg.Topologies) == 0 || slices.Contains(cfg.Topologies, t) }
	var out []pointSpec
	for _, n := range cfg.Cells {
		if runs(Flat) {
			out = append(out, pointSpec{cells: n, regions: 1, topology: Flat})
		}
		if !runs(Hierarchical) {
			continue
		}
		for _, r := range cfg.Regions {
			out = append(out, pointSpec{cells: n, regions: r, topology: Hierarchical})
		}
	}
	return out
}

func progress(deps Deps, p Point) {
	if deps.Progress == nil {
		return
	}
	head := fmt.Sprintf("%6d cells %3d regions %-12s", p.Cells, p.Regions, p.Topology)
	switch {
	case p.Skipped != "":
		fmt.Fprintf(deps.Progress, "%s skipped: %s\n", head, p.Skipped)
		return
	case p.Figures == nil:
		fmt.Fprintf(deps.Progress, "%s error: %s\n", head, p.Error)
		return
	}
	f := p.Figures
	fmt.Fprintf(deps.Progress, "%s ingest %.0f of %.0f hb/s (%.1f %%, aligned %s %%), ctrl cpu %.3f s/s/1k, sender cpu %s s/s, cycle p50 %.2f ms p99 %.2f ms, inbound %.0f B/s, death p50 %.0f ms p99 %.0f ms (controller's share %s ms, loss's wait %s ms, sent mean %s; sent p50 %s, received p50 %s, client apply p50 %s ms; kill lag p50 %s p99 %s ms), silent p50 %s ms p99 %s ms",
		head, f.IngestHeartbeatsPerS, f.OfferedHeartbeatsPerS, 100*f.IngestFraction, pct(f.IngestAlignedFraction), f.CPUSPerSPer1kCells, opt(f.SenderCPUSPerS, 3),
		f.CycleP50Ms, f.CycleP99Ms, f.GlobalInboundBytesPerS, f.DeathToRemovedP50Ms, f.DeathToRemovedP99Ms,
		opt(f.LiveFailoverMeanMs, 1), opt(f.LiveStreamLossMeanMs, 1), opt(f.DeathToSentMeanMs, 0), opt(f.DeathToSentP50Ms, 0), opt(f.DeathToReceivedP50Ms, 0), opt(f.ClientApplyP50Ms, 0), opt(f.KillLagP50Ms, 0), opt(f.KillLagP99Ms, 0), opt(f.SilentToRemovedP50Ms, 0), opt(f.SilentToRemovedP99Ms, 0))
	if p.Error != "" {
		fmt.Fprintf(deps.Progress, " error: %s", p.Error)
	}
	fmt.Fprintln(deps.Progress)
}

// notes explain the figures; they go into both reports. inProcess: the
// cells ran beside the controllers.
func notes(inProcess bool) []string {
	where := "The regional controllers run in this process and the synthetic cells in child processes (`isobar bench scale cells`, the cells dealt round-robin, each child with its descriptor limit raised to its hard limit, controlled over its stdin/stdout), all on loopback with plaintext gRPC: the real controllers (heartbeat service, registry, scoring, projection, xDS server, summary loop) and synthetic cells, each a real CellRegistry.Heartbeat stream over its own TCP connection."
	cpu := "ctrl CPU s/s: this process's CPU (getrusage user+system) per second of the window: the controllers, plus the harness's one xDS client and probe sink; the senders run in the cell processes, whose CPU is sender CPU s/s (their own getrusage, summed)."
	if inProcess {
		where = "Everything runs in one process on loopback, plaintext gRPC: the real regional controllers (heartbeat service, registry, scoring, projection, xDS server, summary loop) and synthetic cells, each a real CellRegistry.Heartbeat stream over its own TCP connection."
		cpu = "ctrl CPU s/s: process CPU (getrusage user+system) per second of the window; it includes the synthetic cells' senders, which share the process and the CPUs."
	}
	return []string{
		where,
		"flat: one controller ingests every cell's heartbeats (no hierarchy); it does not depend on the region count, so it runs once per fleet size (regions = 1). hierarchical: cells split round-robin over R controllers, each publishing its summary.",
		"offered hb/s: cells / heartbeat interval; ingest hb/s: heartbeats the controllers accepted per second over the window (isobar_regional_heartbeats_total); ingest % = ingest / offered (target ≥ 99 %), and in brackets the same aligned by sent_at (ingest_aligned_fraction: per cell, the heartbeats numbered between the last applied at the window's start and at its end, less the refused, over what it should have sent between their sent_at; the controllers' read lag at the window's edges moves the first, not this); sent hb/s: what the cells did send (below offered when their processes do not get the CPU to keep their tickers). Each rate is taken between its own counter's two reads (the cells' are read over their processes' pipes, seconds later at saturated points).",
		cpu,
		"ctrl RSS MiB per 1k cells and goroutines per cell: what the cells added to this process (VmRSS, runtime.NumGoroutine) between just before they started (after a forced GC returned the last point's garbage) and the end of the window, per 1,000 cells and per cell; absolute figures, and the cell processes' RSS, are in scale.json.",
		"cycle P50/P99: one controller's score + project + xDS build/validate/set for the cells it holds (cells/ctrl), run with the real regional/score, regional/projection and regional/xds code on the live registry's cells, every weight moving each cycle (the worst case, a full push). The live controllers' own mean projection and xDS-build times are in scale.json (live_*).",
		"summary B/region: proto.Size of the summaries the real controllers built (with the RTT to its 8 nearest regions and its Vivaldi coordinate, as a gossip member reports them). global inbound B/s: hierarchical = Σ regions summary bytes × publish rate; flat = marshalled heartbeat bytes per second into the one controller. Both are protobuf payload sizes, without gRPC/HTTP/2 framing.",
		"solve ms: P50 of optimize.Solve on an instance of the region count generated as the optimiser's benchmarks do (random map, capacities 50–500 rps, demand 30–110 % of capacity); the flat topology has no optimiser.",
		"broken→removed: from closing a cell's TCP connection under its stream (like SIGKILL, no Terminated heartbeat) to the first EDS assignment without it at a subscribed go-control-plane ADS client (xdsclient.Watcher) on the cell's controller; the broken stream makes the cell suspect (weight 0) at once, so the figure is the controller cycle it triggers plus the push. Its controller-side share, the mean of isobar_regional_failover_seconds (failure detected → push done) over the same deaths, is live_failover_mean_ms in scale.json, and live_stream_loss_mean_ms the mean of isobar_regional_stream_loss_seconds before it (the stream's handler saw the break → the registry made the cell suspect: the loss's wait for the registry loop, and for the heartbeat it names when it overtook it); the rest is the close reaching the stream's handler and the client receiving and decoding the assignment (death_to_sent_mean_ms minus the two shares is the first of these). At the wire (scale.json, over the deaths_traced deaths the wire logs traced in full): death_to_sent (the controller wrote the ADS response the removal came in; sent minus the controller's share is mostly the wait for the client's ACK of the response before, as a state-of-the-world server has one response in flight per type, and the response's marshal), death_to_received (the client read it) and client_apply (removed minus received: the client's unmarshal, validation and decode). The time starts when the cell closed its sockets, by the clock of its process; kill_lag in scale.json is what that leaves out, from the harness's ask to the close (the control request and the cell's goroutine waiting for the CPU).",
		"silent→removed: from a cell ceasing to send while its stream stays open (a hung agent) to the same EDS assignment without it: the TTL path (heartbeat interval + grace since its last heartbeat, then the registry's sweep and the push).",
	}
}
