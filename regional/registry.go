package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// Registry errors; test with errors.Is.
var (
	// ErrBusy: the inbox is full; Submit did not take the message.
	ErrBusy = errors.New("regional: registry busy")
	// ErrStopped: the registry is not running.
	ErrStopped = errors.New("regional: registry stopped")
	// ErrUnknownCell: no cell with that id is registered.
	ErrUnknownCell = errors.New("regional: unknown cell")
)

// message is one item of the registry inbox. Exactly one field is set.
type message struct {
	hb     *isobarpb.CellHeartbeat
	probes []probeResult
	drain  *drainRequest
	routes *RouteTable
	report *isobarpb.DataPlaneReport
	lost   *streamLoss
	util   map[string]float64 // utilisation per model (retrybudget.go)
	pool   map[string]float64 // pool utilisation per model (retrybudget.go)
}

// streamLoss says that the heartbeat stream which delivered a cell's
// heartbeat (incarnation, sequence) ended without a Terminated report.
type streamLoss struct {
	id          string
	incarnation string
	sequence    uint64
	// reported is when the stream's handler reported the loss.
	reported time.Time
}

type drainRequest struct {
	id    string
	drain bool
	reply chan error // buffered, 1
}

// probeResult is one RTT/jitter estimate from the prober.
type probeResult struct {
	id          string
	rtt, jitter time.Duration
	ok          bool
}

// cell is the registry's record of one cell. Owned by the registry loop.
type cell struct {
	// The fields every cycle reads of every cell come first, together
	// (cellViews): at 10,000 cells each is a cache miss otherwise.
	id string
	// pub is the cell's view in the last published View (never modified:
	// Views share it), built from pubIn; pubCell is the mapping's input
	// made of it with the data plane window it was scored with (pubDP,
	// also kept here). A cycle whose viewIn and window are unchanged
	// reuses all three.
	pub *CellView
	viewIn
	pubIn viewIn
	pubDP cycle.ErrorWindow

	pubCell cycle.Cell
	// touched: viewIn may have changed since the last cycle read it
	// (touched.go); pos is the cell's position in Registry.order.
	touched bool
	pos     int
	// clamped: the last heartbeat carried signals beyond their bounds.
	clamped bool
	// leftLBAt is when the cell stopped being eligible for traffic; the
	// failover histogram measures from here to the push that removed it.
	leftLBAt time.Time
	// offered: the cell was in the last state offered (noteOffered).
	offered bool
	// epRaw is the endpoint of the cell's last heartbeat and epKey its
	// endpointKey: a cell repeats its endpoint in every heartbeat, and
	// the key's parse and print were a quarter of folding one.
	epRaw, epKey string
	// baselineDelay is the cell's least recent delay, receive time minus
	// sent_at (delayKnown once one heartbeat carried sent_at): what the
	// controller's read lag is measured from (ingestlag.go).
	baselineDelay time.Duration
	delayKnown    bool
	lagInterval   uint64 // the read lag's interval this cell last spoke in, +1
}

// viewIn is everything of a cell its view is made of: a cycle compares
// it with the last published one's to reuse the view and its score.
type viewIn struct {
	hb         *isobarpb.CellHeartbeat // replaced, never modified, per heartbeat
	state      lifecycle.State
	stateSince time.Time
	reason     string
	lastSeen   time.Time
	drain      bool
	rtt        time.Duration
	jitter     time.Duration
	rttOK      bool
	conflict   bool
	// skew is sent_at minus the receive time of the last heartbeat
	// (skewKnown when it carried one); skewed: beyond MaxClockSkew.
	skew              time.Duration
	skewKnown, skewed bool
	// suspect: the stream that delivered the last heartbeat broke without
	// a Terminated report (the agent process died, or its host or link
	// did). The cell keeps its lifecycle state but gets weight 0 until a
	// heartbeat arrives again; the TTL still fails it.
	suspect bool
}

// pushFunc builds, validates and serves an xDS state; it returns the
// version served. It must not keep the state, or any slice of it, after
// it returns: the registry builds a later state in its buffers
// (publisher.takeSpent). xds.Server.Push copies what it keeps.
type pushFunc func(xds.State) (string, error)

