package xdsclient

import (
	"maps"
	"slices"
	"strings"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
)

// The delta stream's decoded view: what DecodeAssignments would make of
// the assembled assignments (deltaState.assembled), kept up to date by
// the changed LbEndpoints alone. Envoy's LEDS subscription does the same
// with the raw messages: it keeps its collection's LbEndpoints by resource
// name, erases the removed names and replaces the added ones, and has the
// locality rebuilt from that map (source/extensions/clusters/eds/leds.cc
// LedsSubscription::onConfigUpdate, endpoints_map_); here the map holds
// the decoded Endpoint, so an update decodes and validates only the
// LbEndpoints it carries.
//
// A cluster's endpoint list is its localities, stably sorted by priority
// as decodeAssignment sorts them (segments), each contributing its inline
// lb_endpoints and then its LEDS collection's endpoints in resource-name
// order (the order assembled appends them in). Every Endpoint is made by
// decodeAssignment itself, on a one-endpoint assignment with the
// endpoint's locality, so the fields, the defaults and the health filter
// are the full path's by construction.

// segment is one locality of a cluster, in decode order. Localities of
// several clusters that name the same collection with the same locality
// fields (locality, weight, priority, metadata: what decodeAssignment reads
// besides the endpoint) and no inline endpoints decode every endpoint
// alike, so they are one segment: the controller has a model's main, local
// and class clusters name one collection while they hold the same
// endpoints (regional/xds leds.go), and one endpoint's change is then
// decoded and stored once, not once per cluster.
type segment struct {
	// ctx is the locality as the full path decodes it: locality, weight,
	// priority, metadata, with LbConfig cleared for a LEDS locality;
	// decodeOne sets its LbEndpoints to the one endpoint it decodes.
	ctx    *endpoint.LocalityLbEndpoints
	coll   string     // the LEDS collection; "" for none
	inline []Endpoint // the decoded inline lb_endpoints
	// names and eps are the collection's endpoints that decode to an
	// Endpoint (health status not unhealthy, draining or timed out),
	// sorted by resource name, side by side. eps may be handed out (a
	// cluster of this segment alone hands it out as its list), so a
	// change copies it first (commit), never changing it in place.
	names []string
	eps   []Endpoint
	// cluster is the cluster it decodes for (the first by name of those
	// it fills: only error messages name it); clusters are all of them.
	cluster  string
	clusters []string
}

// clusterView is one assignment's decoded form.
type clusterView struct {
	segs []*segment
	list []Endpoint // the concatenation handed out; never changed in place
}

// decodedView is the decoded form of a deltaState's assignments.
type decodedView struct {
	clusters map[string]*clusterView
	users    map[string][]*segment // collection → the segments it fills
	dirty    map[string]bool       // clusters changed since the last hand-out
}

// buildView decodes clas with the LbEndpoints lbs in full (after a change
// of assignments).
func buildView(clas map[string]*endpoint.ClusterLoadAssignment, lbs map[string]*endpoint.LbEndpoint) (*decodedView, error) {
	v := &decodedView{clusters: make(map[string]*clusterView, len(clas)), users: make(map[string][]*segment), dirty: make(map[string]bool)}
	for _, name := range slices.Sorted(maps.Keys(clas)) {
		cv := &clusterView{}
		locs := slices.Clone(clas[name].GetEndpoints())
		slices.SortStableFunc(locs, func(a, b *endpoint.LocalityLbEndpoints) int { return int(a.GetPriority()) - int(b.GetPriority()) })
		for _, ll := range locs {
			sg, err := newSegment(name, ll)
			if err != nil {
				return nil, err
			}
			if sg.coll != "" {
				if twin := v.twin(sg); twin != nil {
					sg = twin
				} else {
					v.users[sg.coll] = append(v.users[sg.coll], sg)
				}
				sg.clusters = append(sg.clusters, name)
			}
			cv.segs = append(cv.segs, sg)
		}
		v.clusters[name] = cv
		v.dirty[name] = true
	}
	byColl := make(map[string][]string)
	for n := range lbs {
		if c, _ := collectionOf(n); v.users[c] != nil {
			byColl[c] = append(byColl[c], n)
		}
	}
	for c, ns := range byColl {
		slices.Sort(ns)
		for _, sg := range v.users[c] {
			for _, n := range ns {
				e, ok, err := sg.decodeOne(lbs[n])
				if err != nil {
					return nil, err
				}
				if ok {
					sg.names, sg.eps = append(sg.names, n), append(sg.eps, e)
				}
			}
		}
	}
	for _, cv := range v.clusters {
		cv.rebuild()
	}
	return v, nil
}

// twin returns the segment already made that sg decodes as (same
// collection, same locality fields, neither with inline endpoints); nil
// when there is none.
func (v *decodedView) twin(sg *segment) *segment {
	if len(sg.inline) > 0 {
		return nil
	}
	for _, o := range v.users[sg.coll] {
		if len(o.inline) == 0 && proto.Equal(o.ctx, sg.ctx) {
			return o
		}
	}
	return nil
}

// collectionOf is xdscontract.LEDSCollectionOf for a held name (checked
// on arrival).
func collectionOf(name string) (string, bool) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", false
	}
	return name[:i+1] + "*", true
}

