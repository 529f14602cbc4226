package regional

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// endpointsOf flattens a state to cell → endpoint.
func endpointsOf(st xds.State) map[string]xds.Endpoint {
	out := map[string]xds.Endpoint{}
	for _, m := range st.Models {
		for _, l := range m.Localities {
			for _, e := range l.Endpoints {
				out[e.CellID] = e
			}
		}
	}
	return out
}

// localityOf returns the locality of region in st's first model.
func localityOf(t *testing.T, st xds.State, region string) xds.Locality {
	t.Helper()
	for _, l := range st.Models[0].Localities {
		if l.Region == region {
			return l
		}
	}
	t.Fatalf("no locality %s in %+v", region, st.Models[0].Localities)
	return xds.Locality{}
}

// tickUntilPush runs up to n cycles, the cells of alive heartbeating
// every other cycle, and returns the first state pushed.
func (f *regFixture) tickUntilPush(n int, alive ...*isobarpb.CellHeartbeat) (xds.State, bool) {
	f.t.Helper()
	for i := range n {
		select {
		case st := <-f.push.pushed:
			return st, true
		default:
		}
		if i%2 == 0 {
			for _, hb := range alive {
				hb = proto.Clone(hb).(*isobarpb.CellHeartbeat)
				hb.Sequence = 0
				f.send(hb)
			}
		}
		f.tick()
	}
	select {
	case st := <-f.push.pushed:
		return st, true
	case <-time.After(100 * time.Millisecond):
		return xds.State{}, false
	}
}

// regionRTTs is a settable stand-in for gossip's RTT per region.
type regionRTTs struct {
	mu sync.Mutex
	m  map[string]time.Duration
}

func (r *regionRTTs) set(region string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[region] = d
}

func (r *regionRTTs) get() map[string]time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Duration, len(r.m))
	for k, v := range r.m {
		out[k] = v
	}
	return out
}

