package flowcontrol

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func cfg(crit, std, shed, total int) Config {
	c := DefaultConfig()
	c.MaxLen = [reqclass.Count]int{crit, std, shed}
	c.MaxTotal = total
	return c
}

// fifo is cfg with every band oldest first.
func fifo(crit, std, shed, total int) Config {
	c := cfg(crit, std, shed, total)
	c.NewestFirst = [reqclass.Count]bool{}
	return c
}

func mustNew(t *testing.T, c Config) *Queue[string] {
	t.Helper()
	q, err := New[string](c)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func push(t *testing.T, q *Queue[string], now time.Time, c reqclass.Criticality, tenant, p string) []Entry[string] {
	t.Helper()
	_, out, err := q.Push(now, c, tenant, p)
	if err != nil {
		t.Fatalf("push %s: %v", p, err)
	}
	return out
}

func drain(q *Queue[string], now time.Time) []string {
	var got []string
	for {
		e, ok, _ := q.Pop(now)
		if !ok {
			return got
		}
		if e.Outcome != Dispatched {
			panic("pop returned " + e.Outcome.String())
		}
		got = append(got, e.Payload)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"default", func(*Config) {}, true},
		{"zero band allowed", func(c *Config) { c.MaxLen[reqclass.Sheddable] = 0; c.MaxAge[reqclass.Sheddable] = 0 }, true},
		{"negative length", func(c *Config) { c.MaxLen[reqclass.Standard] = -1 }, false},
		{"huge length", func(c *Config) { c.MaxLen[reqclass.Standard] = MaxBound + 1 }, false},
		{"no age", func(c *Config) { c.MaxAge[reqclass.Critical] = 0 }, false},
		{"negative total", func(c *Config) { c.MaxTotal = -1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			_, err := New[int](c)
			if (err == nil) != tc.ok {
				t.Fatalf("New: err %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestBandBound(t *testing.T) {
	q := mustNew(t, cfg(2, 2, 2, 0))
	push(t, q, at(0), reqclass.Standard, "a", "s1")
	push(t, q, at(0), reqclass.Standard, "b", "s2")
	if _, _, err := q.Push(at(0), reqclass.Standard, "b", "s3"); !errors.Is(err, ErrBandFull) {
		t.Fatalf("third standard: err %v, want ErrBandFull", err)
	}
	// A full critical band is refused even with less important entries
	// queued: the band bound is the class's own.
	push(t, q, at(0), reqclass.Critical, "a", "c1")
	push(t, q, at(0), reqclass.Critical, "a", "c2")
	if _, out, err := q.Push(at(0), reqclass.Critical, "a", "c3"); !errors.Is(err, ErrBandFull) || len(out) != 0 {
		t.Fatalf("third critical: err %v out %v, want ErrBandFull and nothing out", err, out)
	}
	if q.Len() != 4 {
		t.Fatalf("len %d, want 4", q.Len())
	}
	if _, _, err := q.Push(at(0), reqclass.Criticality(7), "a", "x"); !errors.Is(err, ErrClass) {
		t.Fatalf("bad class: %v", err)
	}
}

func TestEviction(t *testing.T) {
	for _, tc := range []struct {
		name    string
		queued  []reqclass.Criticality
		arrival reqclass.Criticality
		err     error
		evicted string
	}{
		{"critical evicts oldest sheddable", []reqclass.Criticality{reqclass.Sheddable, reqclass.Standard, reqclass.Sheddable}, reqclass.Critical, nil, "q0"},
		{"critical evicts standard when no sheddable", []reqclass.Criticality{reqclass.Standard, reqclass.Critical, reqclass.Standard}, reqclass.Critical, nil, "q0"},
		{"standard evicts sheddable", []reqclass.Criticality{reqclass.Standard, reqclass.Sheddable, reqclass.Sheddable}, reqclass.Standard, nil, "q1"},
		{"standard never evicts standard", []reqclass.Criticality{reqclass.Standard, reqclass.Critical, reqclass.Standard}, reqclass.Standard, ErrQueueFull, ""},
		{"sheddable never evicts", []reqclass.Criticality{reqclass.Sheddable, reqclass.Sheddable, reqclass.Sheddable}, reqclass.Sheddable, ErrQueueFull, ""},
		{"critical never evicts critical", []reqclass.Criticality{reqclass.Critical, reqclass.Critical, reqclass.Critical}, reqclass.Critical, ErrQueueFull, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, cfg(4, 4, 4, 3))
			for i, c := range tc.queued {
				push(t, q, at(i), c, "t", fmt.Sprintf("q%d", i))
			}
			_, out, err := q.Push(at(10), tc.arrival, "t", "new")
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if tc.evicted == "" {
				if len(out) != 0 || q.Len() != 3 {
					t.Fatalf("out %v len %d, want nothing out and 3", out, q.Len())
				}
				return
			}
			if len(out) != 1 || out[0].Payload != tc.evicted || out[0].Outcome != Evicted {
				t.Fatalf("out %+v, want %s evicted", out, tc.evicted)
			}
			if q.Len() != 3 {
				t.Fatalf("len %d, want 3", q.Len())
			}
			if _, ok := q.Remove(out[0].Handle); ok {
				t.Fatal("the evicted entry's handle still removes something")
			}
		})
	}
}

// TestOrderStrictPriority: the most important band first; within a band
// oldest first, or newest first in a NewestFirst band (the defaults:
// standard and sheddable), both through Pop and through Dispatch.
func TestOrderStrictPriority(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"defaults: critical oldest first, the others newest first", cfg(8, 8, 8, 0), "[c1 c2 s2 s1 d2 d1]"},
		{"every band oldest first", fifo(8, 8, 8, 0), "[c1 c2 s1 s2 d1 d2]"},
	} {
		for _, viaDispatch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/dispatch=%v", tc.name, viaDispatch), func(t *testing.T) {
				q := mustNew(t, tc.c)
				push(t, q, at(0), reqclass.Sheddable, "a", "d1")
				push(t, q, at(1), reqclass.Standard, "a", "s1")
				push(t, q, at(2), reqclass.Critical, "a", "c1")
				push(t, q, at(3), reqclass.Standard, "a", "s2")
				push(t, q, at(4), reqclass.Critical, "a", "c2")
				push(t, q, at(5), reqclass.Sheddable, "a", "d2")
				var got []string
				if viaDispatch {
					for {
						e, ok, _ := q.Dispatch(at(6), func(Entry[string]) bool { return true })
						if !ok {
							break
						}
						got = append(got, e.Payload)
					}
				} else {
					got = drain(q, at(6))
				}
				if fmt.Sprint(got) != tc.want {
					t.Fatalf("order %v, want %s", got, tc.want)
				}
				if q.Len() != 0 {
					t.Fatalf("len %d after drain", q.Len())
				}
			})
		}
	}
}