// Registry is the single-writer owner of the cell registry.
type Registry struct {
	cfg     Config
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics
	proj    *projection.Projector
	inbox   chan message
	losses  chan message // stream losses: a lane before the inbox (streamloss.go)
	view    viewHolder
	pub     *publisher

	// Loop-owned state.
	cells      map[string]*cell
	ids        []string
	order      []*cell // the cells of ids, in the same order
	orderGen   uint64  // counts rebuilds of ids and order
	cellsGen   uint64  // the orderGen cycleCells was last built for
	idsDirty   bool
	byEndpoint map[string]string
	cycles     uint64
	removals   []removal
	// changed lists the positions in r.order of the cells whose slot was
	// remade since the last offer (all of them when allChanged): the
	// offer sets their cell.offered.
	changed     []int
	allChanged  bool
	sentPlace   cycle.Placement          // round trips in the last offered state
	lastOffer   time.Time                // when the last state was offered
	driftLooked time.Time                // when offerIfDue last looked for a drift (cycle.Drifted)
	mass        massExpiry               // a mass TTL expiry being held (massexpiry.go)
	lag         ingestLag                // this controller's read lag (ingestlag.go)
	index       map[string]int           // id → position in ids, shared by views
	heldLosses  map[string]heldLoss      // stream losses that overtook the heartbeat they name (streamloss.go)
	routes      *RouteTable              // cross-region routing in force
	routesNew   bool                     // routes (or retry budgets) changed since the last push
	slotsNew    bool                     // a cell's slot changed in what it publishes (cycle.SamePublished) since the last push
	sentIngress map[string]string        // the remote regions' ingress in the last offered state (residency sets)
	sets        func(string) []cycle.Set // residency sets per model; nil: none
	budgets     map[string]float64       // retry budget per model (retrybudget.go)
	poolUtil    map[string]float64       // pool utilisation per model (retrybudget.go): bounds penalties
	models      map[string]string        // model names heartbeats carried, shared between cells (sharestrings.go)
	cycleCells  []cycle.Cell             // the cycle's input buffer, reused (cellViews)
	cycleKnown  []bool                   // which of cycleCells' scores still hold, reused
	cycleFresh  []bool                   // which cells got a new view this cycle (cellViews), reused
	touched     []*cell                  // the cells touched since the last cycle (touched.go)
	lastViews   []*CellView              // the last cycle's views, in the order of order
	dpAt        []dpWatch                // the cells whose data-plane errors were not empty last cycle (touched.go)
	dpSpare     []dpWatch                // dpAt's other buffer
	auditNext   int                      // where the next cycle's rolling comparison starts (touched.go)
	auditAll    bool                     // compare every untouched cell each cycle, and panic on a miss (tests)
	// slots holds each cell's cycle.Slot, of its published view, in
	// address order (cycle.AddrOrder); slotOf[i] is the slot of r.order[i]
	// (slotAddr[i] its address, read in order to find one that moved);
	// slotsGen is the orderGen they were made for. A cycle remakes only
	// the slots of the views it replaced, and the state is built from the
	// slots (cycle.BuildStateSlots), not from every view, with each
	// locality's endpoints already in the order the xDS build sorts them
	// into.
	slots      []cycle.Slot
	slotOf     []int
	slotAddr   []netip.AddrPort // slotAddr[i] is r.slots[r.slotOf[i]].Addr, in id order
	slotsGen   uint64
	mapped     []projection.Cell // the mapping's output buffers, reused (cycle.MapKnown)
	scores     []score.Result
	dpCells    map[string]*dpWindow // data-plane errors per cell
	dpDemand   map[string]*dpWindow // ingress demand per data plane and model
	warm       warmHold             // the warm start's hold (warmstart.go)
	offered    map[string]bool      // models of the last offered state
	remoteOnly map[string]bool      // of those, the ones with no local locality
	warmM      *warmMetrics
	saver      *warmSaver // written by the publisher goroutine only
	settled    atomic.Bool
	settledCh  chan struct{} // closed when settled becomes true

	// regionRTT returns the smoothed RTT to each remote region (gossip's
	// probes); nil: none known. Set before Start.
	regionRTT func() map[string]time.Duration
	// regionIngress returns the ingress address of each live remote
	// region its gossip summary names: where a pinned set goes when no
	// routes in force name one (nil: none known).
	regionIngress func() map[string]string

	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
}

func newRegistry(cfg Config, clock clockwork.Clock, log *slog.Logger, m *metrics, push pushFunc) (*Registry, error) {
	proj, err := projection.New(cfg.Projection)
	if err != nil {
		return nil, err
	}
	r := &Registry{
		cfg:        cfg,
		clock:      clock,
		log:        log,
		metrics:    m,
		proj:       proj,
		inbox:      make(chan message, cfg.InboxSize),
		losses:     make(chan message, cfg.InboxSize),
		heldLosses: make(map[string]heldLoss),
		cells:      make(map[string]*cell),
		models:     make(map[string]string),
		byEndpoint: make(map[string]string),
		sentPlace:  make(cycle.Placement),
		dpCells:    make(map[string]*dpWindow),
		dpDemand:   make(map[string]*dpWindow),
		offered:    make(map[string]bool),
		remoteOnly: make(map[string]bool),
		settledCh:  make(chan struct{}),
		warmM:      unregisteredWarmMetrics(),
		sets:       residencySets(cfg.Residency),
		done:       make(chan struct{}),
	}
	r.saver = &warmSaver{dir: cfg.WarmStart.StateDir, region: cfg.Region, log: log, m: r.warmM}
	r.pub = newPublisher(push, clock, log, m)
	r.pub.saved = r.saver.save
	r.view.Store(newView(clock.Now(), 0, nil, nil))
	return r, nil
}

