package scale

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// cycleCost times one controller's control cycle on the cells of a live
// registry view, with the registry's own mapping (regional/cycle): score
// every cell and map it to the projection (cycle.Map), project weights
// (regional/projection), build the xDS state (cycle.BuildState) and
// validate and set the snapshot (regional/xds.Server.Push, on a server of
// its own so the live one's clients see nothing). Every cycle alternates
// each cell's signals and its measured speed (capacity class) so every
// weight moves and a full push happens (the worst case): even cycles score
// each cell's own signals at full speed, odd ones a saturated copy (queue,
// TTFT, KV cache and GPU pinned high) at a quarter speed, alternating per
// cell. Load signals alone no longer move weights (they carry eligibility
// and capacity), so the speed is what changes each band. A cycle whose
// push changed nothing is an error: it would time a no-op. It runs at most
// samples cycles within budget and returns each cycle's duration in ms:
// its wall time, and the CPU time of the thread that ran it (cpu; nil
// where the system has no thread clock).
//
// The wall time is what a cycle takes on this machine as it is, the other
// processes' and goroutines' turns on the cores included; on a machine the
// live fleet keeps busy it moves with that load. The CPU time is the
// cycle's own cost: the goroutine is locked to its thread for the run, so
// the thread's clock counts the cycle (and the mark assists its
// allocations owe the garbage collector), not its waits.
func cycleCost(ctx context.Context, region string, view *regional.View, samples int, budget time.Duration, clock clockwork.Clock) (wall, cpu []float64, err error) {
	if len(view.Cells) == 0 {
		return nil, nil, fmt.Errorf("scale: cycle: region %s has no cells", region)
	}
	xs, err := xds.NewServer(xds.Config{Region: region}, xds.Deps{Clock: clock})
	if err != nil {
		return nil, nil, fmt.Errorf("scale: cycle: %w", err)
	}
	defer xs.Stop()
	pcfg := projection.DefaultConfig()
	proj, err := projection.New(pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("scale: cycle: %w", err)
	}
	scfg := score.DefaultConfig()
	inputs := cycleInputs(view)
	// The relative speed of a cell's own and saturated cycles: full speed
	// and a quarter, two bands apart.
	cycleSpeed := [2]float64{1, 0.25}
	cells := make([]cycle.Cell, len(view.Cells))
	params := cycle.Params{Region: region, Zone: region}
	now := view.At
	version := ""
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_, threadClock := threadCPU()
	start := clock.Now()
	for i := 0; i < samples && ctx.Err() == nil && (i == 0 || clock.Since(start) < budget); i++ {
		now = now.Add(pcfg.MinInterval) // projection time, not wall time
		t0 := clock.Now()
		c0, _ := threadCPU()
		for j := range cells {
			cells[j] = inputs[j][(i+j)%2]
		}
		pcells, _ := cycle.Map(scfg, cells)
		for j := range pcells {
			pcells[j].Speed = cycleSpeed[(i+j)%2]
		}
		d := proj.Project(now, pcells)
		offer := cycle.BuildState(params, cycle.Weighted(view.Cells, d.Weights))
		v, err := xs.Push(offer.State)
		if err != nil {
			return wall, cpu, fmt.Errorf("scale: cycle: push: %w", err)
		}
		// Pushed, the offer is nobody's: the next is built in it, as the
		// registry builds in the states its publisher is done with.
		params.Reuse = offer
		wall = append(wall, ms(clock.Since(t0)))
		if threadClock {
			c1, _ := threadCPU()
			cpu = append(cpu, ms(c1-c0))
		}
		if v == version {
			return wall, cpu, fmt.Errorf("scale: cycle %d changed no weight (version %s): it would time a no-op", i, v)
		}
		version = v
	}
	return wall, cpu, nil
}

// cycleInputs is each cell of view as the registry maps it (cycle.FromView,
// without data-plane errors), and a saturated copy: queue, TTFT, KV cache
// and GPU pinned high.
func cycleInputs(view *regional.View) [][2]cycle.Cell {
	inputs := make([][2]cycle.Cell, len(view.Cells))
	for i, c := range view.Cells {
		own := cycle.FromView(*c, cycle.ErrorWindow{})
		hot := own
		r := &hot.Reading
		r.QueueDepth, r.Running, r.TTFTP95 = score.Some(64), score.Some(64), score.Some(5)
		r.KVCache, r.GPUUtil, r.SMActive, r.DRAMActive = score.Some(1), score.Some(1), score.Some(1), score.Some(1)
		inputs[i] = [2]cycle.Cell{own, hot}
	}
	return inputs
}
