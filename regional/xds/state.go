package xds

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/internal/keepwrite"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// Endpoint is one serving address of a model: a local cell, or later a remote
// region's ingress gateway.
type Endpoint struct {
	// CellID names the cell. It is carried in the endpoint metadata
	// filter_metadata["isobar"]["cell"] and must be unique within a model.
	CellID string
	// Host is an IP address. Envoy does not resolve names in EDS (it refuses
	// the whole ClusterLoadAssignment with "malformed IP address"), so a
	// hostname is refused here; resolve it first.
	Host string
	// Port is the TCP port, 1 to 65535.
	Port uint32
	// Weight is the load-balancing weight, at least 1. To drain an endpoint,
	// remove it.
	Weight uint32
	// ClassWeight, when not 0, is the endpoint's weight in the context-class
	// clusters it fits (xdscontract.ClassClusterName), Weight staying its
	// weight in the model's main and local clusters. A cell whose
	// max_model_len is below its model's longest takes only the lowest weight
	// in the main cluster, which carries requests of unknown size, and its
	// capacity weight in the classes whose prompts it holds.
	ClassWeight uint32
	// ProbeBudget, when not 0, marks an endpoint on probation after an
	// error-rate penalty, published only for a bounded probe slot: a data
	// plane should send it at most this many requests while the endpoint
	// stays in the assignment. It is carried in
	// filter_metadata["isobar"]["probe_budget"]. Stock Envoy ignores it;
	// the control plane then bounds the probes only by closing the slot.
	ProbeBudget uint32
	// Degraded publishes the endpoint with EDS health DEGRADED (a hardware
	// lead signal): Envoy sends it traffic only when the healthy hosts of
	// its priority cannot carry the load. grpc-go drops DEGRADED endpoints.
	Degraded bool
	// MaxModelLen is the longest context the engine accepts, carried in
	// filter_metadata["isobar"]["max_model_len"]; 0 means unknown and is
	// left out.
	MaxModelLen uint32
	// PrefillTokensPerSecond is the engine's prefill throughput in prompt
	// tokens per second (its capacity class), carried in
	// filter_metadata["isobar"]["prefill_tokens_per_s"]; 0 means unknown
	// and is left out. At most xdscontract.MaxPrefillTokensPerSecond.
	PrefillTokensPerSecond float64
	// MaxNumSeqs is the engine's running-batch cap (vLLM --max-num-seqs),
	// carried in filter_metadata["isobar"]["max_num_seqs"]; 0 means unknown
	// and is left out.
	MaxNumSeqs uint32
	// RTT is the measured mean round trip from the region's data plane to
	// the endpoint and Jitter its jitter (one standard deviation), carried
	// in filter_metadata["isobar"]["rtt_ms"] and ["jitter_ms"] in
	// milliseconds, to the microsecond. 0 (or under a microsecond) means
	// unknown and is left out. Each at most xdscontract.MaxRTT.
	RTT, Jitter time.Duration
}

// Locality is a group of endpoints sharing a locality weight and priority.
type Locality struct {
	// Region and Zone identify the locality. An empty Region means this
	// controller's Config.Region (and, if Zone is empty too, Config.Zone).
	Region, Zone string
	// Weight is the locality weight, at least 1: a locality without weight
	// gets no traffic in grpc-go.
	Weight uint32
	// Priority is the failover priority, 0 being the highest. The priorities
	// used by a model must have no gaps.
	Priority uint32
	// Endpoints are the serving addresses.
	Endpoints []Endpoint
	// RTT and Jitter are the measured round trip from the region's data plane
	// to the locality (a remote region's ingress) and its jitter, carried in
	// the locality's filter_metadata["isobar"]["rtt_ms"] and ["jitter_ms"],
	// for endpoints that carry none of their own; as on Endpoint, 0 means
	// unknown and is left out. Each at most xdscontract.MaxRTT.
	RTT, Jitter time.Duration
}