// Start runs the registry loop and its publisher until Stop or ctx ends.
// A second Start returns an error.
func (r *Registry) Start(ctx context.Context) error {
	started := false
	r.startOnce.Do(func() {
		started = true
		ctx, r.cancel = context.WithCancel(ctx)
		r.beginWarmStart(r.clock.Now())
		// The cycle's ticker is set before Start returns, so that a fake
		// clock advanced after Start ticks it (cells that come wait for
		// the tick: applyHeartbeat).
		ticker := r.clock.NewTicker(r.cfg.CycleInterval)
		go func() {
			defer close(r.done)
			var wg sync.WaitGroup
			wg.Go(func() { r.pub.run(ctx) })
			r.loop(ctx, ticker)
			wg.Wait()
		}()
	})
	if !started {
		return errors.New("regional: registry already started")
	}
	return nil
}

// Stop ends the loop and waits for it. Idempotent; safe before Start.
func (r *Registry) Stop() {
	r.stopOnce.Do(func() {
		started := true
		r.startOnce.Do(func() { started = false; close(r.done) })
		if started && r.cancel != nil {
			r.cancel()
		}
	})
	<-r.done
}

// View returns the latest published view. Never nil.
func (r *Registry) View() *View { return r.view.Load() }

// Submit hands a validated heartbeat to the registry without blocking. On
// nil the registry owns hb; on ErrBusy the caller keeps it.
func (r *Registry) Submit(hb *isobarpb.CellHeartbeat) error {
	select {
	case <-r.done:
		return ErrStopped
	default:
	}
	select {
	case r.inbox <- message{hb: hb}:
		return nil
	default:
		return ErrBusy
	}
}

// SubmitOrBlock hands a validated heartbeat to the registry, waiting for
// room. On nil the registry owns hb.
func (r *Registry) SubmitOrBlock(ctx context.Context, hb *isobarpb.CellHeartbeat) error {
	return r.send(ctx, message{hb: hb})
}

func (r *Registry) send(ctx context.Context, m message) error {
	return r.sendOn(ctx, r.inbox, m)
}

