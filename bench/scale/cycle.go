package scale

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// cycleCost times one controller's control cycle on the cells of a live
// registry view: score every cell (regional/score), project weights
// (regional/projection) and build, validate and set the xDS snapshot
// (regional/xds.Server.Push, on a server of its own so the live one's
// clients see nothing). Every cycle alternates each cell's signals and
// its measured speed (capacity class) so every weight moves and a full
// push happens (the worst case): even cycles score each cell's own signals
// at full speed, odd ones a saturated copy (queue, TTFT, KV cache and GPU
// pinned high) at a quarter speed, alternating per cell. Load signals
// alone no longer move weights (they carry eligibility and capacity), so
// the speed is what changes each band. A cycle whose push changed nothing
// is an error: it would time a no-op. It runs at most samples cycles within budget
// and returns each cycle's duration in ms.
//
// The mapping from a cell to the scorer's input mirrors the registry's:
// application signals count only with a healthy vLLM source, hardware
// signals only with a healthy DCGM source, RTT from the controller's probes.
func cycleCost(ctx context.Context, region string, view *regional.View, samples int, budget time.Duration, clock clockwork.Clock) ([]float64, error) {
	if len(view.Cells) == 0 {
		return nil, fmt.Errorf("scale: cycle: region %s has no cells", region)
	}
	xs, err := xds.NewServer(xds.Config{Region: region}, xds.Deps{Clock: clock})
	if err != nil {
		return nil, fmt.Errorf("scale: cycle: %w", err)
	}
	defer xs.Stop()
	pcfg := projection.DefaultConfig()
	proj, err := projection.New(pcfg)
	if err != nil {
		return nil, fmt.Errorf("scale: cycle: %w", err)
	}
	scfg := score.DefaultConfig()
	type target struct {
		host string
		port uint32
	}
	inputs := make([][2]score.Input, len(view.Cells))
	targets := make([]target, len(view.Cells))
	for i, c := range view.Cells {
		own := score.InputFrom(c.ScoreReading())
		hot := own
		hot.QueueDepth, hot.Running, hot.TTFTP95 = score.Some(64), score.Some(64), score.Some(5)
		hot.KVCache, hot.GPUUtil, hot.SMActive, hot.DRAMActive = score.Some(1), score.Some(1), score.Some(1), score.Some(1)
		inputs[i] = [2]score.Input{own, hot}
		host, portStr, err := net.SplitHostPort(c.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("scale: cycle: cell %s endpoint %q: %w", c.ID, c.Endpoint, err)
		}
		port, _ := strconv.ParseUint(portStr, 10, 32)
		targets[i] = target{host, uint32(port)}
	}
	// The relative speed of a cell's own and saturated cycles: full speed
	// and a quarter, two bands apart.
	cycleSpeed := [2]float64{1, 0.25}
	pcells := make([]projection.Cell, len(view.Cells))
	now := view.At
	version := ""
	var out []float64
	start := clock.Now()
	for i := 0; i < samples && ctx.Err() == nil && (i == 0 || clock.Since(start) < budget); i++ {
		now = now.Add(pcfg.MinInterval) // projection time, not wall time
		t0 := clock.Now()
		for j, c := range view.Cells {
			k := (i + j) % 2
			res := scfg.Score(inputs[j][k])
			pcells[j] = projection.Cell{ID: c.ID, State: c.State, Pressure: res.Pressure, Speed: cycleSpeed[k]}
			if s := c.Signals; c.VLLM.OK && s != nil && s.ErrorRate != nil {
				pcells[j].ErrorRate, pcells[j].ErrorOK, pcells[j].ErrorRequests = *s.ErrorRate, true, s.GetWindowRequests()
			}
		}
		d := proj.Project(now, pcells)
		loc := xds.Locality{Region: region, Zone: region, Weight: 1000}
		for j, w := range d.Weights {
			if w.Published == 0 {
				continue
			}
			c := view.Cells[j]
			loc.Endpoints = append(loc.Endpoints, xds.Endpoint{CellID: c.ID, Host: targets[j].host, Port: targets[j].port,
				Weight: w.Published, MaxModelLen: c.MaxModelLen})
		}
		st := xds.State{Models: []xds.Model{{Name: view.Cells[0].Model, Localities: []xds.Locality{loc}}}}
		v, err := xs.Push(st)
		if err != nil {
			return out, fmt.Errorf("scale: cycle: push: %w", err)
		}
		out = append(out, ms(clock.Since(t0)))
		if v == version {
			return out, fmt.Errorf("scale: cycle %d changed no weight (version %s): it would time a no-op", i, v)
		}
		version = v
	}
	return out, nil
}
