package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
)

// This file exports the soak's synthetic cell to other harnesses (bench/scale):
// the same real CellRegistry.Heartbeat stream over its own TCP connection,
// the same signals, the same abrupt death; only what happens after a death
// differs: the soak's cell comes back on its own, a Cell stays dead until
// Revive.

// CellModel is the model every synthetic cell serves.
const CellModel = soakModel

// CellConfig shapes one synthetic cell.
type CellConfig struct {
	// Region is the cell's region; RegionIndex its position among the
	// harness's regions (it keeps the fake endpoints of different regions
	// apart).
	Region      string
	RegionIndex int
	// Index of the cell in its region, 0 to 62,499: the cell id is
	// "<region>-cell-<index>" and its endpoint a distinct fake address.
	Index int
	// Controller is the regional controller's gRPC address. Required.
	Controller string
	// HeartbeatInterval between heartbeats. Default 500 ms.
	HeartbeatInterval time.Duration
	// Seed of the synthetic signals and of the start phase. Default 1.
	Seed uint64
}

// CellCounters are totals shared by a set of cells; safe for concurrent
// use. The zero value is ready.
type CellCounters struct{ s cellStats }

// Heartbeats counts heartbeats sent.
func (c *CellCounters) Heartbeats() uint64 { return c.s.heartbeats.Load() }

// HeartbeatBytes sums the marshalled size (proto.Size) of the heartbeats
// sent: the protobuf payload, without gRPC or HTTP/2 framing.
func (c *CellCounters) HeartbeatBytes() uint64 { return c.s.bytes.Load() }

// Kills counts streams cut by Kill.
func (c *CellCounters) Kills() uint64 { return c.s.kills.Load() }

// StreamErrors counts streams that ended without a Kill plus heartbeats
// the controller refused.
func (c *CellCounters) StreamErrors() uint64 { return c.s.streamErrors.Load() + c.s.ackErrors.Load() }

// LastError is the last stream error or refusal seen ("" when none).
func (c *CellCounters) LastError() string {
	if p := c.s.lastError.Load(); p != nil {
		return *p
	}
	return ""
}

// Cell is one synthetic cell. Run owns its stream; Kill and Revive only
// signal Run through one-slot channels, so they are safe from any
// goroutine.
type Cell struct {
	s      *synthCell
	revive chan struct{}
}

// NewCell builds a cell; nothing runs until Run. A nil clock is the real
// clock, a nil logger discards.
func NewCell(cfg CellConfig, counters *CellCounters, clock clockwork.Clock, log *slog.Logger) (*Cell, error) {
	if cfg.Controller == "" {
		return nil, fmt.Errorf("%w: cell: controller address required", ErrInvalidConfig)
	}
	if cfg.Index < 0 || cfg.Index >= 250*250 || cfg.RegionIndex < 0 || cfg.RegionIndex > 253 {
		return nil, fmt.Errorf("%w: cell: index %d in region %d out of range", ErrInvalidConfig, cfg.Index, cfg.RegionIndex)
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 500 * time.Millisecond
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sc := SoakConfig{Seed: cfg.Seed, HeartbeatInterval: cfg.HeartbeatInterval}
	return &Cell{s: newSynthCell(cfg.Region, cfg.RegionIndex, cfg.Index, cfg.Controller, sc, clock, log, &counters.s),
		revive: make(chan struct{}, 1)}, nil
}

// ID is the cell id.
func (c *Cell) ID() string { return c.s.id }

// Endpoint is the fake endpoint address the cell advertises.
func (c *Cell) Endpoint() string { return c.s.endpoint }

// Up reports that a stream is open and the controller acked it.
func (c *Cell) Up() bool { return c.s.up.Load() }

// Kill asks the cell to die like a SIGKILLed agent: its TCP connection is
// closed under the stream, with no Terminated heartbeat. False when it is
// not up or already asked.
func (c *Cell) Kill() bool { return c.s.Kill() }

// KillAt kills the cell like Kill and returns when its sockets were
// closed, by the cell's clock: the moment of the death, after the cell's
// goroutine took the ask (which, on a busy machine, can be long after
// the call). An error when it is not up, already asked, or ctx ends
// before the close.
func (c *Cell) KillAt(ctx context.Context) (time.Time, error) {
	reply := make(chan time.Time, 1)
	if !c.s.askKill(reply) {
		return time.Time{}, errors.New("bench: not up, or asked already")
	}
	select {
	case at := <-reply:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// Silence asks the cell to stop sending heartbeats while its stream stays
// open (a hung agent whose connection is up): the controller's TTL, not a
// broken stream, must remove it. Kill ends the silent stream. False when it
// is not up or already asked.
func (c *Cell) Silence() bool {
	if !c.s.up.Load() {
		return false
	}
	select {
	case c.s.silence <- struct{}{}:
		return true
	default:
		return false
	}
}

// Revive asks a killed cell to come back on a new stream (new
// incarnation, sequence from 1). False when a revival is already pending.
func (c *Cell) Revive() bool {
	select {
	case c.revive <- struct{}{}:
		return true
	default:
		return false
	}
}

// Run keeps the cell's stream until ctx ends, then sends a final
// Terminated heartbeat and closes it. After a Kill it waits for Revive;
// after an unexpected stream end, one heartbeat interval. Run returns only
// when the stream and its goroutines are gone.
func (c *Cell) Run(ctx context.Context) {
	s := c.s
	if !s.wait(ctx, time.Duration(s.rng.Int64N(int64(s.interval)))) {
		return
	}
	returning := false
	for incarnation := 1; ctx.Err() == nil; incarnation++ {
		killed, err := s.session(ctx, incarnation, returning)
		if ctx.Err() != nil {
			return
		}
		if killed {
			returning = true
			select {
			case <-ctx.Done():
				return
			case <-c.revive:
			}
			continue
		}
		returning = false
		s.stats.streamErrors.Add(1)
		s.stats.noteError(fmt.Sprintf("%s: stream ended: %v", s.id, err))
		if !s.wait(ctx, s.interval) {
			return
		}
	}
}