// Model is one served model.
type Model struct {
	// Name is the served model name, e.g. "meta-llama/Llama-3.1-70B-Instruct-AWQ".
	Name string
	// Localities holds the local cells as one locality and, later, remote
	// regions' ingress gateways as others.
	Localities []Locality
	// Shed is the share of the model's client traffic (requests without
	// the hop header) to refuse with HTTP 429, in [0, 1]. Default 0. It is
	// written as a per-route fault abort, rounded to parts per million.
	// Forwarded traffic is never shed. Shed is the share of the standard
	// requests (no criticality header, or "standard").
	Shed float64
	// ShedCritical and ShedSheddable are the shares of the model's
	// critical and sheddable client requests to refuse: routes matching
	// xdscontract.CriticalityHeader "critical" and "sheddable" carry them
	// as their own fault abort. In [0, 1]; default 0.
	ShedCritical, ShedSheddable float64
	// Pinned lists the residency sets whose requests of this model may be
	// served only in some regions: each becomes a cluster of its own
	// (xdscontract.PinnedClusterName), split by context class
	// (xdscontract.PinnedClassClusterName), that routes matching
	// xdscontract.ResidencyHeader select. At most residency.MaxSets.
	Pinned []Pinned
	// RetryBudgetPercent is the retry budget of the model's clusters, as a
	// percentage of their active requests (Envoy's
	// circuit_breakers.thresholds.retry_budget.budget_percent); 0 means
	// the Config's static budget. The regional controller sets it from
	// the region's utilisation (RetryBudgetAt).
	RetryBudgetPercent float64
}

// Pinned is one residency set's share of a model.
type Pinned struct {
	// Set is the residency set's name (package residency).
	Set string
	// Regions are the regions the set allows, sorted; carried in the
	// cluster's metadata (xdscontract.MetadataAllowedRegions).
	Regions []string
	// Localities are the ones the set may use: the local cells' locality
	// when the local region is allowed, and the allowed remote regions'
	// ingress localities. Every locality's Region must be in Regions
	// (validated). None: the set's requests are answered 503 naming it.
	Localities []Locality
	// Shed, ShedCritical and ShedSheddable are as on Model, for the set's
	// requests.
	Shed, ShedCritical, ShedSheddable float64
}

// State is the desired state pushed to the data plane.
type State struct {
	Models []Model
}

// maxProblems bounds the problems listed in one ErrInvalidState error.
const maxProblems = 10

// problems collects validation failures so that one error names several.
type problems struct {
	list []string
	more int
}

func (p *problems) addf(format string, args ...any) {
	if len(p.list) >= maxProblems {
		p.more++
		return
	}
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	msg := strings.Join(p.list, "; ")
	if p.more > 0 {
		msg += fmt.Sprintf("; and %d more", p.more)
	}
	return fmt.Errorf("%w: %s", ErrInvalidState, msg)
}

// canonModel is a validated deep copy of a Model in canonical order:
// localities by (priority, region, zone), endpoints by (address, port), hosts
// in netip's normal form. Two States that differ only in order have equal
// canonical forms, so the output and the change detection do not depend on
// the caller's map iteration order.
type canonModel struct {
	name string
	// shed is the model's shed shares in parts per million.
	shed shedPPM
	// budget is Model.RetryBudgetPercent as published (retryBudget); 0:
	// the Config's.
	budget float64
	// pinned are the model's residency sets, sorted by name.
	pinned     []canonPin
	localities []Locality
	// raw is a deep copy of the input localities, in input order: an input
	// equal to it was already validated and canonicalised.
	raw []Locality
	// reused marks a model taken whole from the Builder's memo.
	reused bool

	// What the next canonicalisation of the model starts from
	// (canonicalizeFrom), set by every one that succeeds: cells and addrs
	// are the duplicate sets of its endpoints (addrs with several
	// localities only); order[li] is the index in localities of input
	// locality li; inOrder[li] says that locality's endpoints came in
	// canonical order, parsed[li] then holding their parsed addresses.
	cells   map[string]struct{}
	addrs   map[addrKey]string
	order   []int
	inOrder []bool
	parsed  [][]netip.Addr
}

