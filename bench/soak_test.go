package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// tinySoak is a soak small and fast enough for go test: 2 regions, 20
// cells, a few seconds of churn on short timers, bounds loose enough for
// the race detector on a loaded 2-core machine.
func tinySoak(t *testing.T) SoakConfig {
	return SoakConfig{
		Regions: []string{"a", "b"}, Cells: 20,
		Duration: 4 * time.Second, Warmup: time.Second, SampleEvery: 500 * time.Millisecond,
		ChurnInterval: 400 * time.Millisecond, ChurnFraction: 0.1, ChurnDown: 700 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, TTLGrace: 400 * time.Millisecond,
		PlanInterval: 200 * time.Millisecond, SummaryInterval: 200 * time.Millisecond, PlanTTL: 10 * time.Second,
		LeaseTTL: time.Second, PlanPoll: 50 * time.Millisecond,
		Settle: 20 * time.Second, StartTimeout: time.Minute,
		MaxRSSGrowth: 1, RSSAllowance: 512 << 20, MaxGoroutineGrowth: 1, GoroutineAllowance: 500,
		GoroutineReturnAllowance: 100, MaxStreamErrors: 0,
		Dir: t.TempDir(),
	}
}

// TestSoakTiny runs a whole soak and checks the report's shape and its
// invariants: every phase sampled, every check computed and passed, plans
// monotonic and advancing, churn that really killed and returned cells.
func TestSoakTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, the global pair and two controllers")
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunSoak(ctx, tinySoak(t), SoakDeps{Progress: &progress, Logger: slog.New(slog.DiscardHandler)})
	var table bytes.Buffer
	if rep != nil {
		WriteSoakTable(&table, rep)
	}
	t.Logf("progress:\n%s\nreport:\n%s", progress.String(), table.String())
	if err != nil {
		t.Fatalf("RunSoak: %v", err)
	}
	if !rep.Passed || rep.Interrupted {
		t.Fatalf("passed %v interrupted %v", rep.Passed, rep.Interrupted)
	}
	phases := map[string]int{}
	for _, s := range rep.Samples {
		phases[s.Phase]++
		if s.RSSBytes == 0 || s.HeapInuseBytes == 0 || s.Goroutines == 0 || len(s.Regions) != 2 {
			t.Errorf("sample at %.1fs incomplete: %+v", s.TSeconds, s)
		}
	}
	if phases[PhaseWarmup] < 1 || phases[PhaseSoak] < minFlatSamples || phases[PhaseSettled] != 1 || phases[PhaseStopped] != 1 {
		t.Errorf("samples by phase %v", phases)
	}
	// Cells are down longer than the churn interval: every churn sample
	// after the first round sees some down.
	down := 0
	for _, s := range rep.Samples {
		if s.Phase == PhaseSoak && s.LiveCells < 20 {
			down++
		}
	}
	if down == 0 {
		t.Error("no soak sample saw a cell down: the churn did not show")
	}
	last := rep.Samples[len(rep.Samples)-1]
	if last.Phase != PhaseStopped || last.Streams != 0 || last.LiveCells != 0 {
		t.Errorf("last sample %+v: want stopped with no stream", last)
	}
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
	}
	for _, want := range []string{CheckRSSFlat, CheckGoroutinesFlat, CheckStreamsMatch, CheckGoroutinesReturn,
		CheckStreamErrors, CheckPlansMonotonic, CheckPlansAdvance, CheckPlanGap} {
		if !slices.Contains(names, want) {
			t.Errorf("check %s not computed (have %v)", want, names)
		}
	}
	checkSoakPlans(t, rep)
	if rep.Churn.Kills == 0 || rep.Churn.Returns == 0 || rep.Churn.Returns > rep.Churn.Kills {
		t.Errorf("churn %+v: want kills and as many or fewer returns", rep.Churn)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"samples", "checks", "plans", "churn", "passed", "rss_source", "baseline_goroutines"} {
		if _, ok := back[k]; !ok {
			t.Errorf("report JSON lacks %q", k)
		}
	}
}

// checkSoakPlans: every sample on a plan, epochs non-decreasing in the
// series and advancing over the run.
func checkSoakPlans(t *testing.T, rep *SoakReport) {
	t.Helper()
	prev := map[string]PlanMark{}
	for _, s := range rep.Samples {
		for _, r := range s.Regions {
			if r.Source != "plan" || r.Plan.Epoch == 0 {
				t.Errorf("%s at %.1fs not on a plan: %+v", r.Region, s.TSeconds, r)
			}
			if r.Plan.Less(prev[r.Region]) {
				t.Errorf("%s at %.1fs: plan %s after %s", r.Region, s.TSeconds, r.Plan, prev[r.Region])
			}
			prev[r.Region] = r.Plan
		}
	}
	if len(rep.Plans) != 2 {
		t.Fatalf("plans of %d regions, want 2", len(rep.Plans))
	}
	for _, p := range rep.Plans {
		if len(p.Epochs) == 0 || !slices.IsSorted(p.Epochs) || len(slices.Compact(slices.Clone(p.Epochs))) != len(p.Epochs) {
			t.Errorf("%s: epochs %v: want at least one, strictly increasing", p.Region, p.Epochs)
		}
		if !p.First.Less(p.Last) || p.Plans["applied"] < 2 {
			t.Errorf("%s: plans %s→%s, by result %v", p.Region, p.First, p.Last, p.Plans)
		}
	}
}

// TestSoakInterrupted: a cancelled context stops the run promptly, with
// the samples so far and ErrInterrupted.
func TestSoakInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, the global pair and two controllers")
	}
	cfg := tinySoak(t)
	cfg.Duration = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress syncBuffer
	progress.onWrite = func(b []byte) {
		if bytes.Contains(b, []byte(" soak ")) { // the first post-warm-up sample
			cancel()
		}
	}
	rep, err := RunSoak(ctx, cfg, SoakDeps{Progress: &progress})
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("err %v, want ErrInterrupted", err)
	}
	if rep == nil || !rep.Interrupted || rep.Passed || len(rep.Samples) == 0 {
		t.Fatalf("report %+v: want interrupted, not passed, with samples", rep)
	}
}

// syncBuffer is a bytes.Buffer that calls onWrite with each write; only
// RunSoak's goroutine writes progress.
type syncBuffer struct {
	bytes.Buffer
	onWrite func([]byte)
}

func (s *syncBuffer) Write(b []byte) (int, error) {
	if s.onWrite != nil {
		s.onWrite(b)
	}
	return s.Buffer.Write(b)
}