// TestTenantFairness: a tenant queueing five times as much as another gets
// one turn per round, so the quiet tenant's requests all leave among the
// first 2·n dispatches, and the noisy one's in its own order.
func TestTenantFairness(t *testing.T) {
	q := mustNew(t, fifo(64, 64, 64, 0))
	ms := 0
	for i := range 5 {
		for j := range 5 {
			push(t, q, at(ms), reqclass.Standard, "noisy", fmt.Sprintf("n%d", i*5+j))
			ms++
		}
		push(t, q, at(ms), reqclass.Standard, "quiet", fmt.Sprintf("q%d", i))
		ms++
	}
	got := drain(q, at(ms))
	want := []string{"n0", "q0", "n1", "q1", "n2", "q2", "n3", "q3", "n4", "q4"}
	if fmt.Sprint(got[:10]) != fmt.Sprint(want) {
		t.Fatalf("first ten %v, want %v", got[:10], want)
	}
	for i, p := range got[10:] {
		if p != fmt.Sprintf("n%d", i+5) {
			t.Fatalf("tail %v: the noisy tenant's own order broken", got[10:])
		}
	}
}

// TestFairnessThreeTenants checks the cursor when a tenant's flow empties
// mid-round and a new tenant arrives.
func TestFairnessThreeTenants(t *testing.T) {
	q := mustNew(t, fifo(64, 64, 64, 0))
	push(t, q, at(0), reqclass.Standard, "a", "a1")
	push(t, q, at(0), reqclass.Standard, "a", "a2")
	push(t, q, at(0), reqclass.Standard, "b", "b1")
	push(t, q, at(0), reqclass.Standard, "c", "c1")
	push(t, q, at(0), reqclass.Standard, "c", "c2")
	e, _, _ := q.Pop(at(1)) // a1
	if e.Payload != "a1" {
		t.Fatalf("first %s", e.Payload)
	}
	e, _, _ = q.Pop(at(1)) // b1: b leaves the ring
	if e.Payload != "b1" {
		t.Fatalf("second %s", e.Payload)
	}
	push(t, q, at(1), reqclass.Standard, "d", "d1")
	got := fmt.Sprint(drain(q, at(2)))
	if want := "[c1 d1 a2 c2]"; got != want {
		t.Fatalf("rest %s, want %s", got, want)
	}
}