func (m *canonModel) equal(o *canonModel) bool {
	return m.name == o.name && localitiesEqual(m.localities, o.localities)
}

// scratch holds buffers reused across builds.
type scratch struct {
	// matched holds, while canonicalizeFrom walks a locality, the index
	// in the last input of each endpoint found there (-1: none).
	matched []int
	// seen marks the last input's endpoints found in the new one.
	seen []bool
	// from counts the models canonicalizeFrom canonicalised; with full
	// set, it is never tried (tests).
	from int
	full bool
}

// canonicalize validates st and returns its models sorted by name. A model
// whose localities equal (in input order) those of the memoised model of the
// same name is taken from memo without being checked again.
func canonicalize(cfg *Config, st State, memo map[string]*modelEntry, sc *scratch) ([]canonModel, error) {
	var p problems
	out := make([]canonModel, 0, len(st.Models))
	seen := make(map[string]struct{}, len(st.Models))
	for i := range st.Models {
		m := &st.Models[i]
		if err := xdscontract.CheckName("name", m.Name); err != nil {
			p.addf("model #%d: %v", i, err)
			continue
		}
		if _, dup := seen[m.Name]; dup {
			p.addf("model %q: listed twice; merge its localities into one Model", m.Name)
			continue
		}
		seen[m.Name] = struct{}{}
		before := len(p.list) + p.more
		shed := checkShares(&p, fmt.Sprintf("model %q", m.Name), m.Shed, m.ShedCritical, m.ShedSheddable)
		budget := checkBudget(&p, m)
		e := memo[m.Name]
		pinned := canonPins(cfg, m, e, &p, sc)
		if len(p.list)+p.more != before {
			continue
		}
		var cm canonModel
		var from bool
		if e != nil && e.cla != nil && localitiesEqual(e.canon.raw, m.Localities) {
			cm = e.canon
			cm.reused = true
		} else if e != nil && e.cla != nil && !sc.full {
			if cm, from = canonicalizeFrom(cfg, m, &e.canon, e.spareCanon(), sc); from {
				sc.from++
			}
		}
		if !cm.reused && !from {
			var ok bool
			if cm, ok = canonicalizeModel(cfg, m, &p, e.spareCanon()); !ok {
				continue
			}
		}
		cm.shed, cm.budget, cm.pinned = shed, budget, pinned
		out = append(out, cm)
	}
	checkNameCollisions(seen, &p)
	if err := p.err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b canonModel) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// checkNameCollisions refuses a model whose name makes its main cluster's
// name one of another model's Envoy-only clusters: model "m/local" beside
// model "m" (xdscontract.LocalClusterName), "m/ctx-N" or "m/pin-S" (the
// class and pinned clusters). Two clusters of one name would leave one
// without its assignment.
func checkNameCollisions(models map[string]struct{}, p *problems) {
	for name := range models {
		for i := strings.IndexByte(name, '/'); i >= 0; {
			if _, ok := models[name[:i]]; ok {
				rest := name[i+1:]
				if rest == "local" || strings.HasPrefix(rest, "local/") || strings.HasPrefix(rest, "ctx-") || strings.HasPrefix(rest, "pin-") {
					p.addf("model %q: its cluster name is one of model %q's Envoy-only clusters; rename one of them", name, name[:i])
				}
			}
			j := strings.IndexByte(name[i+1:], '/')
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
}

func localitiesEqual(a, b []Locality) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Region != y.Region || x.Zone != y.Zone || x.Weight != y.Weight || x.Priority != y.Priority ||
			x.RTT != y.RTT || x.Jitter != y.Jitter || !slices.Equal(x.Endpoints, y.Endpoints) {
			return false
		}
	}
	return true
}

// copyLocalities deep-copies in, into the endpoint buffers of spare's
// localities (spareEndpoints) where they are large enough.
func copyLocalities(in []Locality, spare []Locality) []Locality {
	out := make([]Locality, len(in))
	for i, l := range in {
		buf := spareEndpoints(spare, i)
		for _, e := range l.Endpoints {
			buf = keepwrite.Append(buf, e) // mostly what the spare holds (keepwrite)
		}
		l.Endpoints = buf
		out[i] = l
	}
	return out
}