// newSegment decodes locality ll of cluster name, its LEDS endpoints
// aside.
func newSegment(name string, ll *endpoint.LocalityLbEndpoints) (*segment, error) {
	coll := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName()
	ctx := &endpoint.LocalityLbEndpoints{Locality: ll.GetLocality(), Metadata: ll.GetMetadata(),
		LoadBalancingWeight: ll.GetLoadBalancingWeight(), Priority: ll.GetPriority(), LbEndpoints: ll.GetLbEndpoints()}
	if coll == "" {
		ctx.LbConfig = ll.GetLbConfig() // load_balancer_endpoints: refused as the full path refuses it
	}
	inline, err := decodeAssignment(&endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{ctx}})
	if err != nil {
		return nil, err
	}
	ctx.LbEndpoints, ctx.LbConfig = nil, nil
	return &segment{ctx: ctx, coll: coll, inline: inline, cluster: name}, nil
}

// decodeOne decodes lb in the segment's locality: ok is false when its
// health status leaves it out.
func (sg *segment) decodeOne(lb *endpoint.LbEndpoint) (Endpoint, bool, error) {
	sg.ctx.LbEndpoints = []*endpoint.LbEndpoint{lb}
	defer func() { sg.ctx.LbEndpoints = nil }()
	eps, err := decodeAssignment(&endpoint.ClusterLoadAssignment{ClusterName: sg.cluster, Endpoints: []*endpoint.LocalityLbEndpoints{sg.ctx}})
	if err != nil || len(eps) == 0 {
		return Endpoint{}, false, err
	}
	return eps[0], true, nil
}

// set puts (or, ok false, takes out) the collection endpoint named n.
func (sg *segment) set(n string, e Endpoint, ok bool) {
	i, found := slices.BinarySearch(sg.names, n)
	switch {
	case found && ok:
		sg.eps[i] = e
	case found:
		sg.names, sg.eps = slices.Delete(sg.names, i, i+1), slices.Delete(sg.eps, i, i+1)
	case ok:
		sg.names, sg.eps = slices.Insert(sg.names, i, n), slices.Insert(sg.eps, i, e)
	}
}

// rebuild makes the cluster's list anew from its segments. A cluster of
// one segment without inline endpoints hands out the segment's own list,
// capped so that a consumer's append cannot write past it.
func (cv *clusterView) rebuild() {
	n := 0
	for _, sg := range cv.segs {
		n += len(sg.inline) + len(sg.eps)
	}
	if n == 0 {
		cv.list = nil // as decodeAssignment returns
		return
	}
	if len(cv.segs) == 1 && len(cv.segs[0].inline) == 0 {
		cv.list = cv.segs[0].eps[:n:n]
		return
	}
	list := make([]Endpoint, 0, n)
	for _, sg := range cv.segs {
		list = append(list, sg.inline...)
		list = append(list, sg.eps...)
	}
	cv.list = list
}

// lbChange is one decoded LbEndpoint change for one segment.
type lbChange struct {
	sg   *segment
	name string
	e    Endpoint
	ok   bool // false: take it out
}

// prepare decodes the added LbEndpoints in every segment their collection
// fills and lists the changes, the removed names' included; nothing is
// changed, so an error leaves the view as it was.
func (v *decodedView) prepare(added map[string]*endpoint.LbEndpoint, removed []string) ([]lbChange, error) {
	var out []lbChange
	for n, lb := range added {
		c, _ := collectionOf(n)
		for _, sg := range v.users[c] {
			e, ok, err := sg.decodeOne(lb)
			if err != nil {
				return nil, err
			}
			out = append(out, lbChange{sg: sg, name: n, e: e, ok: ok})
		}
	}
	for _, n := range removed { // after the added: a name in both is removed
		c, _ := collectionOf(n)
		for _, sg := range v.users[c] {
			out = append(out, lbChange{sg: sg, name: n})
		}
	}
	return out, nil
}

// commit applies prepared changes and rebuilds the clusters they touch.
// Each touched segment's list is copied before its first change: the
// list before may have been handed out.
func (v *decodedView) commit(chs []lbChange) {
	touched := make(map[*segment]bool)
	for _, ch := range chs {
		if !touched[ch.sg] {
			touched[ch.sg] = true
			ch.sg.eps = append(make([]Endpoint, 0, len(ch.sg.eps)+1), ch.sg.eps...)
		}
		ch.sg.set(ch.name, ch.e, ch.ok)
	}
	clusters := make(map[string]bool)
	for sg := range touched {
		for _, c := range sg.clusters {
			clusters[c] = true
		}
	}
	for c := range clusters {
		v.clusters[c].rebuild()
		v.dirty[c] = true
	}
}

// handOut returns every cluster's list (a new map; the slices of clusters
// not changed since the last hand-out are the same as then) and the
// clusters changed since, sorted.
func (v *decodedView) handOut() (map[string][]Endpoint, []string) {
	out := make(map[string][]Endpoint, len(v.clusters))
	for n, cv := range v.clusters {
		out[n] = cv.list
	}
	changed := make([]string, 0, len(v.dirty))
	for n := range v.dirty {
		if _, ok := v.clusters[n]; ok {
			changed = append(changed, n)
		}
	}
	slices.Sort(changed)
	return out, changed
}
