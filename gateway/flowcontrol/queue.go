package flowcontrol

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
)

// Errors Push returns for an arrival it refuses; check with errors.Is. The
// caller answers the request itself (the gateway: 429).
var (
	// ErrBandFull: the arrival's band holds Config.MaxLen[class] entries.
	ErrBandFull = errors.New("flowcontrol: band full")
	// ErrQueueFull: the queue holds Config.MaxTotal entries and no less
	// important entry could be displaced.
	ErrQueueFull = errors.New("flowcontrol: queue full")
	// ErrClass: the criticality is not one of reqclass's.
	ErrClass = errors.New("flowcontrol: unknown criticality")
)

// MaxBound caps every length bound of a Config.
const MaxBound = 1 << 20

// DefaultTTFTObjective is the time-to-first-token objective the default
// age bounds defend: the TTFT P95 objective isobar's regional controller
// measures a cell's capacity against (regional/capacity
// DefaultTTFTSLO), so the gateway queues for the same objective the
// control plane plans for.
const DefaultTTFTObjective = 1500 * time.Millisecond

// DefaultCriticalMaxAge bounds a critical request's wait. It is a
// liveness bound, not an objective: a critical request is worth serving
// late rather than refusing (issue 25: critical is shed only when
// critical demand alone exceeds the capacity it may use), so it waits
// for a slot as long as a client plausibly waits for a first token.
const DefaultCriticalMaxAge = 10 * time.Second

// Config bounds a Queue. Build one with DefaultConfig and adjust it. The
// zero value of a field added after MaxAge keeps the queue's earlier
// behaviour.
type Config struct {
	// MaxLen[class] is the most entries the band of that criticality
	// holds (0: that class never waits). Default 128 critical, 256
	// standard, 256 sheddable.
	MaxLen [reqclass.Count]int
	// MaxTotal is the most entries the queue holds in all; while it is
	// reached an arrival displaces a less important entry (see the package
	// doc). 0 means the sum of MaxLen (no displacement). Default 384.
	MaxTotal int
	// MaxAge[class] is the longest an entry of that criticality waits
	// before it comes out Expired; positive for every band that may hold
	// entries. Default: critical DefaultCriticalMaxAge (10 s); standard
	// and sheddable DefaultTTFTObjective (1.5 s), because a request that
	// has waited its TTFT objective can no longer meet it: dispatching it
	// spends a batch slot that a fresh request could use within the
	// objective, and its client is better told at once (429, Retry-After)
	// than answered late.
	MaxAge [reqclass.Count]time.Duration
	// NewestFirst[class]: dispatch each tenant's entries of that band
	// newest first (LIFO) rather than oldest first; the round-robin
	// between tenants is unchanged. Default: standard and sheddable.
	// Why: under a sustained shortfall not every entry can be served, and
	// oldest-first makes every served entry wait about MaxAge (the queue
	// stays full up to its age bound), so with MaxAge at the objective
	// each one would be served late; newest-first serves the entries
	// with the most of their objective left and lets the oldest age out,
	// and while the queue drains within MaxAge the order changes who waits,
	// not who is served. This is the adaptive LIFO of "Fail at Scale"
	// (Maurer, ACM Queue 13(8), 2015), without its FIFO phase: a band that
	// never backs up has at most a few entries to order. Critical stays
	// oldest-first: its entries are all served (its bound is liveness,
	// not an objective), and oldest-first bounds the longest wait.
	NewestFirst [reqclass.Count]bool
	// Yield: while a more important band is short, a less important one
	// yields free capacity to it (see Yields): Pop and Dispatch pass over
	// its entries and the caller queues its arrivals rather than sending
	// them to a free slot. Default true.
	// Why: a slot is held for a whole reply (seconds), far longer than the
	// TTFT objective the more important requests wait for one, so a slot
	// given to a sheddable request while standard requests go unserved is
	// a slot the next standard arrivals cannot have; the issue asks that
	// sheddable absorb the shortfall first. A band is short from the
	// moment one of its requests leaves unserved (expired, displaced, or
	// refused because its band or the queue was full) until it has gone
	// its own MaxAge without that: an entry that expired waited MaxAge
	// without a slot, so the band's demand exceeded the slots freed to it
	// over that span, and the same span without a loss is the evidence
	// that it no longer does.
	Yield bool
	// Objective[class]: the band's MaxAge is a TTFT objective, not a
	// bound on the wait alone: an entry expires once its wait plus the
	// time a dispatched request currently takes to its first token
	// (SetTTFT) reaches MaxAge, since from then on it can no longer meet
	// the objective either. Default: standard and sheddable (critical's
	// MaxAge is a liveness bound).
	Objective [reqclass.Count]bool
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		MaxLen:      [reqclass.Count]int{128, 256, 256},
		MaxTotal:    384,
		MaxAge:      [reqclass.Count]time.Duration{DefaultCriticalMaxAge, DefaultTTFTObjective, DefaultTTFTObjective},
		NewestFirst: [reqclass.Count]bool{false, true, true},
		Yield:       true,
		Objective:   [reqclass.Count]bool{false, true, true},
	}
}