func TestExpiry(t *testing.T) {
	c := cfg(8, 8, 8, 0)
	c.MaxAge = [reqclass.Count]time.Duration{100 * time.Millisecond, 50 * time.Millisecond, 10 * time.Millisecond}
	q := mustNew(t, c)
	push(t, q, at(0), reqclass.Sheddable, "a", "d1")
	push(t, q, at(0), reqclass.Standard, "a", "s1")
	push(t, q, at(5), reqclass.Sheddable, "a", "d2")
	push(t, q, at(0), reqclass.Critical, "a", "c1")
	if next, ok := q.NextExpiry(); !ok || !next.Equal(at(10)) {
		t.Fatalf("next expiry %v %v, want %v", next, ok, at(10))
	}
	if out := q.Expire(at(9)); len(out) != 0 {
		t.Fatalf("expired early: %v", out)
	}
	out := q.Expire(at(10))
	if len(out) != 1 || out[0].Payload != "d1" || out[0].Outcome != Expired {
		t.Fatalf("at 10 ms: %+v, want d1 expired", out)
	}
	// Pop takes out what expired on the way and never dispatches it.
	e, ok, expired := q.Pop(at(60))
	if !ok || e.Payload != "c1" {
		t.Fatalf("pop %v %v, want c1", e.Payload, ok)
	}
	if len(expired) != 2 || expired[0].Payload != "s1" || expired[1].Payload != "d2" {
		t.Fatalf("expired %+v, want s1 and d2", expired)
	}
	// An earlier now is taken as the latest seen: nothing comes back.
	if _, ok, _ := q.Pop(at(0)); ok || q.Len() != 0 {
		t.Fatalf("queue not empty: %d", q.Len())
	}
	if _, ok := q.NextExpiry(); ok {
		t.Fatal("next expiry on an empty queue")
	}
	// Push expires first, so expired entries free their room.
	c2 := cfg(1, 1, 1, 0)
	c2.MaxAge = c.MaxAge
	q2 := mustNew(t, c2)
	push(t, q2, at(0), reqclass.Sheddable, "a", "old")
	out = push(t, q2, at(20), reqclass.Sheddable, "a", "new")
	if len(out) != 1 || out[0].Payload != "old" || out[0].Outcome != Expired {
		t.Fatalf("push out %+v, want old expired", out)
	}
}

func TestRemoveAndStats(t *testing.T) {
	q := mustNew(t, cfg(8, 8, 8, 0))
	h, _, _ := q.Push(at(0), reqclass.Standard, "a", "s1")
	push(t, q, at(1), reqclass.Standard, "b", "s2")
	push(t, q, at(2), reqclass.Critical, "a", "c1")
	s := q.Stats()
	if s[reqclass.Standard].Len != 2 || s[reqclass.Standard].Tenants != 2 || !s[reqclass.Standard].Oldest.Equal(at(0)) || s[reqclass.Critical].Len != 1 {
		t.Fatalf("stats %+v", s)
	}
	e, ok := q.Remove(h)
	if !ok || e.Payload != "s1" || e.Outcome != Removed {
		t.Fatalf("remove: %+v %v", e, ok)
	}
	if _, ok := q.Remove(h); ok {
		t.Fatal("removed twice")
	}
	if got := fmt.Sprint(drain(q, at(3))); got != "[c1 s2]" {
		t.Fatalf("after remove %s", got)
	}
	if s := q.Stats(); s[reqclass.Standard].Tenants != 0 {
		t.Fatalf("tenants left behind: %+v", s)
	}
}

