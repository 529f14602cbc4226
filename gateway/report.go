package gateway

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Bounds of one DataPlaneReport (dataplane.proto). What does not fit waits
// for the next report.
const (
	maxReportEndpoints = 4096
	maxReportModels    = 64
	// maxReportSlices bounds a model's slices (dataplane.proto: at most
	// 64). Pinned slices beyond maxReportSlices - reqclass.Count are
	// counted in their criticality's unpinned slice (and in
	// isobar_gateway_request_class_anomalies_total{reason="pooled_slice"}),
	// so the unpinned ones always fit and the slices always add up to the
	// model's requests.
	maxReportSlices = 64
)

type epKey struct{ cell, addr string }

type epCounts struct{ requests, errors, rejected uint64 }

// sliceKey is one slice of a model's demand: criticality and residency
// set.
type sliceKey struct {
	crit reqclass.Criticality
	set  string
}

type sliceCounts struct{ requests, shed uint64 }

type demandCounts struct {
	requests, shed uint64
	slices         map[sliceKey]*sliceCounts
}

// slice is the counts of c's slice, pooled into the unpinned slice of its
// criticality past the bound.
func (d *demandCounts) slice(c *classOf, pooled func()) *sliceCounts {
	k := sliceKey{reqclass.Standard, ""}
	if c != nil {
		k = sliceKey{c.crit, c.set}
	}
	if d.slices == nil {
		d.slices = make(map[sliceKey]*sliceCounts)
	}
	x := d.slices[k]
	if x == nil && k.set != "" && len(d.slices) >= maxReportSlices-reqclass.Count {
		pooled()
		k.set = ""
		x = d.slices[k]
	}
	if x == nil {
		x = &sliceCounts{}
		d.slices[k] = x
	}
	return x
}

// add merges o into d.
func (d *demandCounts) add(o demandCounts) {
	d.requests += o.requests
	d.shed += o.shed
	for k, v := range o.slices {
		x := d.slice(&classOf{crit: k.crit, set: k.set}, func() {})
		x.requests += v.requests
		x.shed += v.shed
	}
}

// proto is the model's demand on the wire, slices sorted by criticality
// then set.
func (d *demandCounts) proto(model string) *isobarpb.ModelDemand {
	md := &isobarpb.ModelDemand{Model: model, Requests: d.requests, Shed: d.shed}
	keys := make([]sliceKey, 0, len(d.slices))
	for k := range d.slices {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b sliceKey) int {
		if a.crit != b.crit {
			return int(a.crit) - int(b.crit)
		}
		return strings.Compare(a.set, b.set)
	})
	for _, k := range keys {
		v := d.slices[k]
		md.Slices = append(md.Slices, &isobarpb.SliceDemand{Criticality: k.crit.Proto(), Residency: k.set, Requests: v.requests, Shed: v.shed})
	}
	return md
}

// errFlushed ends a report session after the final report.
var errFlushed = errors.New("gateway: final report sent")

// reporter accumulates per-endpoint and per-model deltas and streams them
// to the regional controller (DataPlane.Report) every interval. Deltas that
// could not be sent roll into the next report. run is its only goroutine;
// the add methods are safe from any goroutine.
type reporter struct {
	node, region string
	interval     time.Duration
	min, max     time.Duration
	clock        clockwork.Clock
	log          *slog.Logger
	m            *metrics

	mu     sync.Mutex
	eps    map[epKey]*epCounts
	demand map[string]*demandCounts
	lastAt time.Time

	flush chan struct{} // closed to send a final report and return
}

func newReporter(cfg Config, clock clockwork.Clock, log *slog.Logger, m *metrics) *reporter {
	return &reporter{
		node: cfg.NodeID, region: cfg.Region, interval: cfg.ReportInterval, min: cfg.MinBackoff, max: cfg.MaxBackoff,
		clock: clock, log: log, m: m,
		eps: make(map[epKey]*epCounts), demand: make(map[string]*demandCounts), lastAt: clock.Now(),
		flush: make(chan struct{}),
	}
}

// addEndpoint counts one attempt to h: an error (connect failure, reset,
// timeout, 5xx) or a rejection (4xx).
func (r *reporter) addEndpoint(h *hostRT, isErr, rejected bool) {
	k := epKey{h.ep.Cell, h.ep.Address}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.eps[k]
	if c == nil {
		c = &epCounts{}
		r.eps[k] = c
	}
	c.requests++
	if isErr {
		c.errors++
	}
	if rejected {
		c.rejected++
	}
}

// addDemand counts one client-originated request for model, of class c
// (nil: standard, unpinned).
func (r *reporter) addDemand(model string, c *classOf) {
	r.updateDemand(model, func(d *demandCounts) {
		d.requests++
		d.slice(c, r.pooled).requests++
	})
}

