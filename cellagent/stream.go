package cellagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

type heartbeatStream = grpc.BidiStreamingClient[isobarpb.CellHeartbeat, isobarpb.HeartbeatAck]

// reportSource is the state the streamer reports and the controller's
// commands change.
type reportSource interface {
	report(final bool) cellReport
	applyCommands(cmds []isobarpb.Command)
	scraped() <-chan struct{}
}

var _ reportSource = (*scraper)(nil)

// streamer owns the heartbeat stream to the controller: the stream's
// lifecycle and reconnects, the sequence, the interval the controller
// asked for, and pausing.
//
// Concurrency: heartbeatLoop is its goroutine and the only sender; each
// stream has a receive goroutine (handleAck) joined before runStream
// returns. State shared with them and with the scraper is atomics and
// 1-buffered channels; the cell's state is the scraper's, read through
// reportSource.
type streamer struct {
	cfg         Config
	clock       clockwork.Clock
	log         *slog.Logger
	m           *metrics
	state       reportSource
	dialOpts    []grpc.DialOption
	incarnation string

	seq      atomic.Uint64
	interval atomic.Int64 // time.Duration of the heartbeat interval
	paused   atomic.Bool

	kick      chan struct{} // send a heartbeat now (1-buffered, coalescing)
	ivChanged chan struct{} // the heartbeat interval changed (1-buffered)
}

// pause withholds heartbeats (true) or resumes them (false); see
// Agent.Pause.
func (h *streamer) pause(p bool) {
	if h.paused.Swap(p) == p {
		return
	}
	h.log.Info("heartbeats paused", "paused", p)
	if !p {
		h.kickHeartbeat()
	}
}

// heartbeatLoop owns the controller stream: after the first scrape and a
// random phase it opens a stream, heartbeats on it, and reopens it with
// jittered exponential backoff when it ends. When ctx ends it sends the
// final TERMINATED heartbeat.
func (h *streamer) heartbeatLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return // nothing was ever sent: nothing to terminate
	case <-h.state.scraped():
	}
	if !h.waitClock(ctx, jitter(h.currentInterval())) {
		return
	}
	reconnect := reconnectPolicy(h.cfg)
	attempt := 0
	for {
		acked, finalSent := h.runStream(ctx)
		if ctx.Err() != nil {
			if !finalSent && h.seq.Load() > 0 {
				h.sendFinalOffline()
			}
			return
		}
		if acked {
			attempt = 0
		}
		d := reconnect.Delay(attempt)
		attempt++
		h.m.reconnects.Inc()
		h.log.Debug("reconnecting heartbeat stream", "backoff", d, "attempt", attempt)
		if !h.waitClock(ctx, d) {
			if h.seq.Load() > 0 {
				h.sendFinalOffline()
			}
			return
		}
	}
}

// reconnectPolicy is the wait before reconnect attempt k (0 for the
// first after a stream that was answered): full jitter, uniform in
// [0, min(BackoffMax, BackoffMin·2^k)). The bound matters after a
// controller restart: however long the controller was away, an agent is
// back within BackoffMax (2 s by default) of it listening again, so a
// fleet's agents reconnect spread over at most that, never a 5 s tail;
// the controller holds its first push for TTL + BackoffMax
// (regional.WarmStartConfig), so nobody is pushed out for being late.
func reconnectPolicy(c Config) backoff.Policy {
	return backoff.Policy{Min: c.BackoffMin, Max: c.BackoffMax, Jitter: backoff.Full}
}

// runStream runs one heartbeat stream until it breaks or ctx ends. acked
// reports whether the controller answered on it (the backoff then resets);
// finalSent whether the TERMINATED heartbeat was written on it.
//
// The stream's context outlives ctx by the final heartbeat. A watchdog
// cancels it ShutdownTimeout after ctx ends, so that neither a controller
// that stopped reading (Send blocked by flow control) nor one that never
// answers the connection can hold Stop.
func (h *streamer) runStream(ctx context.Context) (acked, finalSent bool) {
	cc, err := grpc.NewClient(h.cfg.ControllerAddr, append(h.dialOpts, h.cfg.Keepalive.DialOption())...)
	if err != nil {
		h.log.Error("heartbeat client cannot be built", "err", err)
		return false, false
	}
	defer cc.Close()
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	release := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(release)
		scancel()
		wg.Wait()
	}()
	wg.Go(func() { h.shutdownWatchdog(ctx, release, scancel) })

	stream, err := isobarpb.NewCellRegistryClient(cc).Heartbeat(sctx)
	if err != nil {
		h.log.Warn("heartbeat stream failed to open", "controller", h.cfg.ControllerAddr, "err", err)
		return false, false
	}
	var gotAck atomic.Bool
	recvDone := make(chan error, 1)
	wg.Go(func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			gotAck.Store(true)
			h.handleAck(ack)
		}
	})
	ticker := h.clock.NewTicker(h.currentInterval())
	defer ticker.Stop()
	// applyInterval resets the ticker when an ack changed the interval; it
	// runs before every send so that a heartbeat prompted by the same ack
	// already goes out on the new schedule.
	applyInterval := func() {
		select {
		case <-h.ivChanged:
			ticker.Reset(h.currentInterval())
		default:
		}
	}
	sendErr := h.send(stream, false)
	for sendErr == nil {
		select {
		case <-ctx.Done():
			h.finish(stream, recvDone)
			return gotAck.Load(), true
		case err := <-recvDone:
			h.streamEnded(err)
			return gotAck.Load(), false
		case <-ticker.Chan():
			applyInterval()
			sendErr = h.send(stream, false)
		case <-h.kick:
			applyInterval()
			sendErr = h.send(stream, false)
		case <-h.ivChanged:
			ticker.Reset(h.currentInterval())
		}
	}
	// A failed Send means the stream is over; its status comes from Recv.
	recvErr := <-recvDone
	if errors.Is(sendErr, io.EOF) {
		h.streamEnded(recvErr)
	} else {
		h.streamEnded(sendErr)
	}
	return gotAck.Load(), false
}