// The xDS state carries what the data plane's pick needs: each local
// endpoint's declared capacity (prefill rate, batch cap) from its
// heartbeat, the local locality its cells' median probed RTT and jitter (a
// cell that stands apart its own), and each remote locality the gossip RTT
// to its region. A round trip that drifts materially is pushed again (at
// most once per cycle.PlacementRepush); probe noise is not.
func TestBuildStatePlacementInputs(t *testing.T) {
	rtts := &regionRTTs{m: map[string]time.Duration{"r2": 60 * time.Millisecond}}
	f := newFixtureWith(t, func(*Config) {}, func(r *Registry) { r.regionRTT = rtts.get })
	a := heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
	a.Capability.PrefillTokensPerS, a.Capability.MaxNumSeqs = 30000, 12
	f.send(a)
	st, ok := f.tickUntilPush(5)
	if !ok {
		t.Fatal("no push for the new cell")
	}
	got := endpointsOf(st)["a"]
	if got.PrefillTokensPerSecond != 30000 || got.MaxNumSeqs != 12 || got.RTT != 0 || got.Jitter != 0 {
		t.Fatalf("endpoint a = %+v, want 30000 tokens/s, 12 seqs, RTT unknown before any probe", got)
	}
	if cv, _ := f.reg.View().Cell("a"); cv.PrefillTokensPerSecond != 30000 || cv.MaxNumSeqs != 12 {
		t.Errorf("view of a = %v tokens/s %d seqs", cv.PrefillTokensPerSecond, cv.MaxNumSeqs)
	}
	// A cell that declares nothing carries nothing.
	b := heartbeat("b", "127.0.0.1:1002", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
	f.send(b)
	if st, ok = f.tickUntilPush(5); !ok {
		t.Fatal("no push for the second cell")
	}
	if eb := endpointsOf(st)["b"]; eb.PrefillTokensPerSecond != 0 || eb.MaxNumSeqs != 0 || eb.RTT != 0 {
		t.Fatalf("endpoint b = %+v, want nothing declared", eb)
	}

	// The first probe is pushed, within cycle.PlacementRepush, as the local
	// locality's round trip: the median over the probed cells.
	probe := func(id string, rtt, jitter time.Duration) {
		t.Helper()
		if err := f.reg.submitProbes(t.Context(), []probeResult{{id: id, rtt: rtt, jitter: jitter, ok: true}}); err != nil {
			t.Fatal(err)
		}
	}
	probe("a", 400*time.Microsecond, 50*time.Microsecond)
	cycles := int(cycle.PlacementRepush/f.reg.cfg.CycleInterval) + 5
	if st, ok = f.tickUntilPush(cycles, a, b); !ok {
		t.Fatal("the first probe of a was never pushed")
	}
	if l := localityOf(t, st, "r1"); l.RTT != 400*time.Microsecond || l.Jitter != 50*time.Microsecond {
		t.Fatalf("local locality RTT %v jitter %v, want a's 400µs and 50µs", l.RTT, l.Jitter)
	}
	if got := endpointsOf(st)["a"]; got.RTT != 0 || got.Jitter != 0 || got.PrefillTokensPerSecond != 30000 {
		t.Fatalf("endpoint a after its probe = %+v, want its locality's round trip and its rate", got)
	}
	// A cell whose round trip stands apart from its locality's carries its
	// own; the locality keeps the median.
	probe("b", 5*time.Millisecond, 100*time.Microsecond)
	if st, ok = f.tickUntilPush(cycles, a, b); !ok {
		t.Fatal("b's distant round trip was never pushed")
	}
	if got := endpointsOf(st)["b"]; got.RTT != 5*time.Millisecond || got.Jitter != 100*time.Microsecond {
		t.Fatalf("endpoint b = %+v, want its own 5ms round trip", got)
	}
	if got := endpointsOf(st)["a"]; got.RTT != 0 {
		t.Errorf("endpoint a = %+v, want none of its own", got)
	}
	if l := localityOf(t, st, "r1"); l.RTT != 400*time.Microsecond || l.Jitter != 50*time.Microsecond {
		t.Fatalf("local locality RTT %v jitter %v, want the median 400µs and 50µs", l.RTT, l.Jitter)
	}
	// Noise below the tolerance is not worth a push.
	probe("a", 700*time.Microsecond, 80*time.Microsecond)
	if st, ok = f.tickUntilPush(cycles, a, b); ok {
		t.Fatalf("a sub-millisecond change was pushed: %+v", st)
	}

	// A remote locality carries the gossip RTT to its region.
	table := &RouteTable{Source: RoutesPlan, Epoch: 1, Sequence: 1,
		Models:  map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.75, "r2": 0.25}}},
		Ingress: map[string]string{"r2": "127.0.0.2:9000"}}
	if err := f.reg.SetRoutes(t.Context(), table); err != nil {
		t.Fatal(err)
	}
	if st, ok = f.tickUntilPush(5); !ok {
		t.Fatal("no push for the routes")
	}
	if l := localityOf(t, st, "r2"); l.RTT != 60*time.Millisecond || l.Jitter != 0 {
		t.Fatalf("remote locality r2 RTT %v jitter %v, want 60ms and unknown", l.RTT, l.Jitter)
	}
	// Nor does it ride along with another push: the locality keeps the
	// round trip sent while the median stays within the tolerance of it
	// (cycle.Placement.Held), so the assignments do not change with it.
	if l := localityOf(t, st, "r1"); l.RTT != 400*time.Microsecond || l.Jitter != 50*time.Microsecond {
		t.Errorf("local locality RTT %v jitter %v, want the 400µs and 50µs sent: 700µs is within the tolerance", l.RTT, l.Jitter)
	}
	rtts.set("r2", 63*time.Millisecond) // within a tenth
	if st, ok = f.tickUntilPush(cycles, a, b); ok {
		t.Fatalf("a 5%% RTT change was pushed: %+v", localityOf(t, st, "r2"))
	}
	rtts.set("r2", 90*time.Millisecond)
	if st, ok = f.tickUntilPush(cycles, a, b); !ok {
		t.Fatal("a 50% RTT change was never pushed")
	}
	if l := localityOf(t, st, "r2"); l.RTT != 90*time.Millisecond {
		t.Fatalf("remote locality r2 RTT %v, want 90ms", l.RTT)
	}
}

// A heartbeat whose declared capacity is not a number, negative or absurd
// is refused, like any corrupt field.
func TestValidateHeartbeatCapacity(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rate    float64
		seqs    uint32
		invalid bool
	}{
		{"unknown", 0, 0, false},
		{"declared", 30000, 12, false},
		{"NaN rate", math.NaN(), 0, true},
		{"negative rate", -1, 0, true},
		{"infinite rate", math.Inf(1), 0, true},
		{"absurd rate", 1e12, 0, true},
		{"absurd batch", 0, maxNumSeqsLimit + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hb := heartbeat("a", "127.0.0.1:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
			hb.Capability.PrefillTokensPerS, hb.Capability.MaxNumSeqs = tc.rate, tc.seqs
			err := validateHeartbeat(hb, "r1")
			if got := errors.Is(err, ErrInvalidHeartbeat); got != tc.invalid {
				t.Errorf("validateHeartbeat = %v, want invalid %v", err, tc.invalid)
			}
		})
	}
}
