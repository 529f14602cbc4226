package regional

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
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
// heartbeat and its probed RTT and jitter, and each remote locality the
// gossip RTT to its region. A round trip that drifts materially is pushed
// again (at most once per placementRepush); probe noise is not.
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

	// The first probe is pushed, within placementRepush.
	probe := func(id string, rtt, jitter time.Duration) {
		t.Helper()
		if err := f.reg.submitProbes(t.Context(), []probeResult{{id: id, rtt: rtt, jitter: jitter, ok: true}}); err != nil {
			t.Fatal(err)
		}
	}
	probe("a", 400*time.Microsecond, 50*time.Microsecond)
	cycles := int(placementRepush/f.reg.cfg.CycleInterval) + 5
	if st, ok = f.tickUntilPush(cycles, a, b); !ok {
		t.Fatal("the first probe of a was never pushed")
	}
	if got := endpointsOf(st)["a"]; got.RTT != 400*time.Microsecond || got.Jitter != 50*time.Microsecond || got.PrefillTokensPerSecond != 30000 {
		t.Fatalf("endpoint a after its probe = %+v ", got)
	}
	// Noise below the tolerance is not worth a push.
	probe("a", 700*time.Microsecond, 80*time.Microsecond)
	if st, ok = f.tickUntilPush(cycles, a, b); ok {
		t.Fatalf("a sub-millisecond change was pushed: %+v", endpointsOf(st)["a"])
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
	if l := localityOf(t, st, "r1"); l.RTT != 0 {
		t.Errorf("local locality carries RTT %v; its endpoints carry their own", l.RTT)
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

func TestRTTDrifted(t *testing.T) {
	for _, tc := range []struct {
		a, b time.Duration
		want bool
	}{
		{0, 0, false},
		{0, time.Microsecond, true}, // became known
		{time.Millisecond, 0, true}, // became unknown
		{400 * time.Microsecond, 1300 * time.Microsecond, false},
		{400 * time.Microsecond, 1500 * time.Microsecond, true},
		{60 * time.Millisecond, 65 * time.Millisecond, false},
		{60 * time.Millisecond, 67 * time.Millisecond, true},
		{60 * time.Millisecond, 53 * time.Millisecond, true},
	} {
		if got := rttDrifted(tc.a, tc.b); got != tc.want {
			t.Errorf("rttDrifted(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
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