// spareEndpoints returns the endpoint buffer of locality i of spare,
// emptied, to be written over; nil when there is none.
func spareEndpoints(spare []Locality, i int) []Endpoint {
	if i >= len(spare) {
		return nil
	}
	return spare[i].Endpoints[:0]
}

// addrKey identifies an endpoint address for duplicate detection: grpc-go
// refuses a ClusterLoadAssignment with one address twice, across localities.
type addrKey struct {
	addr netip.Addr
	port uint32
}

// locKey identifies a locality within a model, for duplicate detection.
type locKey struct {
	region, zone string
	priority     uint32
}

// modelCanon is the state of one canonicalizeModel call: the model's
// problems go to p; sc's maps are reused across models.
type modelCanon struct {
	cfg        *Config
	m          *Model
	p          *problems
	addrs      map[addrKey]string
	cells      map[string]struct{}
	locs       map[locKey]struct{}
	prioWeight map[uint32]uint64
	total      uint64 // the endpoints' weights
}

// spare, when not nil, is a canonical model whose buffers nobody holds
// any more (modelEntry.spare): the result's endpoint slices are written
// into them, so that a model rebuilt every cycle does not allocate its
// endpoints twice per build.
func canonicalizeModel(cfg *Config, m *Model, p *problems, spare *canonModel) (canonModel, bool) {
	before := len(p.list) + p.more
	n := len(m.Localities)
	cm := canonModel{name: m.Name, localities: make([]Locality, n), order: make([]int, n), inOrder: make([]bool, n),
		parsed: make([][]netip.Addr, n)}
	var spareCanon, spareRaw []Locality
	var spareParsed [][]netip.Addr
	if spare != nil {
		spareCanon, spareRaw, spareParsed = spare.localities, spare.raw, spare.parsed
		cm.cells, cm.addrs = spare.cells, spare.addrs
	}
	if cm.cells == nil {
		cm.cells, cm.addrs = make(map[string]struct{}), make(map[addrKey]string)
	}
	clear(cm.cells)
	clear(cm.addrs)
	mc := modelCanon{
		cfg: cfg, m: m, p: p, addrs: cm.addrs, cells: cm.cells,
		locs: make(map[locKey]struct{}, n), prioWeight: make(map[uint32]uint64, 2),
	}
	for li := range m.Localities {
		var buf []netip.Addr
		if li < len(spareParsed) {
			buf = spareParsed[li]
		}
		cm.localities[li], cm.parsed[li], cm.inOrder[li] = mc.locality(&m.Localities[li], spareEndpoints(spareCanon, li), buf)
	}
	mc.checkWeights()
	if len(p.list)+p.more != before {
		return canonModel{}, false
	}
	cm.sortLocalities()
	cm.raw = copyLocalities(m.Localities, spareRaw)
	return cm, true
}

// sortLocalities puts cm's localities, in input order, in canonical order
// (priority, region, zone) and records where each went (cm.order).
func (cm *canonModel) sortLocalities() {
	for i := range cm.order {
		cm.order[i] = i
	}
	ls := cm.localities
	idx := slices.Clone(cm.order)
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(ls[a].Priority, ls[b].Priority), strings.Compare(ls[a].Region, ls[b].Region), strings.Compare(ls[a].Zone, ls[b].Zone))
	})
	sorted := make([]Locality, len(ls))
	for to, from := range idx {
		sorted[to] = ls[from]
		cm.order[from] = to
	}
	cm.localities = sorted
}

