package scale

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/bench"
)

// cellSpec is one synthetic cell to run: its region, its position and its
// controller's address.
type cellSpec struct {
	Region      string `json:"region"`
	RegionIndex int    `json:"region_index"`
	Index       int    `json:"index"`
	Controller  string `json:"controller"`
}

// fleetStats are a fleet's senders' totals at one instant.
type fleetStats struct {
	heartbeats, bytes, streamErrors uint64
	lastError                       string
	// cpu is the senders' processes' CPU time (child processes only; 0 in
	// this process, where it cannot be told apart from the controllers').
	cpu time.Duration
	// rss is the senders' processes' resident set, summed (children only).
	rss uint64
}

// fleet runs a point's synthetic cells, in this process or in children.
// Its methods are safe for concurrent use; stop ends every cell (and every
// child process) and returns when they are gone.
type fleet interface {
	// start runs cells; ids are the cells' ids, in the order of cells.
	start(ctx context.Context, cells []cellSpec) (ids []string, err error)
	// probeSink is the address an RTT probe of the cell at endpoint goes
	// to, in the process that runs the cell; false: this process's own
	// sink.
	probeSink(endpoint string) (string, bool)
	// kill breaks the cell's stream and returns when its sockets were
	// closed (the death), by this fleet's clock.
	kill(ctx context.Context, id string) (time.Time, error)
	silence(ctx context.Context, id string) error
	revive(ctx context.Context, id string) error
	// up reports that every cell of ids has an acked stream.
	up(ctx context.Context, ids []string) (bool, error)
	stats(ctx context.Context) (fleetStats, error)
	stop()
}

// localFleet runs the cells in this process (Deps.CellProcess nil): their
// senders share the controllers' process and CPUs.
type localFleet struct {
	interval time.Duration
	seed     uint64
	clock    clockwork.Clock
	log      *slog.Logger
	counters bench.CellCounters

	mu     sync.Mutex
	cells  map[string]*bench.Cell
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newLocalFleet(interval time.Duration, seed uint64, clock clockwork.Clock, log *slog.Logger) *localFleet {
	return &localFleet{interval: interval, seed: seed, clock: clock, log: log, cells: map[string]*bench.Cell{}}
}

// newCells builds the cells of specs (nothing runs yet).
func newCells(specs []cellSpec, interval time.Duration, seed uint64, counters *bench.CellCounters, clock clockwork.Clock, log *slog.Logger) ([]*bench.Cell, error) {
	out := make([]*bench.Cell, 0, len(specs))
	for _, s := range specs {
		c, err := bench.NewCell(bench.CellConfig{
			Region: s.Region, RegionIndex: s.RegionIndex, Index: s.Index, Controller: s.Controller,
			HeartbeatInterval: interval, Seed: seed,
		}, counters, clock, log)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func (f *localFleet) start(ctx context.Context, specs []cellSpec) ([]string, error) {
	ids, _, err := f.startCells(ctx, specs)
	return ids, err
}

// startCells starts the cells of specs and returns their ids and
// endpoints, in the order of specs.
func (f *localFleet) startCells(ctx context.Context, specs []cellSpec) (ids, endpoints []string, err error) {
	cells, err := newCells(specs, f.interval, f.seed, &f.counters, f.clock, f.log)
	if err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cancel != nil {
		return nil, nil, fmt.Errorf("scale: cells already started")
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	ids, endpoints = make([]string, len(cells)), make([]string, len(cells))
	for i, c := range cells {
		ids[i], endpoints[i] = c.ID(), c.Endpoint()
		f.cells[c.ID()] = c
		f.wg.Go(func() { c.Run(cctx) })
	}
	return ids, endpoints, nil
}

// probeSink: the cells run here; their probes go to the point's sink.
func (f *localFleet) probeSink(string) (string, bool) { return "", false }

func (f *localFleet) cell(id string) (*bench.Cell, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cells[id]
	if c == nil {
		return nil, fmt.Errorf("scale: no cell %q", id)
	}
	return c, nil
}

// act runs one of a cell's signals; false from it is an error naming what.
func (f *localFleet) act(id, what string, do func(*bench.Cell) bool) error {
	c, err := f.cell(id)
	if err != nil {
		return err
	}
	if !do(c) {
		return fmt.Errorf("scale: cell %s: could not %s it (not up, or asked already)", id, what)
	}
	return nil
}

func (f *localFleet) kill(ctx context.Context, id string) (time.Time, error) {
	c, err := f.cell(id)
	if err != nil {
		return time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	at, err := c.KillAt(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("scale: cell %s: could not kill it: %w", id, err)
	}
	return at, nil
}

func (f *localFleet) silence(_ context.Context, id string) error {
	return f.act(id, "silence", (*bench.Cell).Silence)
}

func (f *localFleet) revive(_ context.Context, id string) error {
	return f.act(id, "revive", (*bench.Cell).Revive)
}

func (f *localFleet) up(_ context.Context, ids []string) (bool, error) {
	for _, id := range ids {
		c, err := f.cell(id)
		if err != nil {
			return false, err
		}
		if !c.Up() {
			return false, nil
		}
	}
	return true, nil
}

func (f *localFleet) stats(context.Context) (fleetStats, error) {
	return fleetStats{heartbeats: f.counters.Heartbeats(), bytes: f.counters.HeartbeatBytes(),
		streamErrors: f.counters.StreamErrors(), lastError: f.counters.LastError()}, nil
}

func (f *localFleet) stop() {
	f.mu.Lock()
	cancel := f.cancel
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	f.wg.Wait()
}
