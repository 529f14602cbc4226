package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/reqclass"
)

// TestEndpointCapFollowsMaxNumSeqs: an endpoint takes at most
// flowcontrol.EndpointCap requests in flight (its declared max_num_seqs,
// plus what its round trip and measured slot hold allow, under the
// configured cap); one that declares no batch takes the configured cap,
// and so does every endpoint without flow control. The request beyond the
// cap waits in the queue and is dispatched when a slot frees (429 without
// flow control).
func TestEndpointCapFollowsMaxNumSeqs(t *testing.T) {
	tests := []struct {
		name       string
		configured int
		seqs       uint32
		rtt, hold  time.Duration
		noQueue    bool
		want       int
	}{
		{name: "declares 4 seqs, nothing measured", configured: 64, seqs: 4, rtt: 50 * time.Millisecond, want: 4},
		{name: "declares 4 seqs, slot hold twice the round trip", configured: 64, seqs: 4, rtt: 50 * time.Millisecond, hold: 100 * time.Millisecond, want: 6},
		{name: "declares 4 seqs above the configured cap", configured: 3, seqs: 4, want: 3},
		{name: "unknown seqs: the configured cap", configured: 3, want: 3},
		{name: "no flow control: the configured cap", configured: 6, seqs: 4, noQueue: true, want: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := flowcontrol.EndpointCap(int64(tt.seqs), tt.rtt, tt.hold, tt.configured); got != tt.want && !tt.noQueue {
				t.Fatalf("flowcontrol.EndpointCap = %d, the case expects %d", got, tt.want)
			}
			r := newFlowRigWith(t, Config{MaxInflightPerEndpoint: tt.configured, NoQueue: tt.noQueue}, func(e *xds.Endpoint) {
				e.MaxNumSeqs, e.RTT = tt.seqs, tt.rtt
			})
			if tt.hold > 0 {
				for _, h := range r.g.tbl.Load().hosts {
					h.slotHold.Store(int64(tt.hold))
				}
			}
			for i := range tt.want + 1 {
				r.send("r"+strconv.Itoa(i), "", "a", "standard")
			}
			if tt.noQueue {
				// Every request is at the endpoint or refused: one 429 and
				// tt.want arrivals means the cap held.
				eventually.True(t, testTimeout, "one request refused", func() bool {
					r.mu.Lock()
					defer r.mu.Unlock()
					return len(r.codes) == 1
				})
				if n := len(r.arrivals(tt.want)); n != tt.want {
					t.Fatalf("%d requests reached the endpoint, want %d", n, tt.want)
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				for name, rec := range r.codes {
					if rec.Code != http.StatusTooManyRequests {
						t.Errorf("%s: %d, want 429", name, rec.Code)
					}
				}
				return
			}
			// Every request is either at the endpoint or queued: tt.want
			// arrivals and one waiter means the cap held.
			r.arrivals(tt.want)
			r.waiting(reqclass.Standard, 1)
			if n := len(r.up.arrived()); n != tt.want {
				t.Fatalf("%d requests reached the endpoint, want %d", n, tt.want)
			}
			r.up.release <- struct{}{}
			r.arrivals(tt.want + 1)
			r.waiting(reqclass.Standard, 0)
		})
	}
}

// TestYieldQueuesSheddableWhileStandardShort: once a standard request has
// gone unserved (refused: its band full), standard is short for its max
// age, and a sheddable arrival waits in the queue even though the
// endpoint has a free slot, while a standard arrival takes the slot; a
// freed slot is not given to the sheddable one either. When the yield
// ends its timer offers the queue and the sheddable request is served.
func TestYieldQueuesSheddableWhileStandardShort(t *testing.T) {
	q := flowcontrol.DefaultConfig()
	q.MaxLen[reqclass.Standard] = 1
	q.MaxAge[reqclass.Standard] = time.Second
	q.MaxAge[reqclass.Sheddable] = 10 * time.Second
	r := newFlowRigWith(t, Config{MaxInflightPerEndpoint: 1, Queue: q}, nil)
	r.send("held", "", "a", "standard")
	r.arrivals(1)
	r.send("std1", "", "a", "standard")
	r.waiting(reqclass.Standard, 1)
	r.send("std2", "", "a", "standard") // the band is full: refused, standard is short
	if rec := r.answer("std2"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("std2: %d, want 429 (standard band full)", rec.Code)
	}
	r.up.release <- struct{}{} // held ends: std1 takes the slot
	r.arrivals(2)
	r.up.release <- struct{}{} // std1 ends: the slot is free
	for _, n := range []string{"held", "std1"} {
		if c := r.answer(n).Code; c != http.StatusOK {
			t.Fatalf("%s: %d", n, c)
		}
	}
	r.send("shed", "", "b", "sheddable")
	r.waiting(reqclass.Sheddable, 1)
	if n := r.g.metric(t, "isobar_gateway_queue_yielded_total", map[string]string{"criticality": "sheddable"}); n != 1 {
		t.Errorf("yielded sheddable counted %v, want 1", n)
	}
	// Standard does not yield to itself: it takes the free slot.
	r.send("std3", "", "a", "standard")
	if got := r.arrivals(3); got[2] != "a/standard" {
		t.Fatalf("arrivals %v: the standard request must take the free slot", got)
	}
	r.up.release <- struct{}{} // std3 ends: its slot is not given to the yielding band
	if c := r.answer("std3").Code; c != http.StatusOK {
		t.Fatalf("std3: %d", c)
	}
	if s := r.g.QueueState()[reqclass.Sheddable]; s.Waiting != 1 || len(r.up.arrived()) != 3 {
		t.Fatalf("sheddable dispatched while standard was short: queue %+v, arrivals %v", s, r.up.arrived())
	}
	// The waiter's two timers (its max age, the yield's end) exist: move
	// the clock to the yield's end (standard's max age after the refusal).
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := r.clock.BlockUntilContext(ctx, 2); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(time.Second)
	if got := r.arrivals(4); got[3] != "b/sheddable" {
		t.Fatalf("arrivals %v: the sheddable request must be served once the yield ends", got)
	}
	r.up.release <- struct{}{}
	if c := r.answer("shed").Code; c != http.StatusOK {
		t.Errorf("shed: %d", c)
	}
}

// TestQueueEstimates: the queue is told the mean slot hold over the
// endpoints that have one, and the EWMA of send → first byte.
func TestQueueEstimates(t *testing.T) {
	var v atomic.Int64
	for _, d := range []time.Duration{0, -time.Second, time.Second, 2 * time.Second} {
		observeEWMA(&v, d)
	}
	if got, want := time.Duration(v.Load()), time.Second+time.Duration(slotHoldAlpha*float64(time.Second)); got != want {
		t.Errorf("EWMA %v, want %v (non-positive samples left out, the first taken whole)", got, want)
	}
	g := &Gateway{}
	if d := g.meanSlotHold(); d != 0 {
		t.Errorf("mean slot hold without a table %v, want 0", d)
	}
	tb := &table{hosts: []*hostState{{}, {}, {}}}
	tb.hosts[0].slotHold.Store(int64(time.Second))
	tb.hosts[2].slotHold.Store(int64(3 * time.Second))
	g.tbl.Store(tb)
	if d := g.meanSlotHold(); d != 2*time.Second {
		t.Errorf("mean slot hold %v, want 2s (the endpoint without one left out)", d)
	}
}