// TestInvariantsRandom drives the queue with a deterministic mix and
// checks the bounds after every call.
func TestInvariantsRandom(t *testing.T) {
	c := cfg(5, 7, 9, 12)
	c.MaxAge = [reqclass.Count]time.Duration{40 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond}
	q, err := New[int](c)
	if err != nil {
		t.Fatal(err)
	}
	queued := map[Handle]bool{}
	x := uint32(1)
	rnd := func(n int) int { x = x*1664525 + 1013904223; return int(x>>8) % n }
	for step := range 5000 {
		now := at(step)
		var out []Entry[int]
		switch rnd(3) {
		case 0, 1:
			h, o, err := q.Push(now, reqclass.Criticality(rnd(3)), fmt.Sprint(rnd(4)), step)
			if err == nil {
				queued[h] = true
			}
			out = o
		case 2:
			e, ok, o := q.Pop(now)
			if ok {
				if !queued[e.Handle] || now.Sub(e.Enqueued) >= c.MaxAge[e.Class] {
					t.Fatalf("step %d: dispatched %+v", step, e)
				}
				delete(queued, e.Handle)
			}
			out = o
		}
		for _, e := range out {
			if !queued[e.Handle] {
				t.Fatalf("step %d: %+v left twice", step, e)
			}
			delete(queued, e.Handle)
		}
		s := q.Stats()
		sum := 0
		for cl, b := range s {
			if b.Len > c.MaxLen[cl] {
				t.Fatalf("step %d: band %d holds %d", step, cl, b.Len)
			}
			sum += b.Len
		}
		if sum != q.Len() || q.Len() > c.MaxTotal || q.Len() != len(queued) {
			t.Fatalf("step %d: len %d sum %d tracked %d", step, q.Len(), sum, len(queued))
		}
	}
}

func BenchmarkPushPop(b *testing.B) {
	q, _ := New[int](DefaultConfig())
	tenants := []string{"a", "b", "c", "d"}
	for i := 0; b.Loop(); i++ {
		now := at(i)
		_, _, _ = q.Push(now, reqclass.Criticality(i%3), tenants[i%4], i)
		if i%2 == 1 {
			q.Pop(now)
			q.Pop(now)
		}
	}
}

// TestDispatchEligible: Dispatch keeps the dispatch order among the
// entries the caller can serve, and moves the round-robin past the tenant
// served.
func TestDispatchEligible(t *testing.T) {
	q := mustNew(t, cfg(8, 8, 8, 0))
	push(t, q, at(0), reqclass.Critical, "a", "c-x")
	push(t, q, at(1), reqclass.Standard, "a", "s-a1-y")
	push(t, q, at(2), reqclass.Standard, "a", "s-a2-x")
	push(t, q, at(3), reqclass.Standard, "b", "s-b1-x")
	push(t, q, at(4), reqclass.Standard, "c", "s-c1-x")
	onlyX := func(e Entry[string]) bool { return e.Payload[len(e.Payload)-1] == 'x' }
	var got []string
	for {
		e, ok, _ := q.Dispatch(at(5), onlyX)
		if !ok {
			break
		}
		got = append(got, e.Payload)
	}
	// a's first x entry is behind its y entry; after a, b then c are due.
	if want := "[c-x s-a2-x s-b1-x s-c1-x]"; fmt.Sprint(got) != want {
		t.Fatalf("dispatched %v, want %s", got, want)
	}
	if q.Len() != 1 {
		t.Fatalf("len %d, want the y entry left", q.Len())
	}
	if _, ok, _ := q.Dispatch(at(5), func(Entry[string]) bool { return false }); ok {
		t.Fatal("dispatched what the caller refused")
	}
}

