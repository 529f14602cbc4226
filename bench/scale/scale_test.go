package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// smokeConfig is a run of seconds: two fleet sizes, two region counts,
// short windows, a few deaths.
func smokeConfig() Config {
	return Config{
		Cells: []int{10, 40}, Regions: []int{1, 2},
		// The window spans three heartbeat intervals (500 ms): cells
		// started together beat in phase, so a window shorter than an
		// interval counts each cell's beat once or not at all, and the
		// ingest check below (offered ±50 %) would be a coin toss; over
		// three intervals each cell counts 2 to 4 beats of 3.
		Window: 1500 * time.Millisecond, Warmup: 100 * time.Millisecond,
		Deaths: 3, SilentDeaths: 2, CycleSamples: 20, CycleBudget: 200 * time.Millisecond,
		SolveSamples: 5, SolveBudget: 100 * time.Millisecond,
		StartTimeout: 20 * time.Second, DeathTimeout: 10 * time.Second,
	}
}

// TestSmoke runs a tiny scale run and checks the report's shape and
// invariants.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Run(ctx, smokeConfig(), Deps{Progress: &progress})
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := Write(dir, rep); err != nil {
		t.Fatal(err)
	}

	type key struct {
		cells, regions int
		topology       string
	}
	got := map[key]Point{}
	for _, p := range rep.Points {
		got[key{p.Cells, p.Regions, p.Topology}] = p
	}
	for _, cells := range []int{10, 40} {
		want := []key{{cells, 1, Flat}, {cells, 1, Hierarchical}, {cells, 2, Hierarchical}}
		for _, k := range want {
			p, ok := got[k]
			switch {
			case !ok:
				t.Errorf("point %+v missing", k)
			case p.Skipped != "":
				t.Errorf("point %+v skipped: %s", k, p.Skipped)
			case p.Error != "" || p.Figures == nil:
				t.Errorf("point %+v failed: %s", k, p.Error)
			default:
				checkFigures(t, p)
			}
		}
	}
	if len(rep.Points) != 6 {
		t.Errorf("%d points, want 6", len(rep.Points))
	}
	if t.Failed() {
		return
	}

	// The hierarchy's point: the global takes in less than a flat
	// controller does, and the summary does not grow with the cells.
	flat, hier := got[key{40, 1, Flat}].Figures, got[key{40, 2, Hierarchical}].Figures
	if !(hier.GlobalInboundBytesPerS < flat.GlobalInboundBytesPerS) {
		t.Errorf("40 cells: hierarchical inbound %.0f B/s, flat %.0f B/s: want hierarchical < flat",
			hier.GlobalInboundBytesPerS, flat.GlobalInboundBytesPerS)
	}
	for _, r := range []int{1, 2} {
		small, big := *got[key{10, r, Hierarchical}].Figures.SummaryBytesPerRegion, *got[key{40, r, Hierarchical}].Figures.SummaryBytesPerRegion
		if big > small*1.1+8 {
			t.Errorf("%d regions: summary %.0f B at 10 cells, %.0f B at 40: grows with cells", r, small, big)
		}
	}

	// JSON round-trips.
	b, err := os.ReadFile(filepath.Join(dir, "scale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	b1, _ := json.Marshal(rep)
	if !bytes.Equal(b1, b2) {
		t.Error("scale.json does not round-trip")
	}
	for _, k := range []string{`"ingest_heartbeats_per_s"`, `"cpu_s_per_s_per_1k_cells"`, `"cycle_p50_ms"`, `"cycle_p99_ms"`,
		`"summary_bytes_per_region"`, `"global_inbound_bytes_per_s"`, `"solve_ms"`, `"death_to_removed_p50_ms"`,
		`"death_to_removed_p99_ms"`, `"cpu_model"`, `"num_cpu"`} {
		if !bytes.Contains(b, []byte(k)) {
			t.Errorf("scale.json lacks %s", k)
		}
	}
	if back.Machine.NumCPU < 1 || back.Machine.GoVersion == "" || back.Machine.GOOS == "" {
		t.Errorf("machine not described: %+v", back.Machine)
	}
	checkFiles(t, dir)
}

// checkFigures checks one measured point's figures.
func checkFigures(t *testing.T, p Point) {
	t.Helper()
	f := p.Figures
	positive := map[string]float64{
		"ingest_heartbeats_per_s": f.IngestHeartbeatsPerS, "cpu_s_per_s_per_1k_cells": f.CPUSPerSPer1kCells,
		"cycle_p50_ms": f.CycleP50Ms, "cycle_p99_ms": f.CycleP99Ms, "global_inbound_bytes_per_s": f.GlobalInboundBytesPerS,
		"death_to_removed_p50_ms": f.DeathToRemovedP50Ms, "death_to_removed_p99_ms": f.DeathToRemovedP99Ms,
		"heartbeat_bytes": f.HeartbeatBytes,
	}
	if p.Topology == Hierarchical {
		if f.SummaryBytesPerRegion == nil || f.SolveMs == nil {
			t.Errorf("%+v: hierarchical point without summary bytes or solve time", p)
			return
		}
		positive["summary_bytes_per_region"], positive["solve_ms"] = *f.SummaryBytesPerRegion, *f.SolveMs
	} else if f.SummaryBytesPerRegion != nil || f.SolveMs != nil {
		t.Errorf("%d cells flat: summary bytes or solve time set", p.Cells)
	}
	for name, v := range positive {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%d cells %d regions %s: %s = %v, want finite and > 0", p.Cells, p.Regions, p.Topology, name, v)
		}
	}
	if f.CycleP50Ms > f.CycleP99Ms || f.DeathToRemovedP50Ms > f.DeathToRemovedP99Ms {
		t.Errorf("%+v: a P50 above its P99", *f)
	}
	checkBreakdown(t, p)
	if f.DeathsTimed != 3 || f.SilentDeathsTimed != 2 {
		t.Errorf("%d deaths and %d silent cells timed, want 3 and 2", f.DeathsTimed, f.SilentDeathsTimed)
	}
	if f.SilentToRemovedP50Ms == nil || !(*f.SilentToRemovedP50Ms > 0) || *f.SilentToRemovedP50Ms > *f.SilentToRemovedP99Ms {
		t.Errorf("silent→removed %v / %v, want 0 < P50 ≤ P99", f.SilentToRemovedP50Ms, f.SilentToRemovedP99Ms)
	}
	if (f.CellProcs > 0) != (f.SenderCPUSPerS != nil) || (f.CellProcs > 0) != (f.SenderRSSMiB != nil) {
		t.Errorf("%d cell processes, sender CPU %v, sender RSS %v: want both set exactly with processes", f.CellProcs, f.SenderCPUSPerS, f.SenderRSSMiB)
	}
	if !(f.SentHeartbeatsPerS > 0) || !(f.IngestFraction > 0) || !(f.GoroutinesPerCell > 0) {
		t.Errorf("sent %v hb/s, ingest fraction %v, goroutines per cell %v: want > 0", f.SentHeartbeatsPerS, f.IngestFraction, f.GoroutinesPerCell)
	}
	// A broken stream makes the cell suspect at once (regional), so the
	// removal no longer waits for the TTL; how fast it is goes to the
	// report, not to an assertion here.
	// Every offered heartbeat is ingested, give or take the window's edges.
	if f.IngestHeartbeatsPerS < 0.5*f.OfferedHeartbeatsPerS || f.IngestHeartbeatsPerS > 1.5*f.OfferedHeartbeatsPerS {
		t.Errorf("ingest %.1f hb/s, offered %.1f", f.IngestHeartbeatsPerS, f.OfferedHeartbeatsPerS)
	}
	if a := f.IngestAlignedFraction; a == nil || *a < 0.5 || *a > 1.5 {
		t.Errorf("aligned ingest %v, want within half of the offered", a)
	}
	if f.StreamErrors != 0 || f.NotReadyAfterWindow != 0 {
		t.Errorf("%d stream errors, %d cells not Ready", f.StreamErrors, f.NotReadyAfterWindow)
	}
}