// locality checks one locality of the model and returns it canonical:
// the default region and zone filled in, endpoints checked and sorted
// (into buf's array when it is large enough); and when they came in that
// order (inOrder), their parsed addresses (into parsedBuf's array).
func (mc *modelCanon) locality(in *Locality, buf []Endpoint, parsedBuf []netip.Addr) (l Locality, parsed []netip.Addr, inOrder bool) {
	p := mc.p
	l = mc.header(in)
	where := locality{mc.m.Name, l.Region, l.Zone, l.Priority}
	if err := xdscontract.CheckName("region", l.Region); err != nil {
		p.addf("%s: %v", where, err)
	}
	if l.Zone != "" {
		if err := xdscontract.CheckName("zone", l.Zone); err != nil {
			p.addf("%s: %v", where, err)
		}
	}
	if l.Weight == 0 {
		p.addf("%s: locality weight 0; a locality without weight gets no traffic, set at least 1 or remove it", where)
	}
	if err := checkRTT(l.RTT, l.Jitter); err != nil {
		p.addf("%s: %v", where, err)
	}
	k := locKey{l.Region, l.Zone, l.Priority}
	if _, dup := mc.locs[k]; dup {
		p.addf("%s: listed twice at the same priority; merge the two", where)
	}
	mc.locs[k] = struct{}{}
	mc.prioWeight[l.Priority] += uint64(l.Weight)

	l.Endpoints = slices.Grow(buf[:0], len(in.Endpoints))[:len(in.Endpoints)]
	parsed = slices.Grow(parsedBuf[:0], len(in.Endpoints))[:len(in.Endpoints)]
	for ei, e := range in.Endpoints {
		var named bool
		l.Endpoints[ei], parsed[ei], named = mc.endpoint(where, e)
		mc.dup(where, &l.Endpoints[ei], parsed[ei], named)
	}
	inOrder = sortEndpoints(l.Endpoints, parsed)
	if len(mc.m.Localities) == 1 {
		// One locality: duplicates are neighbours once sorted.
		for j := 1; j < len(parsed); j++ {
			a, b := &l.Endpoints[j-1], &l.Endpoints[j]
			if parsed[j].IsValid() && parsed[j] == parsed[j-1] && a.Port == b.Port {
				p.addf("%s: cell %q: address %s is also cell %q's; each address may appear once per model",
					where, b.CellID, netip.AddrPortFrom(parsed[j], uint16(b.Port)), a.CellID)
			}
		}
	}
	return l, parsed, inOrder
}

// header is in without its endpoints, the default region and zone filled
// in.
func (mc *modelCanon) header(in *Locality) Locality {
	l := Locality{Region: in.Region, Zone: in.Zone, Weight: in.Weight, Priority: in.Priority, RTT: in.RTT, Jitter: in.Jitter}
	if l.Region == "" {
		l.Region = mc.cfg.Region
		if l.Zone == "" {
			l.Zone = mc.cfg.Zone
		}
	}
	return l
}

// endpoint checks one endpoint of the locality where and returns it
// canonical, with its parsed address (invalid when the host is not an IP),
// and whether its cell id is a valid name.
func (mc *modelCanon) endpoint(where locality, e Endpoint) (Endpoint, netip.Addr, bool) {
	p := mc.p
	addr, err := netip.ParseAddr(e.Host)
	switch {
	case err != nil:
		p.addf("%s: cell %q: host %q is not an IP address; Envoy does not resolve names in EDS, resolve it first", where, e.CellID, e.Host)
	case addr.Zone() != "":
		p.addf("%s: cell %q: host %q has an IPv6 zone; use an address without %%zone", where, e.CellID, e.Host)
	case addr.Is4():
		// Accepted IPv4 text is already canonical (no leading
		// zeros), so e.Host stays as it is.
	default:
		addr = addr.Unmap()
		if s := addr.String(); s != e.Host {
			e.Host = s
		}
	}
	if e.Port == 0 || e.Port > 65535 {
		p.addf("%s: cell %q: port %d is out of range 1-65535", where, e.CellID, e.Port)
	}
	if e.Weight == 0 {
		p.addf("%s: cell %q: weight 0; weights start at 1, remove the endpoint to drain it", where, e.CellID)
	}
	// !(x >= 0) also catches NaN.
	if !(e.PrefillTokensPerSecond >= 0) || e.PrefillTokensPerSecond > xdscontract.MaxPrefillTokensPerSecond {
		p.addf("%s: cell %q: prefill rate %v is out of range; use 0 (unknown) or tokens per second up to %g",
			where, e.CellID, e.PrefillTokensPerSecond, float64(xdscontract.MaxPrefillTokensPerSecond))
	}
	if err := checkRTT(e.RTT, e.Jitter); err != nil {
		p.addf("%s: cell %q: %v", where, e.CellID, err)
	}
	named := true
	if err := xdscontract.CheckName("cell id", e.CellID); err != nil {
		p.addf("%s: endpoint %s: %v", where, e.Host, err)
		named = false
	}
	mc.total += uint64(e.Weight)
	return e, addr, named
}