// sendOn hands m to the registry on lane (its inbox, or its stream
// losses' lane), waiting for room.
func (r *Registry) sendOn(ctx context.Context, lane chan<- message, m message) error {
	select {
	case lane <- m:
		return nil
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetDrain asks for cell id to be drained (or undrained). It returns
// ErrUnknownCell for a cell the registry does not know, or a lifecycle
// refusal.
func (r *Registry) SetDrain(ctx context.Context, id string, drain bool) error {
	req := &drainRequest{id: id, drain: drain, reply: make(chan error, 1)}
	if err := r.send(ctx, message{drain: req}); err != nil {
		return err
	}
	select {
	case err := <-req.reply:
		return err
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StreamLost tells the registry that the heartbeat stream which delivered
// cell id's heartbeat (incarnation, seq) ended without a Terminated
// report. If that heartbeat is still the cell's latest, the cell becomes
// suspect: weight 0 from the next cycle, which this message triggers at
// once, until a heartbeat arrives again or the TTL fails it. A loss
// reported for an older heartbeat (the agent already reconnected) is
// ignored.
//
// Losses have a lane of their own, taken before the heartbeats queued
// ahead of them (streamloss.go): a broken stream takes capacity away, and
// at 10,000 cells a controller's inbox can hold thousands of heartbeats.
func (r *Registry) StreamLost(ctx context.Context, id, incarnation string, seq uint64) error {
	return r.sendOn(ctx, r.losses, message{lost: &streamLoss{id: id, incarnation: incarnation, sequence: seq, reported: r.clock.Now()}})
}

func (r *Registry) submitProbes(ctx context.Context, res []probeResult) error {
	return r.send(ctx, message{probes: res})
}

func (r *Registry) loop(ctx context.Context, ticker clockwork.Ticker) {
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-r.losses:
			urgent := r.apply(m)
			if r.takeLosses() || urgent { // every loss queued, then one cycle
				r.cycle(r.clock.Now())
			}
		case m := <-r.inbox:
			urgent := r.apply(m)
			// Take what else is queued, bounded, so one cycle covers a
			// burst; a stream loss that arrives meanwhile ends the burst:
			// its cycle runs before the heartbeats still queued.
		drain:
			for range 4096 {
				if r.takeLosses() {
					urgent = true
					break drain
				}
				select {
				case m := <-r.inbox:
					urgent = r.apply(m) || urgent
				default:
					break drain
				}
			}
			if urgent {
				r.cycle(r.clock.Now())
			}
		case <-ticker.Chan():
			r.tick()
		}
	}
}

// tick is the loop's periodic turn: what was received before it is
// applied, then the sweep and the cycle run. A cell whose heartbeat waits
// in the inbox is not missing (a loop held up by a long cycle finds many
// there, and select may take the tick first); the stream losses come
// first, as everywhere, and the cycle after the sweep projects them.
func (r *Registry) tick() {
	r.takeLosses()
	for range len(r.inbox) { // the loop is the only receiver
		r.apply(<-r.inbox)
	}
	now := r.clock.Now()
	r.sweep(now)
	r.cycle(now)
}

// apply folds one message into the registry and reports whether the
// change must be projected at once.
func (r *Registry) apply(m message) bool {
	now := r.clock.Now()
	switch {
	case m.hb != nil:
		return r.applyHeartbeat(now, m.hb)
	case m.probes != nil:
		for _, p := range m.probes {
			if c := r.cells[p.id]; c != nil && (c.rtt != p.rtt || c.jitter != p.jitter || c.rttOK != p.ok) {
				c.rtt, c.jitter, c.rttOK = p.rtt, p.jitter, p.ok
				r.touch(c)
			}
		}
		return false
	case m.drain != nil:
		err := r.applyDrain(now, m.drain)
		m.drain.reply <- err
		return err == nil
	case m.routes != nil:
		changed := routesChange(r.routes, m.routes) || r.ingressMoved()
		r.routes = m.routes
		r.routesNew = r.routesNew || changed
		return changed
	case m.report != nil:
		r.applyReport(now, m.report)
		return false
	case m.lost != nil:
		return r.applyStreamLoss(now, m.lost)
	case m.util != nil:
		return r.applyUtilisation(m.util)
	case m.pool != nil:
		r.poolUtil = m.pool
		return false
	}
	return false
}

// SetRoutes installs the cross-region routing for this region's ingress;
// the next push carries it as locality weights. The registry owns t after
// a nil return.
func (r *Registry) SetRoutes(ctx context.Context, t *RouteTable) error {
	return r.send(ctx, message{routes: t})
}

// applyHeartbeat folds hb into its cell, then settles a stream loss held
// for the cell (streamloss.go), and reports whether either must be
// projected at once.
func (r *Registry) applyHeartbeat(now time.Time, hb *isobarpb.CellHeartbeat) bool {
	urgent := r.foldHeartbeat(now, hb)
	if len(r.heldLosses) == 0 {
		return urgent
	}
	return r.settleHeldLoss(now, hb) || urgent
}

func (r *Registry) foldHeartbeat(now time.Time, hb *isobarpb.CellHeartbeat) bool {
	r.metrics.heartbeats.Inc()
	c := r.cells[hb.GetCellId()]
	if c == nil {
		if !r.admitNewCell(hb) {
			return false
		}
		c = &cell{id: hb.GetCellId()}
		c.stateSince = now
		r.cells[c.id] = c
		r.idsDirty = true
	}
	r.touch(c) // a new heartbeat: a new view
	r.boundSignals(c, hb)
	shareStrings(hb, c.hb, c.id, r.models)
	// Claim the endpoint whenever c does not hold it: a new or moved
	// endpoint, and a cell in conflict, which takes the endpoint over on
	// its next heartbeat once the holder is gone (not live, forgotten or
	// moved).
	changed := false
	if ep := hb.GetEndpoint(); ep != c.epRaw {
		c.epRaw, c.epKey = ep, endpointKey(ep)
	}
	if r.byEndpoint[c.epKey] != c.id {
		changed = r.claimEndpoint(c, hb.GetEndpoint())
	}
	fresh := c.hb == nil || c.hb.GetIncarnation() != hb.GetIncarnation()
	c.hb, c.lastSeen = hb, now // liveness runs on the receive time, never sent_at
	r.noteSkew(now, c, hb)
	r.noteDelay(c, fresh)
	if c.suspect {
		// Restored: back in the load balancer at the next cycle.
		c.suspect = false
		r.log.Info("suspect cell heartbeats again; restored", "cell", c.id)
	}
	reported := lifecycle.FromProto(hb.GetState())
	ev, _ := lifecycle.ReportEvent(reported)
	next, err := lifecycle.Next(c.state, ev, c.drain)
	if err != nil {
		r.metrics.refusedTransitions.Inc()
		r.log.Debug("lifecycle transition refused", "cell", c.id, "err", err)
		return false
	}
	reason := hb.GetReason()
	if reason == "" {
		reason = "agent reported " + reported.String()
	}
	prev := c.state
	if !r.transition(now, c, next, reason) {
		return changed
	}
	// Capacity that leaves (a cell that stops serving or ends) is
	// projected at once: that is failover. Capacity that comes (a cell
	// Ready, a suspect restored) waits for the cycle's
	// tick, at most CycleInterval: a cycle per arrival cost a push per
	// cell when many joined or flapped at once (1,655 pushes a second
	// over 100 controllers of 100 cells in bench scale), and the push
	// storm starved the heartbeats that would have ended it.
	return changed || prev == lifecycle.Ready || !next.Live()
}

// boundSignals caps hb's signals at the shared bounds (clampSignals),
// counts each capped signal and logs when a cell starts sending values
// beyond them. The registry owns hb.
func (r *Registry) boundSignals(c *cell, hb *isobarpb.CellHeartbeat) {
	capped := clampSignals(hb.GetSignals())
	for _, f := range capped {
		r.metrics.signalsClamped.WithLabelValues(f).Inc()
	}
	if len(capped) > 0 && !c.clamped {
		r.log.Warn("cell reports signals beyond their bounds; capped at the bound (summary/bounds.go), check its agent and engine",
			"cell", c.id, "fields", capped)
	}
	c.clamped = len(capped) > 0
}

// claimEndpoint records that c advertises ep and reports whether c's
// conflict flag changed. A live cell already holding ep keeps it and c is
// marked conflicting; a holder that is no longer live (Failed, Terminated)
// or forgotten, or that moved to another endpoint, gives ep up to c.
// Called for every heartbeat of a cell that does not hold its endpoint, so
// a conflict clears on the claimant's first heartbeat after the holder
// goes.
func (r *Registry) claimEndpoint(c *cell, ep string) bool {
	if c.hb != nil && r.byEndpoint[endpointKey(c.hb.GetEndpoint())] == c.id {
		delete(r.byEndpoint, endpointKey(c.hb.GetEndpoint()))
	}
	was := c.conflict
	key := endpointKey(ep)
	holder, taken := r.byEndpoint[key]
	if taken && holder != c.id {
		if h := r.cells[holder]; h != nil && h.state.Live() && endpointKey(h.hb.GetEndpoint()) == key {
			if !c.conflict {
				r.metrics.rejected.WithLabelValues("endpoint_conflict").Inc()
				r.log.Warn("cell advertises an endpoint another live cell holds; keeping it out of the load balancer",
					"cell", c.id, "endpoint", ep, "holder", holder)
			}
			c.conflict = true
			return !was
		}
	}
	r.byEndpoint[key] = c.id
	c.conflict = false
	if was {
		r.log.Info("endpoint conflict cleared: the other claimant is gone", "cell", c.id, "endpoint", ep, "previous_holder", holder)
	}
	return was
}

// endpointKey is ep in canonical form, so that one address written two
// ways (10.0.0.5:8000 and [::ffff:10.0.0.5]:8000, or IPv6 with and without
// leading zeros) is one claim. ep was validated as IP:port; anything else
// is its own key.
func endpointKey(ep string) string {
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return ep
	}
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()).String()
}