// FuzzQueueOps drives a queue with the operations the bytes spell (push,
// pop, dispatch, expire, remove, time steps) and checks after every one
// that the bounds hold, every entry leaves once, and nothing expired is
// dispatched.
func FuzzQueueOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 16, 32, 48, 2, 2, 2, 5, 5})
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := cfg(2, 3, 4, 5)
		c.MaxAge = [reqclass.Count]time.Duration{40 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond}
		q, err := New[int](c)
		if err != nil {
			t.Fatal(err)
		}
		queued := map[Handle]bool{}
		var handles []Handle
		ms := 0
		leave := func(out []Entry[int]) {
			for _, e := range out {
				if !queued[e.Handle] {
					t.Fatalf("%+v left twice or never entered", e)
				}
				delete(queued, e.Handle)
			}
		}
		for i, op := range ops {
			now := at(ms)
			switch op % 6 {
			case 0:
				h, out, err := q.Push(now, reqclass.Criticality(op/6%3), fmt.Sprint(op/18%3), i)
				leave(out)
				if err == nil {
					queued[h] = true
					handles = append(handles, h)
				}
			case 1, 2:
				var e Entry[int]
				var ok bool
				var out []Entry[int]
				if op%6 == 1 {
					e, ok, out = q.Pop(now)
				} else {
					e, ok, out = q.Dispatch(now, func(e Entry[int]) bool { return e.Payload%2 == int(op/6%2) })
				}
				leave(out)
				if ok {
					if now.Sub(e.Enqueued) >= c.MaxAge[e.Class] {
						t.Fatalf("dispatched expired %+v at %v", e, now)
					}
					leave([]Entry[int]{e})
				}
			case 3:
				leave(q.Expire(now))
			case 4:
				if len(handles) > 0 {
					if e, ok := q.Remove(handles[int(op/6)%len(handles)]); ok {
						leave([]Entry[int]{e})
					}
				}
			case 5:
				ms += int(op / 6)
			}
			s := q.Stats()
			sum := 0
			for cl, b := range s {
				if b.Len > c.MaxLen[cl] || b.Tenants > b.Len {
					t.Fatalf("band %d: %+v", cl, b)
				}
				sum += b.Len
			}
			if sum != q.Len() || q.Len() > c.MaxTotal || q.Len() != len(queued) {
				t.Fatalf("len %d sum %d tracked %d", q.Len(), sum, len(queued))
			}
		}
	})
}

// TestTenantFairnessNewestFirst: in a NewestFirst band the round-robin
// between tenants is unchanged; each tenant's own entries leave newest
// first.
func TestTenantFairnessNewestFirst(t *testing.T) {
	q := mustNew(t, cfg(64, 64, 64, 0))
	ms := 0
	for i := range 5 {
		for j := range 5 {
			push(t, q, at(ms), reqclass.Standard, "noisy", fmt.Sprintf("n%d", i*5+j))
			ms++
		}
		push(t, q, at(ms), reqclass.Standard, "quiet", fmt.Sprintf("q%d", i))
		ms++
	}
	got := drain(q, at(ms))
	want := []string{"n24", "q4", "n23", "q3", "n22", "q2", "n21", "q1", "n20", "q0", "n19"}
	if fmt.Sprint(got[:11]) != fmt.Sprint(want) {
		t.Fatalf("first eleven %v, want %v", got[:11], want)
	}
}

