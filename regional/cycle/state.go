package cycle

import (
	"math"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// LocalityScale turns route fractions into integer locality weights.
const LocalityScale = 1000

// Routes is the cross-region routing in force: per model the share of
// its demand each region serves, and the ingress address of each
// destination region.
type Routes struct {
	Models  map[string]ModelRoutes
	Ingress map[string]string
}

// ModelRoutes is one model's split: region → fraction, and the share
// shed.
type ModelRoutes struct {
	Routes map[string]float64
	// Shed is the share of the unpinned standard requests shed;
	// ShedCritical and ShedSheddable those of the unpinned critical and
	// sheddable ones (0 from a plan without slices).
	Shed, ShedCritical, ShedSheddable float64
	// Pinned holds the routes of the residency sets the plan carries a
	// slice for, by RegionsKey of the set's allowed regions. A set
	// without an entry is routed by the nearest-allowed rule (see
	// PinnedLocalities).
	Pinned map[string]SetRoutes
}

// Params is what BuildState needs besides the views.
type Params struct {
	// Region and Zone name the local locality.
	Region, Zone string
	// Kept are models that stay routable with no cell of theirs known (a
	// warm start keeps those the data planes were last given).
	Kept map[string]bool
	// Routes is the cross-region routing in force; nil: none.
	Routes *Routes
	// RTTs is the round trip to each remote region; a region missing is
	// unknown (0).
	RTTs map[string]time.Duration
	// Ingress is the ingress address of each remote region known apart
	// from the routes (gossip): where a pinned set goes when the routes in
	// force name none (no plan yet, a plan without that region).
	Ingress map[string]string
	// Sets returns the residency sets a model's requests may be pinned to
	// (each becomes an xds.Pinned); nil: none. It must be pure.
	Sets func(model string) []Set
	// RetryBudget is the retry budget per model, in percent
	// (xds.Model.RetryBudgetPercent); a model missing gets 0, the static
	// budget.
	RetryBudget map[string]float64
	// Sent is the Placement of the last offer (nil: none). A round trip
	// that has not drifted from the one sent is published as sent
	// (Placement.Held).
	Sent Placement
	// Reuse is an earlier offer that nothing holds any more, neither its
	// State nor its Weights (zero: none). BuildState writes the new
	// offer's weights and local endpoints into its buffers instead of
	// allocating them: at 10,000 cells they are a megabyte a cycle.
	Reuse Offer
}

// Offer is a state to offer the data planes, with what it carries that
// the next cycle compares against.
type Offer struct {
	State xds.State
	// Weights is the published weight of each cell in the state.
	Weights map[string]uint32
	// Placement is the round trips the state carries (Drifted's sent).
	Placement Placement
}

// BuildState turns the views with a published weight into the xDS state:
// per model, the local cells as one locality and, when the routes send a
// share of the model's demand to other regions, each such region's
// ingress as another locality weighted by its share. For the data plane's
// pick, each local endpoint carries its declared capacity, the local
// locality its cells' round trip (a cell whose own stands apart carries
// it: LocalPlacement) and each remote locality the round trip to its
// region (p.RTTs).
func BuildState(p Params, views []*CellView) Offer {
	b := stateBuilder{p: p, byModel: map[string]*xds.Model{}, local: map[string]*xds.Locality{}, own: map[string][]xds.Locality{},
		offer: Offer{Weights: p.Reuse.Weights, Placement: Placement{}}}
	if b.offer.Weights == nil {
		b.offer.Weights = make(map[string]uint32, len(views))
	} else {
		clear(b.offer.Weights)
	}
	b.free = localBuffers(p.Reuse.State, p.Region, p.Zone)
	// After a restart, the models the data planes were last given stay
	// until a cell of theirs registers or ForgetAfter passes.
	for m := range p.Kept {
		b.model(m)
	}
	b.addLocal(views)
	remote := b.addRemote()
	b.offer.State = b.assemble(remote)
	return b.offer
}

// stateBuilder is one BuildState call's work in progress.
type stateBuilder struct {
	p       Params
	byModel map[string]*xds.Model
	local   map[string]*xds.Locality  // the local locality per model
	own     map[string][]xds.Locality // a pinned model's own set's localities (pinned.go)
	offer   Offer
	// free are the local endpoint buffers of Params.Reuse, emptied.
	free [][]xds.Endpoint
}

// localBuffers returns the endpoint buffers of st's models' local
// localities (of region and zone), emptied. A buffer is listed once even
// should two localities share it (a pinned set's copy of the local
// locality does, but sets are not scanned): handed out twice, it would
// be written by two localities.
func localBuffers(st xds.State, region, zone string) [][]xds.Endpoint {
	var out [][]xds.Endpoint
	for _, m := range st.Models {
		for _, l := range m.Localities {
			if l.Region != region || l.Zone != zone || cap(l.Endpoints) == 0 {
				continue
			}
			buf := l.Endpoints[:0]
			if !slices.ContainsFunc(out, func(o []xds.Endpoint) bool { return sameArray(o, buf) }) {
				out = append(out, buf)
			}
		}
	}
	return out
}

// sameArray reports whether a and b (both of non-zero capacity) share
// their backing array's first element.
func sameArray(a, b []xds.Endpoint) bool {
	return &a[:cap(a)][0] == &b[:cap(b)][0]
}

// endpoints returns an empty endpoint slice with room for n: a free
// buffer large enough, else a new one.
func (b *stateBuilder) endpoints(n int) []xds.Endpoint {
	for i, buf := range b.free {
		if cap(buf) >= n {
			b.free = slices.Delete(b.free, i, i+1)
			return buf
		}
	}
	return make([]xds.Endpoint, 0, n)
}

func (b *stateBuilder) model(name string) *xds.Model {
	m := b.byModel[name]
	if m == nil {
		m = &xds.Model{Name: name}
		b.byModel[name] = m
	}
	return m
}

// addLocal adds the models of views and, per model, the local locality of
// the views with a published weight.
func (b *stateBuilder) addLocal(views []*CellView) {
	localRTT, apart := LocalPlacement(views)
	localRTT = b.p.Sent.Held(LocalKey, localRTT)
	b.offer.Placement[LocalKey] = localRTT
	// Cells of one model mostly come in runs: the last model's locality
	// is looked up once per run, not once per cell.
	var lastModel string
	var l *xds.Locality
	for _, v := range views {
		// A model stays routable while any of its cells is known (not
		// terminated), even with no endpoint left: callers then get "no
		// healthy upstream" (retryable), and remote localities can still
		// serve it, instead of the model vanishing from the routes.
		if v.Model != "" && v.State != lifecycle.Terminated && (l == nil || v.Model != lastModel) {
			b.model(v.Model)
		}
		if v.Weight.Published == 0 {
			continue
		}
		host, portStr, err := net.SplitHostPort(v.Endpoint)
		if err != nil {
			continue // validated on receipt; unreachable
		}
		port, _ := strconv.ParseUint(portStr, 10, 32)
		if l == nil || v.Model != lastModel {
			lastModel, l = v.Model, b.localityOf(v.Model, localRTT, len(views))
		}
		ep := xds.Endpoint{
			CellID: v.ID, Host: host, Port: uint32(port), Weight: v.Weight.Published, MaxModelLen: v.MaxModelLen,
			ClassWeight: v.Weight.ClassWeight, Degraded: v.Weight.Degraded, ProbeBudget: v.Weight.ProbeBudget,
			PrefillTokensPerSecond: v.PrefillTokensPerSecond, MaxNumSeqs: v.MaxNumSeqs,
		}
		if a, ok := apart[v.ID]; ok {
			a = b.p.Sent.Held(v.ID, a)
			ep.RTT, ep.Jitter = a.RTT, a.Jitter
			b.offer.Placement[v.ID] = a
		}
		l.Endpoints = append(l.Endpoints, ep)
		b.offer.Weights[v.ID] = v.Weight.Published
	}
}

// localityOf returns model's local locality, made on its first use; the
// first one made has room for n endpoints (the cells there are: most
// regions serve one model), the others grow.
func (b *stateBuilder) localityOf(model string, localRTT Place, n int) *xds.Locality {
	l := b.local[model]
	if l == nil {
		if len(b.local) > 0 {
			n = 0
		}
		l = &xds.Locality{Region: b.p.Region, Zone: b.p.Zone, Weight: LocalityScale, RTT: localRTT.RTT, Jitter: localRTT.Jitter,
			Endpoints: b.endpoints(n)}
		b.local[model] = l
		b.model(model)
	}
	return l
}

// addRemote applies the routes: the local locality's weight per model,
// and the remote localities (by model) they set.
func (b *stateBuilder) addRemote() (remote map[string][]xds.Locality) {
	t := b.p.Routes
	if t == nil {
		return nil
	}
	remote = map[string][]xds.Locality{}
	for name, mr := range t.Models {
		if l := b.local[name]; l != nil {
			if w := localityWeight(mr.Routes[b.p.Region]); w > 0 {
				l.Weight = w
			} else {
				// The plan sends all of this region's demand elsewhere:
				// the local cells stay as a lower priority (Envoy only
				// spills to it if the remote localities fail), and they
				// keep serving traffic forwarded here (the local-only
				// clusters promote them).
				l.Weight, l.Priority = 1, 1
			}
		}
		remote[name] = append(remote[name], b.remoteLocalities(name, mr.Routes, nil, t.Ingress)...)
	}
	return remote
}

// remoteLocalities are model name's localities of the other regions that
// routes sends a share to, in region order; with allow set, only those
// of the regions it allows (a residency set's).
func (b *stateBuilder) remoteLocalities(name string, routes map[string]float64, allow func(string) bool, ingress map[string]string) []xds.Locality {
	dests := make([]string, 0, len(routes))
	for d := range routes {
		dests = append(dests, d)
	}
	slices.Sort(dests)
	var out []xds.Locality
	for _, d := range dests {
		w := localityWeight(routes[d])
		addr := ingress[d]
		if d == b.p.Region || w == 0 || addr == "" || (allow != nil && !allow(d)) {
			continue
		}
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			continue // validated with the plan
		}
		out = append(out, b.ingressLocality(d, host, portStr, w))
		b.model(name)
	}
	return out
}