// Validate reports the first bound that is out of range.
func (c Config) Validate() error {
	for _, cl := range reqclass.All() {
		n, age := c.MaxLen[cl], c.MaxAge[cl]
		if n < 0 || n > MaxBound {
			return fmt.Errorf("flowcontrol: max length of %s %d outside [0, %d]", cl, n, MaxBound)
		}
		if n > 0 && age <= 0 {
			return fmt.Errorf("flowcontrol: max age of %s must be positive, got %s", cl, age)
		}
	}
	if c.MaxTotal < 0 || c.MaxTotal > MaxBound {
		return fmt.Errorf("flowcontrol: max total %d outside [0, %d]", c.MaxTotal, MaxBound)
	}
	return nil
}

// Outcome is how an entry left the queue.
type Outcome uint8

// The outcomes.
const (
	// Dispatched: Pop handed it out; the caller serves it.
	Dispatched Outcome = iota
	// Evicted: displaced by a more important arrival while the queue was
	// full.
	Evicted
	// Expired: it waited its band's MaxAge.
	Expired
	// Removed: the caller withdrew it (Remove).
	Removed
)

// String is the outcome's label: dispatched, evicted, expired, removed.
func (o Outcome) String() string {
	switch o {
	case Dispatched:
		return "dispatched"
	case Evicted:
		return "evicted"
	case Expired:
		return "expired"
	case Removed:
		return "removed"
	}
	return "unknown"
}

// Handle names a queued entry (for Remove). The zero Handle names none.
type Handle uint64

// Entry is one queued request as it leaves the queue.
type Entry[T any] struct {
	Handle   Handle
	Class    reqclass.Criticality
	Tenant   string
	Enqueued time.Time
	Outcome  Outcome
	Payload  T
}

// node is an entry linked into its band's arrival order and its flow.
type node[T any] struct {
	e                  Entry[T]
	flow               *flow[T]
	bandPrev, bandNext *node[T]
	flowPrev, flowNext *node[T]
}

// flow is one tenant's FIFO within a band.
type flow[T any] struct {
	tenant     string
	head, tail *node[T]
	n          int
}

// band is one criticality's entries: arrival order (oldest first) and the
// tenants' flows in round-robin order.
type band[T any] struct {
	head, tail *node[T]
	n          int
	flows      map[string]*flow[T]
	ring       []*flow[T]
	next       int
}

// Queue is the bounded per-criticality queue. Not safe for concurrent use.
type Queue[T any] struct {
	cfg     Config
	total   int
	bands   [reqclass.Count]band[T]
	handles map[Handle]*node[T]
	lastID  Handle
	last    time.Time
	// lost[class]: the last time a request of that band left unserved
	// (expired, displaced or refused); lostAny[class] whether one has.
	lost    [reqclass.Count]time.Time
	lostAny [reqclass.Count]bool
	// hold is SetSlotHold's estimate, ttft SetTTFT's.
	hold, ttft time.Duration
}