// TestDisplacementHeaviestTenant: when the queue must displace an entry
// it takes the oldest entry of the tenant holding the most in the victim
// band (the oldest tenant's on ties), not the band's oldest; a full band
// displaces its heaviest tenant's entry for a tenant holding at least two
// fewer, and refuses otherwise.
func TestDisplacementHeaviestTenant(t *testing.T) {
	type q struct {
		class  reqclass.Criticality
		tenant string
	}
	shed, std, crit := reqclass.Sheddable, reqclass.Standard, reqclass.Critical
	for _, tc := range []struct {
		name    string
		c       Config
		queued  []q
		arrival q
		err     error
		evicted string // payload "e<i>": the i-th queued entry
	}{
		{"critical evicts the heaviest sheddable tenant's oldest, not the band's oldest", cfg(8, 8, 8, 4),
			[]q{{shed, "quiet"}, {shed, "loud"}, {shed, "loud"}, {shed, "loud"}}, q{crit, "quiet"}, nil, "e1"},
		{"tie: the tenant with the oldest entry", cfg(8, 8, 8, 2),
			[]q{{shed, "b"}, {shed, "a"}}, q{crit, "a"}, nil, "e0"},
		{"a less important band before the arrival's own", cfg(8, 8, 8, 4),
			[]q{{std, "loud"}, {std, "loud"}, {std, "loud"}, {shed, "quiet"}}, q{std, "quiet"}, nil, "e3"},
		{"full queue, nothing below: the own band's heaviest tenant", cfg(8, 8, 8, 3),
			[]q{{std, "loud"}, {std, "loud"}, {std, "loud"}}, q{std, "quiet"}, nil, "e0"},
		{"full queue, nothing below: the heaviest tenant itself is refused", cfg(8, 8, 8, 3),
			[]q{{std, "loud"}, {std, "loud"}, {std, "quiet"}}, q{std, "loud"}, ErrQueueFull, ""},
		{"full band: a tenant two entries lighter displaces", cfg(8, 3, 8, 0),
			[]q{{std, "quiet"}, {std, "loud"}, {std, "loud"}}, q{std, "new"}, nil, "e1"},
		{"full band: one entry lighter is refused (no ping-pong)", cfg(8, 3, 8, 0),
			[]q{{std, "quiet"}, {std, "loud"}, {std, "loud"}}, q{std, "quiet"}, ErrBandFull, ""},
		{"full band of equals: refused", cfg(8, 2, 8, 0),
			[]q{{std, "a"}, {std, "b"}}, q{std, "c"}, ErrBandFull, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qu := mustNew(t, tc.c)
			for i, e := range tc.queued {
				push(t, qu, at(i), e.class, e.tenant, fmt.Sprintf("e%d", i))
			}
			n := qu.Len()
			_, out, err := qu.Push(at(10), tc.arrival.class, tc.arrival.tenant, "new")
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if tc.evicted == "" {
				if len(out) != 0 || qu.Len() != n {
					t.Fatalf("out %v len %d, want nothing out and %d", out, qu.Len(), n)
				}
				return
			}
			if len(out) != 1 || out[0].Payload != tc.evicted || out[0].Outcome != Evicted {
				t.Fatalf("out %+v, want %s evicted", out, tc.evicted)
			}
			if qu.Len() != n {
				t.Fatalf("len %d, want %d", qu.Len(), n)
			}
		})
	}
}