// checkFiles checks the Markdown table and the charts.
func checkFiles(t *testing.T, dir string) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(dir, "scale.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| cells | regions | topology |", "|---:|", "| 40 | 2 | hierarchical |", "| 10 | 1 | flat |", "Machine:", "CPUs"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("scale.md lacks %q", want)
		}
	}
	for _, name := range ChartFiles() {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s is not a PNG", name)
		}
	}
}

// TestSkips checks that points beyond the machine or the ceiling are
// skipped with a reason, and that nothing runs for them.
func TestSkips(t *testing.T) {
	cfg, err := NewConfig(Config{Cells: []int{3, 10000}, Regions: []int{1, 5}, MaxCells: 5000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec pointSpec
		fds  uint64
		want string
	}{
		{pointSpec{3, 5, Hierarchical}, 1 << 20, "fewer cells"},
		{pointSpec{10000, 1, Flat}, 1 << 20, "ceiling of 5000"},
		{pointSpec{3, 1, Flat}, 10, "file descriptors"},
		{pointSpec{3, 1, Flat}, 1 << 20, ""},
		{pointSpec{3, 1, Flat}, 0, ""}, // unknown limit
	} {
		got := skipReason(cfg, tc.fds, tc.spec, 0)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%+v fds %d: %q, want %q", tc.spec, tc.fds, got, tc.want)
		}
	}
	// With cell processes this process holds one end per cell: 10,000
	// cells fit 20,000 descriptors, as they do not in one process.
	big := pointSpec{10000, 10, Hierarchical}
	if r := skipReason(Config{}, 20000, big, 0); !strings.Contains(r, "both ends") {
		t.Errorf("10,000 cells in one process under 20,000 descriptors: %q, want skipped", r)
	}
	if r := skipReason(Config{}, 20000, big, 3); r != "" {
		t.Errorf("10,000 cells over 3 processes: skipped: %s", r)
	}
	if r := childSkipReason(big, 3, 20000); r != "" {
		t.Errorf("3,334 cells per child under 20,000: %s", r)
	}
	if r := childSkipReason(big, 3, 1024); !strings.Contains(r, "--cell-procs") {
		t.Errorf("3,334 cells per child under 1,024: %q, want skipped with a remedy", r)
	}
	for _, tc := range []struct{ cfg, cells, want int }{{0, 10, 1}, {0, 4000, 1}, {0, 4001, 2}, {0, 10000, 3}, {2, 20, 2}, {8, 3, 3}} {
		if got := (pointSpec{tc.cells, 1, Flat}).cellProcs(Config{CellProcs: tc.cfg}, Deps{CellProcess: (&childCommands{}).make}); got != tc.want {
			t.Errorf("--cell-procs %d, %d cells: %d processes, want %d", tc.cfg, tc.cells, got, tc.want)
		}
	}
	if got := (pointSpec{10, 1, Flat}).cellProcs(Config{CellProcs: 2}, Deps{}); got != 0 {
		t.Errorf("no CellProcess: %d processes, want 0 (in this process)", got)
	}
	// An all-skipped run returns at once with every point and its reason.
	rep, err := Run(context.Background(), Config{Cells: []int{2}, Regions: []int{3, 4}, MaxCells: 1}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range rep.Points {
		got = append(got, p.Topology+":"+p.Skipped)
	}
	want := []string{"flat:above the ceiling of 1 cells (--max-cells)",
		"hierarchical:fewer cells (2) than regions (3): every region needs a cell",
		"hierarchical:fewer cells (2) than regions (4): every region needs a cell"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("points %q, want %q", got, want)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Cells: []int{0}}, {Regions: []int{0}}, {Regions: []int{1000}}, {Deaths: -1},
		{HeartbeatInterval: time.Millisecond}, {Window: -time.Second}, {MaxCells: -1},
		{CellProcs: -1}, {CellProcs: 65}, {SilentDeaths: 1001}, {Topologies: []string{"mesh"}},
	} {
		if _, err := NewConfig(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	c, err := NewConfig(Config{Cells: []int{100, 10, 10}})
	if err != nil || !reflect.DeepEqual(c.Cells, []int{10, 100}) || !reflect.DeepEqual(c.Regions, DefaultRegions()) {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	// --topology picks the points: hierarchical only skips the flat ones.
	h := specs(Config{Cells: []int{10, 100}, Regions: []int{1, 10}, Topologies: []string{Hierarchical}})
	if len(h) != 4 || slices.ContainsFunc(h, func(p pointSpec) bool { return p.topology == Flat }) {
		t.Errorf("hierarchical only: %+v", h)
	}
	if all := specs(Config{Cells: []int{10}, Regions: []int{1, 10}}); len(all) != 3 {
		t.Errorf("both topologies: %+v, want flat and 2 hierarchical", all)
	}
}

// TestSmokeCellProcs runs a tiny point with its 20 cells in 2 child
// processes, then one whose children cannot open enough descriptors (it is
// skipped with the reason, not hung), and checks every child was reaped.
func TestSmokeCellProcs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cc := &childCommands{}
	cfg := smokeConfig()
	cfg.Cells, cfg.Regions, cfg.CellProcs = []int{20}, []int{2}, 2
	var progress bytes.Buffer
	rep, err := Run(ctx, cfg, Deps{CellProcess: cc.make, Progress: &progress})
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 2 || rep.Config.CellsInProcess {
		t.Fatalf("%d points, in process %v; want 2 with cell processes", len(rep.Points), rep.Config.CellsInProcess)
	}
	for _, p := range rep.Points {
		if p.Skipped != "" || p.Error != "" || p.Figures == nil {
			t.Errorf("point %d/%d %s: skipped %q, error %q", p.Cells, p.Regions, p.Topology, p.Skipped, p.Error)
			continue
		}
		if p.Figures.CellProcs != 2 {
			t.Errorf("%d cell processes, want 2", p.Figures.CellProcs)
		}
		checkFigures(t, p)
	}
	checkReaped(t, cc)
	if n := len(cc.made()); n != 4 {
		t.Errorf("%d cell processes made, want 2 per point", n)
	}

	few := &childCommands{env: []string{"ISOBAR_SCALE_TEST_CHILD_NOFILE=40"}}
	cfg.Regions = []int{1}
	rep, err = Run(ctx, cfg, Deps{CellProcess: few.make})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Points {
		if !strings.Contains(p.Skipped, "file descriptors") || !strings.Contains(p.Skipped, "can open 40") {
			t.Errorf("point %d/%d %s under 40 descriptors per child: skipped %q, error %q; want skipped with the reason",
				p.Cells, p.Regions, p.Topology, p.Skipped, p.Error)
		}
	}
	checkReaped(t, few)
}

// TestFiguresJSONNaN: a figure not measured (NaN) is written null, not an
// error.
func TestFiguresJSONNaN(t *testing.T) {
	f := Figures{CycleP50Ms: math.NaN(), CycleP99Ms: 2, SilentToRemovedP50Ms: ptr(math.Inf(1)), SolveMs: ptr(3)}
	b, err := json.Marshal(Point{Cells: 1, Figures: &f})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cycle_p50_ms":null`, `"cycle_p99_ms":2`, `"silent_to_removed_p50_ms":null`, `"solve_ms":3`, `"sender_cpu_s_per_s":null`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back Point
	if err := json.Unmarshal(b, &back); err != nil || back.Figures.CycleP99Ms != 2 || *back.Figures.SolveMs != 3 {
		t.Errorf("round trip: %+v, %v", back.Figures, err)
	}
}

// TestSmokeDeltaXDS runs one point with LEDS for delta clients and the
// timing client on delta ADS: the deaths are timed over delta as over
// state-of-the-world (every death seen, the figures sane).
func TestSmokeDeltaXDS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := smokeConfig()
	cfg.Cells, cfg.Regions, cfg.DeltaXDS = []int{20}, []int{1}, true
	rep, err := Run(ctx, cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Config.DeltaXDS || len(rep.Points) != 2 {
		t.Fatalf("delta %v, %d points; want delta and 2 points", rep.Config.DeltaXDS, len(rep.Points))
	}
	for _, p := range rep.Points {
		if p.Skipped != "" || p.Error != "" || p.Figures == nil {
			t.Errorf("point %d/%d %s: skipped %q, error %q", p.Cells, p.Regions, p.Topology, p.Skipped, p.Error)
			continue
		}
		checkFigures(t, p)
	}
}

// checkBreakdown checks the deaths' wire breakdown: present (the stats
// handlers are wired on region 0's controller and the xDS client) and in
// order, sent ≤ received ≤ removed, with the client's apply the rest.
func checkBreakdown(t *testing.T, p Point) {
	t.Helper()
	f := p.Figures
	for name, v := range map[string]*float64{
		"death_to_sent_p50_ms": f.DeathToSentP50Ms, "death_to_sent_p99_ms": f.DeathToSentP99Ms,
		"death_to_received_p50_ms": f.DeathToReceivedP50Ms, "death_to_received_p99_ms": f.DeathToReceivedP99Ms,
		"client_apply_p50_ms": f.ClientApplyP50Ms, "client_apply_p99_ms": f.ClientApplyP99Ms,
		"death_to_sent_mean_ms": f.DeathToSentMeanMs, "live_stream_loss_mean_ms": f.LiveStreamLossMeanMs,
	} {
		if v == nil || math.IsNaN(*v) {
			t.Errorf("%d cells %d regions %s: %s missing", p.Cells, p.Regions, p.Topology, name)
			return
		}
	}
	// The loss's wait is a part of a death's time to its removal, and
	// nothing is traced to a response from before the death.
	if *f.LiveStreamLossMeanMs < 0 || *f.LiveStreamLossMeanMs > f.DeathToRemovedMaxMs || *f.DeathToSentMeanMs < 0 {
		t.Errorf("%d cells %d regions %s: the loss's wait %v ms mean, deaths to removed %v ms at most, to sent %v ms mean: want 0 ≤ wait ≤ removed, sent ≥ 0",
			p.Cells, p.Regions, p.Topology, *f.LiveStreamLossMeanMs, f.DeathToRemovedMaxMs, *f.DeathToSentMeanMs)
	}
	// The breakdown is over the deaths traced in full, each of which has
	// sent ≤ received ≤ removed: its own quantiles keep that order, and
	// none is beyond the slowest removal.
	if *f.DeathToSentP50Ms > *f.DeathToReceivedP50Ms || *f.DeathToReceivedP50Ms > f.DeathToRemovedMaxMs || *f.ClientApplyP50Ms < 0 || f.DeathsTraced < 1 {
		t.Errorf("%d cells %d regions %s: sent %v, received %v, removed %v ms, client apply %v: want sent ≤ received ≤ the slowest removed (%v ms), apply ≥ 0, a death traced (%d)",
			p.Cells, p.Regions, p.Topology, *f.DeathToSentP50Ms, *f.DeathToReceivedP50Ms, f.DeathToRemovedP50Ms, *f.ClientApplyP50Ms, f.DeathToRemovedMaxMs, f.DeathsTraced)
	}
}
