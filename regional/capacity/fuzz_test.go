package capacity

import (
	"math"
	"testing"
	"time"
)

// Whatever a heartbeat carries, the estimate stays finite, positive and
// at most MaxRPS, and the confidence stays in [0,1].
func FuzzObserve(f *testing.F) {
	f.Add(1.0, 4.0, 0.0, 0.3, 0.6, int64(1e9))
	f.Add(math.NaN(), -1.0, math.Inf(1), 2.0, 1e9, int64(-5))
	f.Add(1e5, 1e6, 1e6, 1.0, 86400.0, int64(0))
	f.Add(1e-300, 0.0, 0.0, 1e-300, 1e-300, int64(1))
	f.Fuzz(func(t *testing.T, rate, running, waiting, kv, ttft float64, step int64) {
		e, err := New(Config{PriorRPS: 1.3})
		if err != nil {
			t.Fatal(err)
		}
		at := t0
		for i := range 50 {
			at = at.Add(time.Duration(step))
			s := Sample{RequestRate: &rate, Running: &running, Waiting: &waiting, KVUsage: &kv, TTFTP95: &ttft}
			if i%7 == 3 {
				s.TTFTP95 = nil
			}
			e.Observe("c", at, s)
			est := e.Estimate("c", at, 1)
			if !(est.RPS > 0) || est.RPS > e.cfg.MaxRPS || math.IsNaN(est.Confidence) || est.Confidence < 0 || est.Confidence > 1 {
				t.Fatalf("after %+v: estimate %+v", s, est)
			}
		}
	})
}