// TestYieldWhileShort: once a standard request leaves unserved, sheddable
// yields (Pop and Dispatch pass over it, Yields says so) until standard
// has gone its MaxAge, or the slot hold when longer, without a loss;
// critical never yields; with Yield off nothing does.
func TestYieldWhileShort(t *testing.T) {
	c := cfg(8, 1, 8, 0)
	c.MaxAge = [reqclass.Count]time.Duration{time.Second, 100 * time.Millisecond, time.Second}
	q := mustNew(t, c)
	push(t, q, at(0), reqclass.Sheddable, "a", "d1")
	if _, y := q.Yields(at(0), reqclass.Sheddable); y {
		t.Fatal("sheddable yields before any loss")
	}
	push(t, q, at(0), reqclass.Standard, "a", "s1")
	if _, _, err := q.Push(at(1), reqclass.Standard, "a", "s2"); !errors.Is(err, ErrBandFull) {
		t.Fatalf("second standard: %v", err)
	}
	until, y := q.Yields(at(1), reqclass.Sheddable)
	if !y || !until.Equal(at(101)) {
		t.Fatalf("sheddable yields %v until %v, want until %v", y, until, at(101))
	}
	if _, y := q.Yields(at(1), reqclass.Standard); y {
		t.Fatal("standard yields to nothing short")
	}
	if _, y := q.Yields(at(1), reqclass.Critical); y {
		t.Fatal("critical yields")
	}
	if e, ok, _ := q.Pop(at(2)); !ok || e.Payload != "s1" {
		t.Fatalf("pop %v %v, want s1", e.Payload, ok)
	}
	if _, ok, _ := q.Pop(at(3)); ok {
		t.Fatal("popped a sheddable entry while standard is short")
	}
	if _, ok, _ := q.Dispatch(at(3), func(Entry[string]) bool { return true }); ok {
		t.Fatal("dispatched a sheddable entry while standard is short")
	}
	if e, ok, _ := q.Pop(at(101)); !ok || e.Payload != "d1" {
		t.Fatalf("pop after the shortfall %v %v, want d1", e.Payload, ok)
	}
	// An expiry counts as a loss from its expiry instant; a slot hold
	// longer than MaxAge lengthens the shortfall.
	q.SetSlotHold(300 * time.Millisecond)
	push(t, q, at(200), reqclass.Standard, "a", "s3")
	if out := q.Expire(at(400)); len(out) != 1 {
		t.Fatalf("expired %v", out)
	}
	if until, y := q.Yields(at(400), reqclass.Sheddable); !y || !until.Equal(at(600)) {
		t.Fatalf("sheddable yields %v until %v, want until %v", y, until, at(600))
	}
	// Displacement: the displaced band is short.
	c3 := cfg(8, 8, 8, 1)
	q3 := mustNew(t, c3)
	push(t, q3, at(0), reqclass.Standard, "a", "s")
	push(t, q3, at(1), reqclass.Critical, "a", "c")
	if _, y := q3.Yields(at(2), reqclass.Sheddable); !y {
		t.Fatal("a displaced standard entry does not make sheddable yield")
	}
	c3.Yield = false
	q4 := mustNew(t, c3)
	push(t, q4, at(0), reqclass.Standard, "a", "s")
	push(t, q4, at(1), reqclass.Critical, "a", "c")
	if _, y := q4.Yields(at(2), reqclass.Sheddable); y {
		t.Fatal("yields with Yield off")
	}
}

// TestObjectiveAge: in an Objective band an entry expires once its wait
// plus the current time to first token (SetTTFT) reaches MaxAge; a band
// whose MaxAge is not an objective (critical by default) waits its full
// MaxAge; a TTFT beyond MaxAge expires the entry at once.
func TestObjectiveAge(t *testing.T) {
	c := cfg(8, 8, 8, 0)
	c.MaxAge = [reqclass.Count]time.Duration{1000 * time.Millisecond, 1000 * time.Millisecond, 1000 * time.Millisecond}
	q := mustNew(t, c)
	q.SetTTFT(300 * time.Millisecond)
	push(t, q, at(0), reqclass.Critical, "a", "c")
	push(t, q, at(0), reqclass.Standard, "a", "s")
	if next, ok := q.NextExpiry(); !ok || !next.Equal(at(700)) {
		t.Fatalf("next expiry %v, want %v", next, at(700))
	}
	if out := q.Expire(at(699)); len(out) != 0 {
		t.Fatalf("expired early: %+v", out)
	}
	if out := q.Expire(at(700)); len(out) != 1 || out[0].Payload != "s" {
		t.Fatalf("at 700 ms %+v, want s expired", out)
	}
	if out := q.Expire(at(999)); len(out) != 0 {
		t.Fatalf("critical expired before its MaxAge: %+v", out)
	}
	q.SetTTFT(2 * time.Second)
	if out := push(t, q, at(1000), reqclass.Sheddable, "a", "d"); len(out) != 1 || out[0].Payload != "c" {
		t.Fatalf("push at 1 s: %+v, want c expired (its MaxAge)", out)
	}
	if out := q.Expire(at(1000)); len(out) != 1 || out[0].Payload != "d" {
		t.Fatalf("at 1 s %+v, want d expired (TTFT past the objective)", out)
	}
	c.Objective = [reqclass.Count]bool{}
	q2 := mustNew(t, c)
	q2.SetTTFT(300 * time.Millisecond)
	push(t, q2, at(0), reqclass.Standard, "a", "s")
	if out := q2.Expire(at(700)); len(out) != 0 {
		t.Fatalf("without Objective the TTFT shortened the wait: %+v", out)
	}
}