func (r *Registry) applyDrain(now time.Time, req *drainRequest) error {
	c := r.cells[req.id]
	if c == nil {
		r.metrics.unknownCells.Inc()
		return fmt.Errorf("%w: %q", ErrUnknownCell, trunc(req.id))
	}
	ev := lifecycle.DrainRequested
	if !req.drain {
		ev = lifecycle.UndrainRequested
	}
	next, err := lifecycle.Next(c.state, ev, req.drain)
	if err != nil {
		return err
	}
	c.drain = req.drain
	r.touch(c)
	r.transition(now, c, next, "operator "+ev.String())
	return nil
}

// transition moves c to next and reports whether serving changed.
func (r *Registry) transition(now time.Time, c *cell, next lifecycle.State, reason string) bool {
	if next == c.state {
		return false
	}
	prev := c.state
	r.metrics.transitions.WithLabelValues(prev.String(), next.String()).Inc()
	r.log.Info("cell state changed", "cell", c.id, "from", prev.String(), "to", next.String(), "reason", reason)
	if next == lifecycle.Failed && (prev == lifecycle.Ready || prev == lifecycle.Draining) && !c.suspect {
		c.leftLBAt = now // a suspect cell left the load balancer already
	}
	if !next.Live() {
		c.suspect = false
	}
	c.state, c.stateSince, c.reason = next, now, reason
	r.touch(c)
	return true
}

// sweep fails cells whose heartbeats stopped, unless so many stopped at
// once that it holds them (holdMassExpiry), and forgets long-dead ones.
func (r *Registry) sweep(now time.Time) {
	// Widened by this controller's read lag (ingestlag.go), for the held
	// losses too: the heartbeat a loss waits for may be in the backlog.
	ttl := r.cfg.TTL() + r.lagAllowance(now)
	r.sweepHeldLosses(now, ttl)
	var expired []*cell
	live := 0
	// The cells in id order, a slice: walking the map of 10,000 cells
	// every tick was three quarters of the sweep.
	r.refreshIDs()
	for _, c := range r.order {
		switch id := c.id; {
		case c.state.Live():
			live++
			if now.Sub(c.lastSeen) >= ttl {
				expired = append(expired, c)
			}
		case now.Sub(c.stateSince) >= r.cfg.ForgetAfter && now.Sub(c.lastSeen) >= r.cfg.ForgetAfter:
			delete(r.cells, id)
			delete(r.dpCells, id)
			if c.hb != nil && r.byEndpoint[endpointKey(c.hb.GetEndpoint())] == id {
				delete(r.byEndpoint, endpointKey(c.hb.GetEndpoint()))
			}
			r.idsDirty = true
		}
	}
	if r.holdMassExpiry(now, len(expired), live) {
		return
	}
	r.metrics.ttlFailures.Add(float64(len(expired)))
	for _, c := range expired {
		next, _ := lifecycle.Next(c.state, lifecycle.TTLExpired, c.drain)
		r.transition(now, c, next, fmt.Sprintf("no heartbeat for %v (TTL %v)", now.Sub(c.lastSeen).Round(time.Millisecond), ttl))
	}
}