// shutdownWatchdog cancels the stream (scancel) ShutdownTimeout after ctx
// ends, unless released first. The deadline is real time: it bounds network
// I/O, not agent logic.
func (h *streamer) shutdownWatchdog(ctx context.Context, release <-chan struct{}, scancel context.CancelFunc) {
	select {
	case <-release:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(h.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-release:
	case <-t.C:
		h.log.Warn("controller did not take the final heartbeat in time; closing the stream", "timeout", h.cfg.ShutdownTimeout)
		scancel()
	}
}

func (h *streamer) streamEnded(err error) {
	if errors.Is(err, io.EOF) {
		h.log.Warn("heartbeat stream closed by controller")
		return
	}
	h.log.Warn("heartbeat stream broke", "err", err)
}

// finish writes the TERMINATED heartbeat, half-closes the stream and waits
// for the controller to end it (bounded by the shutdown watchdog).
func (h *streamer) finish(stream heartbeatStream, recvDone <-chan error) {
	if err := h.send(stream, true); err != nil {
		h.log.Warn("final heartbeat not sent", "err", err)
	}
	_ = stream.CloseSend()
	<-recvDone
}

// sendFinalOffline opens a stream just to deliver the TERMINATED heartbeat
// when the agent stops while disconnected. Best effort, bounded by
// ShutdownTimeout.
func (h *streamer) sendFinalOffline() {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ShutdownTimeout)
	defer cancel()
	cc, err := grpc.NewClient(h.cfg.ControllerAddr, h.dialOpts...)
	if err != nil {
		return
	}
	defer cc.Close()
	stream, err := isobarpb.NewCellRegistryClient(cc).Heartbeat(ctx)
	if err != nil {
		h.log.Warn("final heartbeat not sent", "err", err)
		return
	}
	if err := h.send(stream, true); err != nil {
		h.log.Warn("final heartbeat not sent", "err", err)
		return
	}
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}

// send writes one heartbeat; while paused only the final one goes out.
func (h *streamer) send(stream heartbeatStream, final bool) error {
	if !final && h.paused.Load() {
		return nil
	}
	// A pending kick is answered by this heartbeat: every state change that
	// kicked before now is in it.
	select {
	case <-h.kick:
	default:
	}
	hb := h.buildHeartbeat(final)
	if err := stream.Send(hb); err != nil {
		return err
	}
	h.m.heartbeatsSent.Inc()
	return nil
}

// buildHeartbeat renders the current state. The single sending goroutine
// draws the sequence, so it increases in send order.
func (h *streamer) buildHeartbeat(final bool) *isobarpb.CellHeartbeat {
	r := h.state.report(final)
	c := r.capability
	capability := &isobarpb.Capability{Model: c.Model, MaxModelLen: c.MaxModelLen,
		PrefillTokensPerS: h.cfg.PrefillTokensPerSecond, MaxNumSeqs: h.cfg.MaxNumSeqs}
	return &isobarpb.CellHeartbeat{
		CellId:      h.cfg.CellID,
		Region:      h.cfg.Region,
		Endpoint:    h.cfg.Advertise,
		Capability:  capability,
		State:       r.lifecycle,
		Signals:     r.signals.Proto(),
		Vllm:        r.vllm.proto(),
		Dcgm:        r.dcgm.proto(),
		Sequence:    h.seq.Add(1),
		SentAt:      timestamppb.New(h.clock.Now()),
		Reason:      r.reason,
		Incarnation: h.incarnation,
	}
}

// handleAck applies a controller ack: a refusal is logged and counted, an
// interval is adopted (clamped to [MinInterval, MaxInterval]), DRAIN and
// UNDRAIN switch the reported state.
func (h *streamer) handleAck(ack *isobarpb.HeartbeatAck) {
	if e := ack.GetError(); e != "" {
		h.m.refused.Inc()
		h.log.Warn("controller refused heartbeat", "sequence", ack.GetSequence(), "err", truncate.Marked(e, 512, "..."))
	}
	if iv := ack.GetInterval(); iv != nil {
		if err := iv.CheckValid(); err != nil || iv.AsDuration() <= 0 {
			h.log.Warn("ignoring invalid heartbeat interval from controller", "interval", iv.String())
		} else {
			d := min(max(iv.AsDuration(), MinInterval), MaxInterval)
			if old := time.Duration(h.interval.Swap(int64(d))); old != d {
				h.log.Info("heartbeat interval adopted", "from", old, "to", d, "asked", iv.AsDuration())
				select {
				case h.ivChanged <- struct{}{}:
				default:
				}
			}
		}
	}
	if len(ack.GetCommands()) == 0 {
		return
	}
	h.state.applyCommands(ack.GetCommands())
}

func (h *streamer) currentInterval() time.Duration { return time.Duration(h.interval.Load()) }

func (h *streamer) kickHeartbeat() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// waitClock waits d on the agent's clock; false if ctx ended first.
func (h *streamer) waitClock(ctx context.Context, d time.Duration) bool {
	t := h.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}