// New returns an empty queue bounded by cfg.
func New[T any](cfg Config) (*Queue[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxTotal == 0 {
		for _, n := range cfg.MaxLen {
			cfg.MaxTotal += n
		}
	}
	q := &Queue[T]{cfg: cfg, handles: make(map[Handle]*node[T])}
	for i := range q.bands {
		q.bands[i].flows = make(map[string]*flow[T])
	}
	return q, nil
}

// Config returns the queue's bounds (MaxTotal resolved).
func (q *Queue[T]) Config() Config { return q.cfg }

func (q *Queue[T]) clock(now time.Time) time.Time {
	if now.Before(q.last) {
		return q.last
	}
	q.last = now
	return now
}

// Push queues payload as an entry of class and tenant arriving at now. It
// first takes out every expired entry, then admits the arrival as the
// package doc describes, displacing at most one entry (a less important
// one, or its own band's heaviest tenant's).
// out lists the entries that left (Expired, Evicted): the caller answers
// them. On error the arrival is not queued and the caller keeps payload.
func (q *Queue[T]) Push(now time.Time, class reqclass.Criticality, tenant string, payload T) (h Handle, out []Entry[T], err error) {
	if int(class) >= reqclass.Count {
		return 0, nil, ErrClass
	}
	now = q.clock(now)
	out = q.expire(now, nil)
	b := &q.bands[class]
	switch {
	case b.n >= q.cfg.MaxLen[class]:
		victim := b.crowding(tenant)
		if victim == nil {
			q.lose(class, now)
			return 0, out, ErrBandFull
		}
		q.lose(class, now)
		out = append(out, q.unlink(victim, Evicted))
	case q.total >= q.cfg.MaxTotal:
		victim := q.victim(class, tenant)
		if victim == nil {
			q.lose(class, now)
			return 0, out, ErrQueueFull
		}
		q.lose(victim.e.Class, now)
		out = append(out, q.unlink(victim, Evicted))
	}
	q.lastID++
	n := &node[T]{e: Entry[T]{Handle: q.lastID, Class: class, Tenant: tenant, Enqueued: now, Payload: payload}}
	q.link(n)
	return n.e.Handle, out, nil
}

// victim is the entry an arrival of class and tenant displaces from a
// full queue: in the least important non-empty band below class, the
// oldest entry of the tenant holding the most there (the heaviest flow,
// so that a quiet tenant keeps its share of the band); failing that, the
// heaviest tenant's oldest entry of class's own band when it crowds the
// arrival's tenant (see crowding); nil when neither.
func (q *Queue[T]) victim(class reqclass.Criticality, tenant string) *node[T] {
	for _, c := range reqclass.ShedOrder() {
		if c <= class {
			break
		}
		if f := q.bands[c].heaviest(); f != nil {
			return f.head
		}
	}
	return q.bands[class].crowding(tenant)
}

// heaviest is the band's flow holding the most entries, the one whose
// oldest entry is older on ties; nil when the band is empty.
func (b *band[T]) heaviest() *flow[T] {
	var best *flow[T]
	for _, f := range b.ring {
		if best == nil || f.n > best.n || f.n == best.n && f.head.e.Handle < best.head.e.Handle {
			best = f
		}
	}
	return best
}

// crowding is the oldest entry of the band's heaviest tenant when that
// tenant holds at least two entries more than tenant does: displacing it
// for tenant's arrival leaves tenant holding no more than it. nil
// otherwise: a full band refuses an arrival of its heaviest tenant (or of
// one as heavy), so one tenant cannot fill a band and keep the others
// out, and two tenants cannot displace each other back and forth.
func (b *band[T]) crowding(tenant string) *node[T] {
	f := b.heaviest()
	if f == nil {
		return nil
	}
	mine := 0
	if g := b.flows[tenant]; g != nil {
		mine = g.n
	}
	if f.n < mine+2 {
		return nil
	}
	return f.head
}

// lose records that a request of class left unserved at t.
func (q *Queue[T]) lose(class reqclass.Criticality, t time.Time) {
	if !q.lostAny[class] || t.After(q.lost[class]) {
		q.lost[class], q.lostAny[class] = t, true
	}
}

// SetSlotHold tells the queue how long a dispatched request holds its
// slot (the gateway: the slot hold it measures per endpoint, e.g. their
// mean); 0, the default, means unknown. It lengthens how long a band
// counts as short (see Yields): a slot given to a less important request
// is out of reach for that long, so it is given only when the more
// important band has lost nothing for as long.
func (q *Queue[T]) SetSlotHold(d time.Duration) { q.hold = max(d, 0) }

// SetTTFT tells the queue how long a dispatched request currently takes
// to its first token (the gateway: what it measures from sending a
// request to its first byte, e.g. an EWMA over its endpoints); 0, the
// default, means unknown. An entry of an Objective band expires when its
// wait plus d reaches its MaxAge (see Config.Objective), at the latest
// at MaxAge.
func (q *Queue[T]) SetTTFT(d time.Duration) { q.ttft = max(d, 0) }

// age is how long an entry of band c may wait now: MaxAge, less the
// current time to first token for an Objective band.
func (q *Queue[T]) age(c int) time.Duration {
	if q.cfg.Objective[c] {
		return max(q.cfg.MaxAge[c]-q.ttft, 0)
	}
	return q.cfg.MaxAge[c]
}

// Yields reports whether class yields free capacity at now to a more
// important band that is short (Config.Yield; see there), and until when
// at least: a band is short until its own MaxAge, or the slot hold
// (SetSlotHold) when longer, has passed since one of its requests last
// left unserved. While it yields, Pop and Dispatch pass
// over class's entries, and the caller queues an arrival of class (Push)
// rather than sending it to a free slot; at until (or at the next freed
// slot after it) it offers the queue's entries again. Critical never
// yields.
func (q *Queue[T]) Yields(now time.Time, class reqclass.Criticality) (until time.Time, yields bool) {
	if !q.cfg.Yield || int(class) >= reqclass.Count {
		return time.Time{}, false
	}
	now = q.clock(now)
	for c := range class {
		if !q.lostAny[c] {
			continue
		}
		if end := q.lost[c].Add(max(q.cfg.MaxAge[c], q.hold)); now.Before(end) {
			if !yields || end.After(until) {
				until = end
			}
			yields = true
		}
	}
	return until, yields
}

// first is the flow's entry dispatched next: its oldest, or its newest
// when the band dispatches newest first.
func (q *Queue[T]) first(c reqclass.Criticality, f *flow[T]) *node[T] {
	if q.cfg.NewestFirst[c] {
		return f.tail
	}
	return f.head
}

// after is the flow's entry dispatched after n (nil: none).
func (q *Queue[T]) after(c reqclass.Criticality, n *node[T]) *node[T] {
	if q.cfg.NewestFirst[c] {
		return n.flowPrev
	}
	return n.flowNext
}

// Pop takes out the next entry to dispatch at now (Outcome Dispatched):
// the most important non-empty band, round-robin between its tenants,
// each tenant's entries oldest first (newest first in a NewestFirst
// band). ok is false when nothing unexpired waits. expired lists the
// entries it found expired on the way: the caller answers them.
func (q *Queue[T]) Pop(now time.Time) (e Entry[T], ok bool, expired []Entry[T]) {
	now = q.clock(now)
	expired = q.expire(now, nil)
	for _, c := range reqclass.All() {
		b := &q.bands[c]
		if len(b.ring) == 0 {
			continue
		}
		if _, y := q.Yields(now, c); y {
			break
		}
		if b.next >= len(b.ring) {
			b.next = 0
		}
		f := b.ring[b.next]
		n := q.first(c, f)
		// The cursor moves past this tenant; unlink moves it back by one
		// if the tenant's flow empties and leaves the ring.
		b.next++
		return q.unlink(n, Dispatched), true, expired
	}
	return Entry[T]{}, false, expired
}

// Dispatch is Pop for a caller whose capacity serves only some entries
// (the gateway: a freed slot on one endpoint serves only the requests that
// may use it): it offers the entries to eligible in dispatch order (the
// most important band first; within a band the tenants in round-robin
// order from the one due, each tenant's entries in Pop's order) and takes
// out the first one eligible accepts (Outcome Dispatched); the round-robin
// moves past its tenant. eligible must not call the Queue. ok is false
// when it accepted none; expired is as for Pop.
func (q *Queue[T]) Dispatch(now time.Time, eligible func(Entry[T]) bool) (e Entry[T], ok bool, expired []Entry[T]) {
	now = q.clock(now)
	expired = q.expire(now, nil)
	for _, c := range reqclass.All() {
		b := &q.bands[c]
		if _, y := q.Yields(now, c); y {
			break
		}
		for k := range len(b.ring) {
			i := (b.next + k) % len(b.ring)
			for n := q.first(c, b.ring[i]); n != nil; n = q.after(c, n) {
				if eligible(n.e) {
					b.next = i + 1
					return q.unlink(n, Dispatched), true, expired
				}
			}
		}
	}
	return Entry[T]{}, false, expired
}

// Expire takes out every entry that has waited its band's MaxAge at now.
func (q *Queue[T]) Expire(now time.Time) []Entry[T] {
	return q.expire(q.clock(now), nil)
}

func (q *Queue[T]) expire(now time.Time, out []Entry[T]) []Entry[T] {
	for c := range q.bands {
		b := &q.bands[c]
		for b.head != nil && !now.Before(b.head.e.Enqueued.Add(q.age(c))) {
			q.lose(reqclass.Criticality(c), b.head.e.Enqueued.Add(q.age(c)))
			out = append(out, q.unlink(b.head, Expired))
		}
	}
	return out
}

// NextExpiry is the earliest instant at which Expire will take an entry
// out; ok is false when the queue is empty.
func (q *Queue[T]) NextExpiry() (at time.Time, ok bool) {
	for c := range q.bands {
		if h := q.bands[c].head; h != nil {
			d := h.e.Enqueued.Add(q.age(c))
			if !ok || d.Before(at) {
				at, ok = d, true
			}
		}
	}
	return at, ok
}

// Remove withdraws the entry h names (Outcome Removed); ok is false when
// it is no longer queued.
func (q *Queue[T]) Remove(h Handle) (e Entry[T], ok bool) {
	n, ok := q.handles[h]
	if !ok {
		return Entry[T]{}, false
	}
	return q.unlink(n, Removed), true
}

// Len is the number of queued entries.
func (q *Queue[T]) Len() int { return q.total }

// BandStats describes one band.
type BandStats struct {
	// Len is the number of entries queued; Tenants the number of tenants
	// among them.
	Len, Tenants int
	// Oldest is the arrival of the oldest entry (zero when empty).
	Oldest time.Time
}

// Stats describes every band, indexed by criticality.
func (q *Queue[T]) Stats() [reqclass.Count]BandStats {
	var s [reqclass.Count]BandStats
	for c := range q.bands {
		b := &q.bands[c]
		s[c] = BandStats{Len: b.n, Tenants: len(b.ring)}
		if b.head != nil {
			s[c].Oldest = b.head.e.Enqueued
		}
	}
	return s
}

func (q *Queue[T]) link(n *node[T]) {
	b := &q.bands[n.e.Class]
	n.bandPrev = b.tail
	if b.tail != nil {
		b.tail.bandNext = n
	} else {
		b.head = n
	}
	b.tail = n
	b.n++
	f := b.flows[n.e.Tenant]
	if f == nil {
		f = &flow[T]{tenant: n.e.Tenant}
		b.flows[n.e.Tenant] = f
		b.ring = append(b.ring, f)
	}
	n.flow = f
	n.flowPrev = f.tail
	if f.tail != nil {
		f.tail.flowNext = n
	} else {
		f.head = n
	}
	f.tail = n
	f.n++
	q.handles[n.e.Handle] = n
	q.total++
}

func (q *Queue[T]) unlink(n *node[T], o Outcome) Entry[T] {
	b := &q.bands[n.e.Class]
	if n.bandPrev != nil {
		n.bandPrev.bandNext = n.bandNext
	} else {
		b.head = n.bandNext
	}
	if n.bandNext != nil {
		n.bandNext.bandPrev = n.bandPrev
	} else {
		b.tail = n.bandPrev
	}
	b.n--
	f := n.flow
	if n.flowPrev != nil {
		n.flowPrev.flowNext = n.flowNext
	} else {
		f.head = n.flowNext
	}
	if n.flowNext != nil {
		n.flowNext.flowPrev = n.flowPrev
	} else {
		f.tail = n.flowPrev
	}
	f.n--
	if f.n == 0 {
		b.dropFlow(f)
	}
	delete(q.handles, n.e.Handle)
	q.total--
	e := n.e
	e.Outcome = o
	*n = node[T]{}
	return e
}

// dropFlow takes an empty flow out of the ring, keeping the cursor on the
// tenant that was to be served next.
func (b *band[T]) dropFlow(f *flow[T]) {
	delete(b.flows, f.tenant)
	for i, g := range b.ring {
		if g != f {
			continue
		}
		b.ring = slices.Delete(b.ring, i, i+1)
		if i < b.next {
			b.next--
		}
		break
	}
	if b.next >= len(b.ring) {
		b.next = 0
	}
}