// dup checks that the endpoint e (canonical; addr its parsed address;
// named: its cell id is valid, else a duplicate is not reported) is the
// model's only one of its cell and, with several localities (where
// locality() does not find duplicates as neighbours), of its address, and
// records both.
func (mc *modelCanon) dup(where locality, e *Endpoint, addr netip.Addr, named bool) {
	if _, dup := mc.cells[e.CellID]; dup && named {
		mc.p.addf("%s: cell %q: listed twice in the model", where, e.CellID)
	}
	mc.cells[e.CellID] = struct{}{}
	if addr.IsValid() && len(mc.m.Localities) > 1 {
		ak := addrKey{addr, e.Port}
		if other, dup := mc.addrs[ak]; dup {
			mc.p.addf("%s: cell %q: address %s is also cell %q's; each address may appear once per model",
				where, e.CellID, netip.AddrPortFrom(addr, uint16(e.Port)), other)
		}
		mc.addrs[ak] = e.CellID
	}
}

// checkWeights checks the model's weight sums and its priorities.
func (mc *modelCanon) checkWeights() {
	m, p := mc.m, mc.p
	if mc.total > math.MaxUint32 {
		p.addf("model %q: endpoint weights sum to %d, above 2^32-1; scale them down", m.Name, mc.total)
	}
	for prio, w := range mc.prioWeight {
		if w > math.MaxUint32 {
			p.addf("model %q: locality weights at priority %d sum to %d, above 2^32-1; scale them down", m.Name, prio, w)
		}
	}
	for prio := range uint32(len(mc.prioWeight)) {
		if _, ok := mc.prioWeight[prio]; !ok {
			p.addf("model %q: priorities have a gap, %d is missing; number them from 0 without gaps", m.Name, prio)
			break
		}
	}
}

// checkRTT checks a round trip and its jitter: each in [0, xdscontract.MaxRTT].
func checkRTT(rtt, jitter time.Duration) error {
	if rtt < 0 || rtt > xdscontract.MaxRTT || jitter < 0 || jitter > xdscontract.MaxRTT {
		return fmt.Errorf("RTT %v or jitter %v is out of range; use durations in [0, %v] (0: unknown)", rtt, jitter, xdscontract.MaxRTT)
	}
	return nil
}

// locality names a locality in error messages; it is formatted only when a
// problem is reported.
type locality struct {
	model, region, zone string
	priority            uint32
}

func (l locality) String() string {
	return fmt.Sprintf("model %q locality %s/%s priority %d", l.model, l.region, l.zone, l.priority)
}

// sortEndpoints orders eps and the parallel parsed addresses by address then
// port, skipping the sort when the input is already in order, which it
// reports.
func sortEndpoints(eps []Endpoint, parsed []netip.Addr) bool {
	less := func(i, j int) int {
		return cmp.Or(parsed[i].Compare(parsed[j]), cmp.Compare(eps[i].Port, eps[j].Port))
	}
	sorted := true
	for i := 1; i < len(eps); i++ {
		if less(i-1, i) > 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return true
	}
	idx := make([]int, len(eps))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, less)
	outE := make([]Endpoint, len(eps))
	outP := make([]netip.Addr, len(eps))
	for to, from := range idx {
		outE[to], outP[to] = eps[from], parsed[from]
	}
	copy(eps, outE)
	copy(parsed, outP)
	return false
}