// cycle scores every cell, projects weights, publishes a view and, when
// the projection says so, offers a new xDS state to the publisher. The
// mapping is regional/cycle's; the writes are the loop's.
func (r *Registry) cycle(now time.Time) {
	start := time.Now() // wall time for the cost metric, not for logic
	r.cycles++
	r.refreshIDs()
	views, cells, known, kept := r.cellViews(now)
	pcells, results := cycle.MapKnown(r.cfg.Score, cells, func(i int) *score.Result {
		switch {
		case !known[i]:
			return nil
		case kept:
			return &r.scores[i] // the buffer MapKnown writes into: already the cell's score
		}
		return &r.order[i].pub.Score
	}, r.mapped, r.scores)
	r.mapped, r.scores = pcells, results
	d := r.proj.Project(now, pcells)
	r.annotate(views, cells, known, results, d)
	r.noteRemovals(d.Weights)
	for _, id := range d.NewTrips {
		r.metrics.penaltyTrips.Inc()
		r.log.Warn("error-rate outlier penalised", "cell", id)
	}
	r.metrics.penaltyKept.Set(float64(len(d.Kept)))
	v := newView(now, r.cycles, views, r.index)
	v.Demand = r.demand(now)
	v.DemandSlices = r.demandSlices(now)
	r.view.Store(v)
	r.metrics.projection.Observe(time.Since(start).Seconds())
	r.offerIfDue(now, views, d.Push)
}

// refreshIDs sorts the cell ids and rebuilds their index after cells came
// or went.
func (r *Registry) refreshIDs() {
	if !r.idsDirty {
		return
	}
	r.ids = r.ids[:0]
	for id := range r.cells {
		r.ids = append(r.ids, id)
	}
	slices.Sort(r.ids)
	r.idsDirty = false
	r.orderGen++
	r.index = make(map[string]int, len(r.ids))
	r.order = r.order[:0]
	for i, id := range r.ids {
		r.index[id] = i
		c := r.cells[id]
		c.pos = i
		r.order = append(r.order, c)
	}
}

// cellViews returns, in id order, each cell's view (without this cycle's
// score and weight), its input to the mapping, and whether its last score
// still holds. A cell whose viewIn is what its last published view was
// made of keeps that view (shared, not copied) and its mapping input; its
// score holds too when the data plane's error window is also unchanged.
// So a cycle builds views and scores only for the cells that changed.
//
// In the same order as the last cycle, only the cells touched since then
// and those whose data-plane errors moved with time (touched.go) are read:
// every other cell keeps its view, input and score without a look.
func (r *Registry) cellViews(now time.Time) (views []*CellView, cells []cycle.Cell, known []bool, kept bool) {
	n := len(r.order)
	views = make([]*CellView, n) // published with the cycle's View
	cells = slices.Grow(r.cycleCells[:0], n)[:n]
	known = slices.Grow(r.cycleKnown[:0], n)[:n]
	fresh := slices.Grow(r.cycleFresh[:0], n)[:n]
	r.cycleCells, r.cycleKnown, r.cycleFresh = cells, known, fresh
	// In the same order as last cycle, cells[i] still holds the cell's
	// last input (its pubCell) and r.scores[i] its score: only what
	// changed is written.
	kept = r.cellsGen == r.orderGen
	r.cellsGen = r.orderGen
	last := r.dpAt
	r.dpAt, r.dpSpare = r.dpSpare[:0], last
	if kept && len(r.lastViews) == n {
		copy(views, r.lastViews)
		clear(fresh)
		for i := range known {
			known[i] = true
		}
		r.compareUntouched()
		r.keepWatches(now, last)
		for _, c := range r.touched {
			r.readCell(now, c.pos, c, views, cells, known, fresh, kept)
		}
	} else {
		for i, c := range r.order {
			r.readCell(now, i, c, views, cells, known, fresh, kept)
		}
	}
	r.touched = r.touched[:0] // each read cleared its cell's flag
	r.lastViews = views       // annotate writes the cycle's views in it
	var model string
	var util float64
	for i := range cells {
		// cells[i] (one contiguous slice) rather than views[i] (one
		// allocation per cell, a cache miss each at 10,000 cells).
		if m := cells[i].Model; i == 0 || m != model {
			model, util = m, r.poolUtil[m] // cells of one model mostly come in runs
		}
		cells[i].Utilisation = util
	}
	return views, cells, known, kept
}

