package cycle

import (
	"cmp"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/isobar-mesh/isobar/internal/keepwrite"
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
	// Reuse is an earlier offer whose State nothing holds any more (zero:
	// none). BuildState writes the new offer's local endpoints into its
	// buffers instead of allocating them: at 10,000 cells they are a
	// megabyte a cycle.
	Reuse Offer
}

// Offer is a state to offer the data planes, with what it carries that
// the next cycle compares against.
type Offer struct {
	State xds.State
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
	slots := make([]Slot, len(views))
	for i, v := range views {
		slots[i] = SlotOf(v)
	}
	return BuildStateSlots(p, slots)
}

// Slot is what BuildState takes of one cell's view (SlotOf), in one
// contiguous value: a caller that keeps its cells' slots between cycles
// and remakes only those of the views that changed builds the state
// without reading every view again (at 10,000 cells, a cache miss or more
// per cell and most of the cost of BuildState).
type Slot struct {
	// Model is the view's model; Known: the cell keeps its model
	// routable (a model, and not terminated).
	Model string
	Known bool
	// Published is the view's published weight; In: it has one and its
	// endpoint parsed, so Endpoint (without RTT and Jitter, which
	// BuildState sets) joins the local locality. Endpoint.CellID is the
	// view's ID either way.
	Published uint32
	In        bool
	Endpoint  xds.Endpoint
	// Place is the cell's probed round trip; RTTOK: it was probed.
	Place Place
	RTTOK bool
	// Addr is the view's endpoint parsed (an IPv4-mapped address
	// unmapped), whatever its weight; invalid when it is not an IP
	// address and port. Slots in Addr order (AddrOrder) give each
	// locality its endpoints in the order the xDS build sorts them into,
	// which it then only checks.
	Addr netip.AddrPort
}

// AddrOrder orders slots by Addr (invalid first), as the xDS build
// orders endpoints (by address, then port).
func AddrOrder(a, b *Slot) int {
	return cmp.Or(a.Addr.Addr().Compare(b.Addr.Addr()), cmp.Compare(a.Addr.Port(), b.Addr.Port()))
}

// SlotOf is v's Slot.
func SlotOf(v *CellView) Slot { return SlotAfter(v, nil, "") }

// SamePublished reports whether a and b put the same into an offered
// state, the round trip aside (Place and RTTOK: Drifted decides when a
// round trip is worth a push). A cell whose slot changed otherwise (its
// endpoint's address, weight, health, probe budget or capability:
// max_model_len, max_num_seqs, prefill rate) needs a push even when its
// weight did not move: a data plane that keeps the old max_model_len
// sends the cell prompts it refuses.
func SamePublished(a, b *Slot) bool {
	return a.Model == b.Model && a.Known == b.Known && a.Published == b.Published && a.In == b.In &&
		a.Endpoint == b.Endpoint && a.Addr == b.Addr
}

// SlotAfter is v's Slot, given prev, the Slot of the cell's view whose
// endpoint was prevEndpoint (nil: none). When v's endpoint is the same,
// its parsed forms are taken from prev rather than parsed again: a cell
// keeps its endpoint across heartbeats, and the two parses were most of
// a slot's cost (8 % of the 10,000-cell typical cycle). The result is
// SlotOf's.
func SlotAfter(v *CellView, prev *Slot, prevEndpoint string) Slot {
	s := Slot{
		Model: v.Model, Known: v.Model != "" && v.State != lifecycle.Terminated, Published: v.Weight.Published,
		Place: Place{v.RTT, v.Jitter}, RTTOK: v.RTTOK, Endpoint: xds.Endpoint{CellID: v.ID},
	}
	same := prev != nil && prevEndpoint == v.Endpoint
	if same {
		s.Addr = prev.Addr
	} else if ap, err := netip.ParseAddrPort(v.Endpoint); err == nil {
		s.Addr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if s.Published == 0 {
		return s
	}
	var host string
	var port uint64
	if same && prev.In {
		host, port = prev.Endpoint.Host, uint64(prev.Endpoint.Port)
	} else {
		h, portStr, err := net.SplitHostPort(v.Endpoint)
		if err != nil {
			return s // validated on receipt; unreachable
		}
		host = h
		port, _ = strconv.ParseUint(portStr, 10, 32)
	}
	s.In = true
	s.Endpoint = xds.Endpoint{
		CellID: v.ID, Host: host, Port: uint32(port), Weight: v.Weight.Published, MaxModelLen: v.MaxModelLen,
		ClassWeight: v.Weight.ClassWeight, Degraded: v.Weight.Degraded, ProbeBudget: v.Weight.ProbeBudget,
		PrefillTokensPerSecond: v.PrefillTokensPerSecond, MaxNumSeqs: v.MaxNumSeqs,
	}
	return s
}

// BuildStateSlots is BuildState of the views whose slots (SlotOf) are
// slots, in any order: the endpoints of each locality come in the order
// of slots.
func BuildStateSlots(p Params, slots []Slot) Offer {
	b := stateBuilder{p: p, byModel: map[string]*xds.Model{}, local: map[string]*xds.Locality{}, own: map[string][]xds.Locality{},
		offer: Offer{Placement: Placement{}}}
	b.free = localBuffers(p.Reuse.State, p.Region, p.Zone)
	// After a restart, the models the data planes were last given stay
	// until a cell of theirs registers or ForgetAfter passes.
	for m := range p.Kept {
		b.model(m)
	}
	b.addLocal(slots)
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

// addLocal adds the models of slots and, per model, the local locality
// of the cells with a published weight.
func (b *stateBuilder) addLocal(slots []Slot) {
	localRTT, apart := localPlacement(slots, func(s *Slot) (string, Place, bool) {
		return s.Endpoint.CellID, s.Place, s.Published > 0 && s.RTTOK
	})
	localRTT = b.p.Sent.Held(LocalKey, localRTT)
	b.offer.Placement[LocalKey] = localRTT
	// Cells of one model mostly come in runs: the last model's locality
	// is looked up once per run, not once per cell.
	var lastModel string
	var l *xds.Locality
	for i := range slots {
		s := &slots[i]
		// A model stays routable while any of its cells is known (not
		// terminated), even with no endpoint left: callers then get "no
		// healthy upstream" (retryable), and remote localities can still
		// serve it, instead of the model vanishing from the routes.
		if s.Known && (l == nil || s.Model != lastModel) {
			b.model(s.Model)
		}
		if !s.In {
			continue
		}
		if l == nil || s.Model != lastModel {
			lastModel, l = s.Model, b.localityOf(s.Model, localRTT, len(slots))
		}
		l.Endpoints = keepwrite.Append(l.Endpoints, s.Endpoint) // a spent state's buffer: mostly the same endpoints
		if a, ok := apart[s.Endpoint.CellID]; ok {
			a = b.p.Sent.Held(s.Endpoint.CellID, a)
			ep := &l.Endpoints[len(l.Endpoints)-1]
			ep.RTT, ep.Jitter = a.RTT, a.Jitter
			b.offer.Placement[s.Endpoint.CellID] = a
		}
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
