package cellagent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A /health probe that times out is tolerated while the engine was
// answering, until HealthTimeouts probes in a row go unanswered; an answer
// resets the count; a refused connection counts at once; and a timeout
// when the engine was not answering already counts at once.
func TestHealthTimeoutsThreshold(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewAgent(Config{CellID: "c", Region: "r", ControllerAddr: "127.0.0.1:1", VLLMURL: "http://127.0.0.1:1/metrics", HealthTimeouts: 3},
		Deps{Logger: testLogger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	apply := func(p engineProbe) enginePhase {
		t.Helper()
		seq++
		p.seq = seq
		a.scr.mu.Lock()
		defer a.scr.mu.Unlock()
		a.scr.applyHealthLocked(p)
		return a.scr.st.engine.phase
	}
	up := func() engineProbe { return classifyHealth(200, nil, 0) }
	timeout := func() engineProbe {
		return engineProbe{phase: phaseDown, reason: "health probe timed out after 1s", timedOut: true}
	}
	refused := func() engineProbe {
		return engineProbe{phase: phaseDown, reason: "engine unreachable: connection refused"}
	}

	// Never answered yet: a timeout counts at once.
	if got := apply(timeout()); got != phaseDown {
		t.Fatalf("first probe timed out: phase %v, want down", got)
	}
	if got := apply(up()); got != phaseUp {
		t.Fatalf("answered: phase %v, want up", got)
	}
	// Two timeouts tolerated, the third takes the engine down.
	for i := 1; i <= 2; i++ {
		if got := apply(timeout()); got != phaseUp {
			t.Fatalf("timeout %d of 3: phase %v, want still up", i, got)
		}
	}
	if got := apply(timeout()); got != phaseDown {
		t.Fatalf("timeout 3 of 3: phase %v, want down", got)
	}
	// An answer resets the streak.
	apply(up())
	apply(timeout())
	apply(timeout())
	if got := apply(up()); got != phaseUp {
		t.Fatalf("answered after two timeouts: phase %v, want up", got)
	}
	if got := apply(timeout()); got != phaseUp {
		t.Fatalf("one timeout after an answer: phase %v, want up (the streak restarted)", got)
	}
	// A refused connection is a dead engine: down at once.
	if got := apply(refused()); got != phaseDown {
		t.Fatalf("connection refused: phase %v, want down", got)
	}
	if got := testutil.ToFloat64(a.scr.m.healthTimeouts); got != 5 {
		t.Errorf("health_timeouts_tolerated_total = %v, want 5", got)
	}
}
