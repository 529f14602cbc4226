package cellagent

import (
	"context"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// TestRunUntilCancelled runs the composition root on the real clock: it
// heartbeats, serves its metrics, and on cancellation sends TERMINATED and
// returns.
func TestRunUntilCancelled(t *testing.T) {
	eng := newFakeEngine(t)
	reg := newFakeRegistry(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			CellID: "c1", Region: "r1", ControllerAddr: reg.addr, VLLMURL: eng.metricsURL(),
			Interval: 20 * time.Millisecond, MetricsListen: "127.0.0.1:0",
		}, Deps{Logger: testLogger(t)})
	}()
	reg.nextMatching(t, "READY", func(hb *isobarpb.CellHeartbeat) bool { return hb.GetState() == stateReady })
	// A few heartbeats on the real clock.
	for range 3 {
		if hb := reg.next(t); hb.GetState() != stateReady || hb.GetDcgm().GetError() != "not configured" {
			t.Fatalf("heartbeat = %v", hb)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancellation")
	}
	reg.nextMatching(t, "TERMINATED", func(hb *isobarpb.CellHeartbeat) bool { return hb.GetState() == stateTerminated })
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := Run(context.Background(), Config{VLLMURL: "http://127.0.0.1:1/metrics"}, Deps{})
	if err == nil {
		t.Fatal("Run accepted a config without a cell id")
	}
}