// readCell sets the cycle's view, mapping input and known and fresh flags
// of c, at position i (cellViews).
func (r *Registry) readCell(now time.Time, i int, c *cell, views []*CellView, cells []cycle.Cell, known, fresh []bool, kept bool) {
	c.touched = false
	dp, until := r.dataPlaneErrors(now, c.id)
	if dp != (cycle.ErrorWindow{}) {
		r.dpAt = append(r.dpAt, dpWatch{pos: i, until: until})
	}
	if c.pub != nil && c.viewIn == c.pubIn {
		views[i] = c.pub
		if !kept {
			cells[i] = c.pubCell
		}
		known[i], fresh[i] = c.pubDP == dp, false
		cells[i].DataPlane = dp
		return
	}
	v := c.view()
	views[i], cells[i], known[i], fresh[i] = &v, cycle.FromView(v, dp), false, true
}

// annotate sets each of views (the cycle's, in id order) to its cell's
// view with this cycle's score and weight (d, the projection of the
// cells in that order; cycle.Annotated: a view that changed is copied,
// never modified) and records it as the cell's published view, with the
// mapping input it was scored from, and its slot.
func (r *Registry) annotate(views []*CellView, cells []cycle.Cell, known []bool, results []score.Result, d projection.Decision) {
	remake := r.slotsGen != r.orderGen || len(r.slotOf) != len(r.order)
	moved := false // a remade slot's address changed: the order must be remade
	weights := d.Weights
	for i := range r.order {
		// known: the cell kept its view (cellViews) and its score. Same:
		// its weight is the one the last cycle gave it, which its view
		// carries. Such a cell is not even read.
		if known[i] && d.Same[i] {
			continue
		}
		c, fresh := r.order[i], r.cycleFresh[i]
		old := c.pub
		views[i] = cycle.Annotated(views[i], results[i], weights[i], fresh)
		c.pub = views[i]
		if !remake {
			// The slot this cell had (made of old): its parsed endpoint
			// is reused when the endpoint did not change.
			var slot cycle.Slot
			prev := &r.slots[r.slotOf[i]]
			if old != nil {
				slot = cycle.SlotAfter(views[i], prev, old.Endpoint)
			} else {
				slot = cycle.SlotOf(views[i])
			}
			r.slotsNew = r.slotsNew || !cycle.SamePublished(&slot, prev)
			moved = moved || slot.Addr != r.slotAddr[i]
			r.slots[r.slotOf[i]], r.slotAddr[i] = slot, slot.Addr
			r.changed = append(r.changed, i)
		} else if old != nil && !r.slotsNew {
			// The order changed (cells came or went): the slots are
			// remade below, so a cell's change is found from its views.
			// A new cell's entry to the load balancer is the
			// projection's push.
			was, is := cycle.SlotOf(old), cycle.SlotOf(views[i])
			r.slotsNew = !cycle.SamePublished(&was, &is)
		}
		if fresh {
			c.pubIn = c.viewIn
		}
		if fresh || !known[i] {
			c.pubCell, c.pubDP = cells[i], cells[i].DataPlane // else the same but for Utilisation, set each cycle
		}
	}
	if remake || moved {
		r.remakeSlots()
	}
	if len(r.changed) > len(r.order) { // cycles without an offer (a warm start's hold)
		r.changed, r.allChanged = r.changed[:0], true
	}
}

// noteOffered sets cell.offered of the cells whose slot changed since the
// last offer: BuildStateSlots puts a cell in the state exactly when its
// slot is In.
func (r *Registry) noteOffered() {
	if r.allChanged {
		for i, c := range r.order {
			c.offered = r.slots[r.slotOf[i]].In
		}
	} else {
		for _, i := range r.changed {
			r.order[i].offered = r.slots[r.slotOf[i]].In
		}
	}
	r.changed, r.allChanged = r.changed[:0], false
}

// remakeSlots makes every cell's slot, of its published view, in address
// order: after the cells came or went, or one's address changed.
func (r *Registry) remakeSlots() {
	n := len(r.order)
	r.slots = slices.Grow(r.slots[:0], n)[:n]
	for i, c := range r.order {
		r.slots[i] = cycle.SlotOf(c.pub)
	}
	// Sort positions, not slots, to learn where each cell's slot goes.
	pos := make([]int, n)
	for i := range pos {
		pos[i] = i
	}
	slices.SortStableFunc(pos, func(a, b int) int { return cycle.AddrOrder(&r.slots[a], &r.slots[b]) })
	sorted := make([]cycle.Slot, n)
	r.slotOf = slices.Grow(r.slotOf[:0], n)[:n]
	r.slotAddr = slices.Grow(r.slotAddr[:0], n)[:n]
	for to, from := range pos {
		sorted[to] = r.slots[from]
		r.slotOf[from], r.slotAddr[from] = to, r.slots[from].Addr
	}
	r.slots, r.slotsGen = sorted, r.orderGen
	r.allChanged = true // the positions in r.changed may be another order's
}

