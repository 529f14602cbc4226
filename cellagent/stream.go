package cellagent

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

type heartbeatStream = grpc.BidiStreamingClient[isobarpb.CellHeartbeat, isobarpb.HeartbeatAck]

// heartbeatLoop owns the controller stream: after the first scrape and a
// random phase it opens a stream, heartbeats on it, and reopens it with
// jittered exponential backoff when it ends. When ctx ends it sends the
// final TERMINATED heartbeat.
func (a *Agent) heartbeatLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return // nothing was ever sent: nothing to terminate
	case <-a.firstScrape:
	}
	if !a.waitClock(ctx, jitter(a.currentInterval())) {
		return
	}
	reconnect := reconnectPolicy(a.cfg)
	attempt := 0
	for {
		acked, finalSent := a.runStream(ctx)
		if ctx.Err() != nil {
			if !finalSent && a.seq.Load() > 0 {
				a.sendFinalOffline()
			}
			return
		}
		if acked {
			attempt = 0
		}
		d := reconnect.Delay(attempt)
		attempt++
		a.m.reconnects.Inc()
		a.log.Debug("reconnecting heartbeat stream", "backoff", d, "attempt", attempt)
		if !a.waitClock(ctx, d) {
			if a.seq.Load() > 0 {
				a.sendFinalOffline()
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
func (a *Agent) runStream(ctx context.Context) (acked, finalSent bool) {
	cc, err := grpc.NewClient(a.cfg.ControllerAddr, append(a.dialOpts, a.cfg.Keepalive.DialOption())...)
	if err != nil {
		a.log.Error("heartbeat client cannot be built", "err", err)
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
	wg.Go(func() { a.shutdownWatchdog(ctx, release, scancel) })

	stream, err := isobarpb.NewCellRegistryClient(cc).Heartbeat(sctx)
	if err != nil {
		a.log.Warn("heartbeat stream failed to open", "controller", a.cfg.ControllerAddr, "err", err)
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
			a.handleAck(ack)
		}
	})
	ticker := a.clock.NewTicker(a.currentInterval())
	defer ticker.Stop()
	// applyInterval resets the ticker when an ack changed the interval; it
	// runs before every send so that a heartbeat prompted by the same ack
	// already goes out on the new schedule.
	applyInterval := func() {
		select {
		case <-a.ivChanged:
			ticker.Reset(a.currentInterval())
		default:
		}
	}
	sendErr := a.send(stream, false)
	for sendErr == nil {
		select {
		case <-ctx.Done():
			a.finish(stream, recvDone)
			return gotAck.Load(), true
		case err := <-recvDone:
			a.streamEnded(err)
			return gotAck.Load(), false
		case <-ticker.Chan():
			applyInterval()
			sendErr = a.send(stream, false)
		case <-a.kick:
			applyInterval()
			sendErr = a.send(stream, false)
		case <-a.ivChanged:
			ticker.Reset(a.currentInterval())
		}
	}
	// A failed Send means the stream is over; its status comes from Recv.
	recvErr := <-recvDone
	if errors.Is(sendErr, io.EOF) {
		a.streamEnded(recvErr)
	} else {
		a.streamEnded(sendErr)
	}
	return gotAck.Load(), false
}

// shutdownWatchdog cancels the stream (scancel) ShutdownTimeout after ctx
// ends, unless released first. The deadline is real time: it bounds network
// I/O, not agent logic.
func (a *Agent) shutdownWatchdog(ctx context.Context, release <-chan struct{}, scancel context.CancelFunc) {
	select {
	case <-release:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(a.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-release:
	case <-t.C:
		a.log.Warn("controller did not take the final heartbeat in time; closing the stream", "timeout", a.cfg.ShutdownTimeout)
		scancel()
	}
}

func (a *Agent) streamEnded(err error) {
	if errors.Is(err, io.EOF) {
		a.log.Warn("heartbeat stream closed by controller")
		return
	}
	a.log.Warn("heartbeat stream broke", "err", err)
}

// finish writes the TERMINATED heartbeat, half-closes the stream and waits
// for the controller to end it (bounded by the shutdown watchdog).
func (a *Agent) finish(stream heartbeatStream, recvDone <-chan error) {
	if err := a.send(stream, true); err != nil {
		a.log.Warn("final heartbeat not sent", "err", err)
	}
	_ = stream.CloseSend()
	<-recvDone
}

// sendFinalOffline opens a stream just to deliver the TERMINATED heartbeat
// when the agent stops while disconnected. Best effort, bounded by
// ShutdownTimeout.
func (a *Agent) sendFinalOffline() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	cc, err := grpc.NewClient(a.cfg.ControllerAddr, a.dialOpts...)
	if err != nil {
		return
	}
	defer cc.Close()
	stream, err := isobarpb.NewCellRegistryClient(cc).Heartbeat(ctx)
	if err != nil {
		a.log.Warn("final heartbeat not sent", "err", err)
		return
	}
	if err := a.send(stream, true); err != nil {
		a.log.Warn("final heartbeat not sent", "err", err)
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
func (a *Agent) send(stream heartbeatStream, final bool) error {
	if !final && a.paused.Load() {
		return nil
	}
	// A pending kick is answered by this heartbeat: every state change that
	// kicked before now is in it.
	select {
	case <-a.kick:
	default:
	}
	hb := a.buildHeartbeat(final)
	if err := stream.Send(hb); err != nil {
		return err
	}
	a.m.heartbeatsSent.Inc()
	return nil
}

// buildHeartbeat renders the current state. The sequence is drawn under the
// state lock by the single sending goroutine, so it increases in send order.
func (a *Agent) buildHeartbeat(final bool) *isobarpb.CellHeartbeat {
	a.mu.Lock()
	defer a.mu.Unlock()
	if final && !a.st.stopping {
		a.st.stopping = true
		a.recomputeLocked()
	}
	c := a.st.capability
	capability := &isobarpb.Capability{Model: c.Model, MaxModelLen: c.MaxModelLen,
		PrefillTokensPerS: a.cfg.PrefillTokensPerSecond, MaxNumSeqs: a.cfg.MaxNumSeqs}
	return &isobarpb.CellHeartbeat{
		CellId:      a.cfg.CellID,
		Region:      a.cfg.Region,
		Endpoint:    a.cfg.Advertise,
		Capability:  capability,
		State:       a.st.lifecycle,
		Signals:     a.st.signals().Proto(),
		Vllm:        a.st.vllm.proto(),
		Dcgm:        a.st.dcgm.proto(),
		Sequence:    a.seq.Add(1),
		SentAt:      timestamppb.New(a.clock.Now()),
		Reason:      a.st.reason,
		Incarnation: a.incarnation,
	}
}

// handleAck applies a controller ack: a refusal is logged and counted, an
// interval is adopted (clamped to [MinInterval, MaxInterval]), DRAIN and
// UNDRAIN switch the reported state.
func (a *Agent) handleAck(ack *isobarpb.HeartbeatAck) {
	if e := ack.GetError(); e != "" {
		a.m.refused.Inc()
		a.log.Warn("controller refused heartbeat", "sequence", ack.GetSequence(), "err", truncate.Marked(e, 512, "..."))
	}
	if iv := ack.GetInterval(); iv != nil {
		if err := iv.CheckValid(); err != nil || iv.AsDuration() <= 0 {
			a.log.Warn("ignoring invalid heartbeat interval from controller", "interval", iv.String())
		} else {
			d := min(max(iv.AsDuration(), MinInterval), MaxInterval)
			if old := time.Duration(a.interval.Swap(int64(d))); old != d {
				a.log.Info("heartbeat interval adopted", "from", old, "to", d, "asked", iv.AsDuration())
				select {
				case a.ivChanged <- struct{}{}:
				default:
				}
			}
		}
	}
	if len(ack.GetCommands()) == 0 {
		return
	}
	a.mu.Lock()
	for _, c := range ack.GetCommands() {
		switch c {
		case isobarpb.Command_COMMAND_DRAIN:
			a.st.draining = true
			a.m.commands.WithLabelValues("drain").Inc()
		case isobarpb.Command_COMMAND_UNDRAIN:
			a.st.draining = false
			a.m.commands.WithLabelValues("undrain").Inc()
		default:
			a.m.commands.WithLabelValues("unknown").Inc()
			a.log.Warn("ignoring unknown command from controller", "command", int32(c))
		}
	}
	kick := a.recomputeLocked()
	a.mu.Unlock()
	if kick {
		a.kickHeartbeat()
	}
}
