package capacity_test

import (
	"fmt"
	"time"

	"github.com/isobar-mesh/isobar/regional/capacity"
)

// A cell starts at the prior; after a while at its SLO (TTFT P95 1.5 s,
// 3 rps completed) its capacity is what it serves there.
func Example() {
	e, err := capacity.New(capacity.Config{PriorRPS: 1.3})
	if err != nil {
		panic(err)
	}
	f := func(v float64) *float64 { return &v }
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	fmt.Printf("cold: %.2f rps, confidence %.2f\n", e.Estimate("cell-1", start, 1).RPS, e.Estimate("cell-1", start, 1).Confidence)

	e.Observe("cell-1", start, capacity.Sample{RequestRate: f(0.1), Running: f(0.5), TTFTP95: f(0.4)})
	at := start
	for i := 1; i <= 600; i++ {
		at = start.Add(time.Duration(i) * time.Second)
		e.Observe("cell-1", at, capacity.Sample{RequestRate: f(3), Running: f(16), Waiting: f(0), TTFTP95: f(1.5)})
	}
	est := e.Estimate("cell-1", at, 1)
	fmt.Printf("at the SLO: %.2f rps, confidence %.2f\n", est.RPS, est.Confidence)
	// Output:
	// cold: 1.30 rps, confidence 0.00
	// at the SLO: 3.00 rps, confidence 1.00
}