// view is c as a CellView, without score and weight.
func (c *cell) view() CellView {
	cp := c.hb.GetCapability()
	return CellView{
		ID: c.id, Endpoint: c.hb.GetEndpoint(), Model: cp.GetModel(), MaxModelLen: cp.GetMaxModelLen(),
		State: c.state, StateSince: c.stateSince, Reason: c.reason, LastSeen: c.lastSeen,
		Incarnation: c.hb.GetIncarnation(), Sequence: c.hb.GetSequence(),
		Signals: c.hb.GetSignals(), VLLM: sourceView(c.hb.GetVllm()), DCGM: sourceView(c.hb.GetDcgm()),
		RTT: c.rtt, Jitter: c.jitter, RTTOK: c.rttOK,
		OperatorDrain: c.drain, EndpointConflict: c.conflict, Suspect: c.suspect,
		ClockSkew: c.skew, ClockSkewKnown: c.skewKnown, ClockSkewed: c.skewed,
		PrefillTokensPerSecond: cp.GetPrefillTokensPerS(), MaxNumSeqs: cp.GetMaxNumSeqs(),
	}
}

// noteRemovals queues, for the failover histogram, the cells that left
// the load balancer and have now lost the weight they were last pushed
// (weights: this cycle's, in the order of r.order).
func (r *Registry) noteRemovals(weights []projection.Weight) {
	for i := range weights {
		if weights[i].Published != 0 {
			continue
		}
		if c := r.order[i]; !c.leftLBAt.IsZero() {
			if c.offered {
				r.removals = append(r.removals, removal{id: c.id, since: c.leftLBAt})
			}
			c.leftLBAt = time.Time{}
		}
	}
}

// offerIfDue offers a new state to the publisher when the projection
// asks for one (push), the routes changed, a round trip drifted
// (cycle.Drifted) or the warm start's hold ends, and records what it
// offered. Drifted, a look at every view, is looked at most every
// cycle.PlacementRepush, and not before that long after the last offer: a
// drift is pushed within PlacementRepush of it or of the last offer,
// whichever is later.
// (Looked at every cycle once the last offer was that old, as it was
// before, it took about a ninth of a live cycle's CPU at 10,000 cells,
// where pushes come one in twenty seconds.)
func (r *Registry) offerIfDue(now time.Time, views []*CellView, push bool) {
	push = push || r.routesNew || r.slotsNew
	var rtts map[string]time.Duration
	look := !push && now.Sub(r.lastOffer) >= cycle.PlacementRepush && now.Sub(r.driftLooked) >= cycle.PlacementRepush
	if push || look {
		if r.regionRTT != nil {
			rtts = r.regionRTT()
		}
	}
	if look {
		r.driftLooked = now
		push = cycle.Drifted(r.sentPlace, views, rtts)
	}
	// A starting controller holds every push until its cells are back
	// (warmstart.go); the cycle that ends the hold pushes.
	hold, release := r.warmCycle(now, views)
	if hold {
		return // routesNew and slotsNew stay set: the release pushes them too
	}
	if !push && !release {
		return
	}
	if release && rtts == nil && r.regionRTT != nil {
		rtts = r.regionRTT()
	}
	r.routesNew, r.slotsNew = false, false
	params := r.stateParams(rtts, r.demandSlices(now))
	r.sentIngress = params.Ingress
	params.Reuse = cycle.Offer{State: r.pub.takeSpent()}
	o := cycle.BuildStateSlots(params, r.slots) // the views' slots (annotate)
	r.noteOffered()
	r.reportRetryBudgets(o.State)
	r.sentPlace = o.Placement
	r.noteDropped(views, o.State)
	r.lastOffer = now
	r.pub.offer(o.State, r.removals)
	r.removals = nil
}

// stateParams is what cycle.BuildState takes besides the views: this
// region's locality, the models a warm start keeps, the routes in force
// and the round trips to the other regions (rtts); mix, the measured
// demand per slice of each model, orders a blind plan's shed
// (orderedShares).
func (r *Registry) stateParams(rtts map[string]time.Duration, mix map[string]map[SliceKey]float64) cycle.Params {
	p := cycle.Params{
		Region: r.cfg.Region, Zone: r.cfg.Zone, Kept: r.keptModels(), RTTs: rtts,
		Sets: r.sets, RetryBudget: r.budgets, Sent: r.sentPlace,
	}
	if r.regionIngress != nil && r.sets != nil {
		p.Ingress = r.regionIngress()
	}
	if t := r.routes; t != nil {
		p.Routes = &cycle.Routes{Models: make(map[string]cycle.ModelRoutes, len(t.Models)), Ingress: t.Ingress}
		for name, mr := range t.Models {
			cm := cycle.ModelRoutes{Routes: mr.Routes}
			cm.ShedCritical, cm.Shed, cm.ShedSheddable = orderedShares(mr, mix[name])
			if len(mr.Pinned) > 0 {
				cm.Pinned = make(map[string]cycle.SetRoutes, len(mr.Pinned))
				for key, pr := range mr.Pinned {
					cm.Pinned[key] = cycle.SetRoutes(pr)
				}
			}
			p.Routes.Models[name] = cm
		}
	}
	return p
}