// addShed counts one client-originated request for model, of class c,
// refused with 429.
func (r *reporter) addShed(model string, c *classOf) {
	r.updateDemand(model, func(d *demandCounts) {
		d.shed++
		d.slice(c, r.pooled).shed++
	})
}

func (r *reporter) pooled() { r.m.class.anomalies.WithLabelValues(classPooledSlice).Inc() }

func (r *reporter) updateDemand(model string, fn func(*demandCounts)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.demand[model]
	if d == nil {
		d = &demandCounts{}
		r.demand[model] = d
	}
	fn(d)
}

// take builds a report of the deltas since the last one and clears what it
// holds; undo puts them back if the report could not be sent.
func (r *reporter) take() (rep *isobarpb.DataPlaneReport, undo func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	rep = &isobarpb.DataPlaneReport{
		Node: r.node, Region: r.region, At: timestamppb.New(now),
		IntervalSeconds: max(now.Sub(r.lastAt).Seconds(), 0),
	}
	keys := make([]epKey, 0, len(r.eps))
	for k := range r.eps {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b epKey) int {
		if a.cell != b.cell {
			if a.cell < b.cell {
				return -1
			}
			return 1
		}
		if a.addr < b.addr {
			return -1
		}
		if a.addr > b.addr {
			return 1
		}
		return 0
	})
	takenEps := make(map[epKey]epCounts, min(len(keys), maxReportEndpoints))
	for _, k := range keys[:min(len(keys), maxReportEndpoints)] {
		c := r.eps[k]
		rep.Endpoints = append(rep.Endpoints, &isobarpb.EndpointStats{
			CellId: k.cell, Address: k.addr, Requests: c.requests, Errors: c.errors, Rejected: c.rejected,
		})
		takenEps[k] = *c
		delete(r.eps, k)
	}
	models := make([]string, 0, len(r.demand))
	for m := range r.demand {
		models = append(models, m)
	}
	slices.Sort(models)
	takenDemand := make(map[string]demandCounts, min(len(models), maxReportModels))
	for _, m := range models[:min(len(models), maxReportModels)] {
		d := r.demand[m]
		rep.Demand = append(rep.Demand, d.proto(m))
		takenDemand[m] = *d
		delete(r.demand, m)
	}
	prevAt := r.lastAt
	r.lastAt = now
	return rep, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for k, c := range takenEps {
			x := r.eps[k]
			if x == nil {
				x = &epCounts{}
				r.eps[k] = x
			}
			x.requests += c.requests
			x.errors += c.errors
			x.rejected += c.rejected
		}
		for m, d := range takenDemand {
			x := r.demand[m]
			if x == nil {
				x = &demandCounts{}
				r.demand[m] = x
			}
			x.add(d)
		}
		r.lastAt = prevAt
	}
}

// run streams reports until ctx ends or, after flush is closed, the final
// report has been sent (or could not be).
func (r *reporter) run(ctx context.Context, conn grpc.ClientConnInterface) {
	bo := backoff.New(backoff.Policy{Min: r.min, Max: r.max, Jitter: backoff.Full})
	for ctx.Err() == nil {
		sent, err := r.session(ctx, conn)
		if errors.Is(err, errFlushed) || ctx.Err() != nil {
			return
		}
		if sent {
			bo.Reset()
		}
		if status.Code(err) == codes.Unimplemented {
			bo.Saturate()
		}
		wait := bo.Next()
		r.log.Info("report stream ended; reconnecting", "err", err, "retry_in", wait)
		t := r.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.flush:
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

// session runs one report stream; sent reports whether a report went out.
func (r *reporter) session(ctx context.Context, conn grpc.ClientConnInterface) (sent bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	stream, err := isobarpb.NewDataPlaneClient(conn).Report(sctx)
	if err != nil {
		return false, err
	}
	recvErr := make(chan error, 1)
	wg.Go(func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if msg := ack.GetError(); msg != "" {
				r.m.reports.WithLabelValues("refused").Inc()
				r.log.Warn("controller refused a report", "err", truncate.String(msg, 1024))
			}
		}
	})
	send := func() error {
		rep, undo := r.take()
		if err := stream.Send(rep); err != nil {
			undo()
			r.m.reports.WithLabelValues("failed").Inc()
			return err
		}
		sent = true
		r.m.reports.WithLabelValues("sent").Inc()
		return nil
	}
	tick := r.clock.NewTicker(r.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case err := <-recvErr:
			return sent, err
		case <-r.flush:
			if err := send(); err != nil {
				return sent, err
			}
			// Half-close and let the controller read the report: wait
			// for it to end the stream, at most one interval.
			_ = stream.CloseSend()
			t := r.clock.NewTimer(r.interval)
			select {
			case <-recvErr:
			case <-t.Chan():
			case <-ctx.Done():
			}
			t.Stop()
			return sent, errFlushed
		case <-tick.Chan():
			if err := send(); err != nil {
				return sent, err
			}
		}
	}
}
