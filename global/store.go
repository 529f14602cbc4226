package global

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// received is a region's latest summary and when it arrived.
type received struct {
	s  *isobarpb.RegionSummary
	at time.Time
}

// store keeps the latest summary per region. Safe for concurrent use.
type store struct {
	mu   sync.Mutex
	sums map[string]received
}

func newStore() *store { return &store{sums: map[string]received{}} }

// snapshot copies the map (the summaries themselves are immutable).
func (st *store) snapshot() map[string]received {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[string]received, len(st.sums))
	for k, v := range st.sums {
		out[k] = v
	}
	return out
}

// hub hands each region its latest plan. Subscribers get a one-slot
// channel: a newer plan replaces an unread older one.
//
// A new subscriber gets the latest plan at once, with the issue time and
// validity the planner gave it and sent_at stamped now, so a region that
// reconnects while the leader cannot publish (etcd writes failing) gets
// only what is left of the plan's life, and an expired plan (on this
// member's clock) is not replayed at all.
type hub struct {
	now    func() time.Time
	mu     sync.Mutex
	latest *isobarpb.RoutingPlan
	subs   map[chan *isobarpb.RoutingPlan]string // channel → region
}

// newHub returns a hub that judges replay expiry on now.
func newHub(now func() time.Time) *hub {
	return &hub{now: now, subs: map[chan *isobarpb.RoutingPlan]string{}}
}

func (h *hub) subscribe(region string) (<-chan *isobarpb.RoutingPlan, func()) {
	ch := make(chan *isobarpb.RoutingPlan, 1)
	h.mu.Lock()
	h.subs[ch] = region
	if h.latest != nil && h.now().Before(h.latest.GetValidUntil().AsTime()) {
		ch <- forRegion(h.latest, region, h.now())
	}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

// publish sends each subscriber its region's part of p.
func (h *hub) publish(p *isobarpb.RoutingPlan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = p
	sent := h.now()
	for ch, region := range h.subs {
		part := forRegion(p, region, sent)
		select {
		case ch <- part:
		default:
			select { // drop the stale unread plan, keep the newest
			case <-ch:
			default:
			}
			ch <- part
		}
	}
}

// clear forgets the latest plan (leadership lost).
func (h *hub) clear() {
	h.mu.Lock()
	h.latest = nil
	h.mu.Unlock()
}

// forRegion keeps the model plans whose ingress is region, and the ingress
// addresses they route to (their slices' routes included), stamped as sent at sent (the region counts the
// plan's remaining life from it).
func forRegion(p *isobarpb.RoutingPlan, region string, sent time.Time) *isobarpb.RoutingPlan {
	out := &isobarpb.RoutingPlan{
		LeaderId: p.LeaderId, Epoch: p.Epoch, Sequence: p.Sequence, IssuedAt: p.IssuedAt, ValidUntil: p.ValidUntil,
		SentAt: timestamppb.New(sent),
	}
	dests := map[string]bool{}
	for _, mp := range p.Plans {
		if mp.IngressRegion != region {
			continue
		}
		out.Plans = append(out.Plans, mp)
		for _, r := range mp.Routes {
			dests[r.Destination] = true
		}
		for _, sl := range mp.Slices {
			for _, r := range sl.Routes {
				dests[r.Destination] = true
			}
		}
	}
	for _, in := range p.Ingress {
		if dests[in.Region] {
			out.Ingress = append(out.Ingress, in)
		}
	}
	return out
}