// ingressLocality is region d's ingress (host, port) as a locality of
// weight w, with the round trip to d.
func (b *stateBuilder) ingressLocality(d, host, portStr string, w uint32) xds.Locality {
	port, _ := strconv.ParseUint(portStr, 10, 32)
	rtt := b.p.Sent.Held(RemoteKey(d), Place{RTT: min(max(b.p.RTTs[d], 0), xdscontract.MaxRTT)}).RTT
	b.offer.Placement[RemoteKey(d)] = Place{RTT: rtt}
	return xds.Locality{
		Region: d, Zone: d, Weight: w, RTT: rtt,
		Endpoints: []xds.Endpoint{{CellID: "region/" + d, Host: host, Port: uint32(port), Weight: 1}},
	}
}

// assemble is the state: the models in name order, each with its local
// locality (priority 0 when nothing else serves it) and then its remote
// ones, its shed shares per criticality, its pinned residency sets
// (pinned.go) and its retry budget.
func (b *stateBuilder) assemble(remote map[string][]xds.Locality) xds.State {
	names := make([]string, 0, len(b.byModel))
	for n := range b.byModel {
		names = append(names, n)
	}
	slices.Sort(names)
	st := xds.State{Models: make([]xds.Model, 0, len(names))}
	for _, n := range names {
		m := b.byModel[n]
		if t := b.p.Routes; t != nil {
			mr := t.Models[n]
			m.Shed, m.ShedCritical, m.ShedSheddable = mr.Shed, mr.ShedCritical, mr.ShedSheddable
		}
		m.RetryBudgetPercent = b.p.RetryBudget[n]
		// Pinned sets copy the local locality as it stands before its
		// priority is settled below for the model's own cluster.
		m.Pinned = b.pinned(n)
		if l := b.local[n]; l != nil {
			if len(remote[n]) == 0 {
				l.Priority = 0 // nothing else to serve at priority 0
			}
			m.Localities = append(m.Localities, *l)
		}
		m.Localities = append(m.Localities, remote[n]...)
		if own, ok := b.own[n]; ok {
			// A model pinned as a whole: its main cluster is its set's.
			m.Localities = slices.Clone(own)
		}
		// A model with no locality left stays: its route and an empty
		// cluster answer "no healthy upstream" (503, retryable) until a
		// cell is back, rather than "no route" (404) while, say, every
		// cell is briefly suspect.
		st.Models = append(st.Models, *m)
	}
	return st
}

// localityWeight scales a fraction to an integer locality weight; 0 means
// no traffic (the locality is left out: xDS needs weights >= 1).
func localityWeight(f float64) uint32 {
	return uint32(math.Round(f * LocalityScale))
}
