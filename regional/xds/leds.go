package xds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// The LEDS layout (Config.LEDS) served to delta xDS clients.
//
// Under EDS a cluster's endpoints are one ClusterLoadAssignment, so a
// change to one endpoint resends every endpoint of the cluster, even over
// delta xDS (a delta resource is a whole CLA). Envoy's answer is LEDS:
// each locality of the CLA carries a leds_cluster_locality_config naming
// an LbEndpoint glob collection instead of its lb_endpoints, and every
// endpoint is a resource of its own (api/envoy/config/endpoint/v3/
// endpoint_components.proto LedsClusterLocalityConfig, api/envoy/service/
// endpoint/v3/leds.proto; Envoy supports glob collections over delta ADS
// only). A one-endpoint change is then one LbEndpoint per collection
// holding it, whatever the cluster's size; clusters that hold the same
// endpoints share a collection (ledsLocality).
//
// State-of-the-world clients (Envoy on SotW, grpc-go, grpc-js-xds, gRPC
// C-core: none of the gRPC libraries speaks LEDS) keep the EDS layout: the
// Server serves them from the same snapshot cache as before, and delta
// clients from a second snapshot cache holding the LEDS CLAs plus one
// go-control-plane LinearCache of LbEndpoints per node kind, behind a
// cache.MuxCache (pkg/cache/v3/mux.go) that routes by protocol variant
// and type URL.
//
// go-control-plane v0.14 has no LEDS type and no glob collections: its
// LinearCache matches resource names literally. ledsCache serves a glob
// subscription as a wildcard one on the kind's LinearCache, which holds
// exactly the collections the kind's CLAs name: a client that subscribes
// to every collection it is given (as Envoy does on loading a CLA) gets
// exactly them; one that subscribes to fewer gets the others too.
//
// go-control-plane's LinearCache answers each update and each ACK of a
// wildcard delta watch by comparing the version of every resource it
// holds with the client's (pkg/cache/v3/linear.go computeResourceChange),
// so a push costs O(resources) per client: sharing collections cuts that
// eightfold for a uniform model.

// ledsConfigSource is the leds_config of every collection: over ADS.
func ledsConfigSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// ledsEntry is one cluster's share of the LEDS layout.
type ledsEntry struct {
	src *endpoint.ClusterLoadAssignment // the EDS CLA it was made from
	out *endpoint.ClusterLoadAssignment // the same CLA, localities by LEDS
	// locs are the CLA's localities in order, each with its LbEndpoint
	// resources (the EDS CLA's own messages: shared, never modified).
	locs []ledsLocality
}

// ledsLocality is one locality of a cluster and the collection it names.
// A locality owns its own collection (base, xdscontract.LEDSCollection of
// its cluster, region and zone), or shares one an earlier locality of
// the push owns whose endpoints are the same messages in the same order:
// the Builder gives a model's local cluster and its class clusters the
// local locality's very LbEndpoints when they hold all of it at the same
// weights, so a uniform fleet serves each endpoint once, not once per
// cluster (8 times for one model with three context classes). A shared
// collection is named by its owner's cluster; a delta client subscribes
// to the names the assignments give. Envoy makes one collection
// subscription per locality config (source/extensions/clusters/eds/
// leds.cc, LedsSubscription: collectionSubscriptionFromUrl), and its mux
// keeps a set of watches per resource name (source/common/config/
// watch_map.h, watch_interest_), so several localities naming one
// collection each get its endpoints.
type ledsLocality struct {
	base string
	coll string // base when owned, else the shared collection
	own  bool
	lbs  []*endpoint.LbEndpoint
	// names[i] is lbs[i]'s name in coll; held by the owner only.
	names []string
}

// ledsKind is the LEDS layout of one node kind. It is used under the
// Server's pushMu only.
type ledsKind struct {
	cache   *cache.LinearCache // the kind's LbEndpoint resources
	entries map[string]*ledsEntry
}

func newLEDSKind(lib libLogger) *ledsKind {
	return &ledsKind{
		cache:   cache.NewLinearCache(xdscontract.LbEndpointType, cache.WithLogger(lib)),
		entries: make(map[string]*ledsEntry),
	}
}

// ledsUpdate is the layout of one Push for one kind, not yet applied.
type ledsUpdate struct {
	clas     []*endpoint.ClusterLoadAssignment // in the order of the EDS set
	entries  map[string]*ledsEntry
	toUpdate map[string]types.Resource
	toDelete []string
	// collections are those the assignments name: the owned ones, each
	// with the locality that owns it in this push.
	collections map[string]struct{}
	owners      map[string]*ledsLocality
	// byShape finds the owned collections that may hold a list of
	// endpoints: those of its length, first and last message.
	byShape map[lbShape][]string
}

// lbShape is what an owned collection's endpoints are looked up by.
type lbShape struct {
	n           int
	first, last *endpoint.LbEndpoint
}

func shapeOf(lbs []*endpoint.LbEndpoint) lbShape {
	if len(lbs) == 0 {
		return lbShape{}
	}
	return lbShape{len(lbs), lbs[0], lbs[len(lbs)-1]}
}

// sameLbs reports whether a and b are the same messages in the same order.
func sameLbs(a, b []*endpoint.LbEndpoint) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true // one slice (the Builder's locality, reused)
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// prepare computes the LEDS layout of the EDS assignments clas against
// the last applied one. An assignment that is the same pointer as last
// time keeps its entry when the collections it shares still hold its
// endpoints; a changed one is compared locality by locality, endpoint
// message by endpoint message (the Builder returns an unchanged endpoint
// as the same message), so a one-endpoint change costs pointer
// comparisons over the cluster and the naming of that endpoint, once per
// collection that holds it. A collection owned last time and not now
// (its locality gone, or sharing another now) has its endpoints deleted.
func (l *ledsKind) prepare(clas []*endpoint.ClusterLoadAssignment) (*ledsUpdate, error) {
	u := &ledsUpdate{
		clas:        make([]*endpoint.ClusterLoadAssignment, len(clas)),
		entries:     make(map[string]*ledsEntry, len(clas)),
		toUpdate:    make(map[string]types.Resource),
		collections: make(map[string]struct{}),
		owners:      make(map[string]*ledsLocality),
		byShape:     make(map[lbShape][]string),
	}
	for i, cla := range clas {
		name := cla.GetClusterName()
		e := l.entries[name]
		if e == nil || e.src != cla || !u.keep(e) {
			var err error
			if e, err = u.newEntry(cla, e); err != nil {
				return nil, err
			}
		}
		u.clas[i], u.entries[name] = e.out, e
	}
	for _, prev := range l.entries {
		for i := range prev.locs {
			if p := &prev.locs[i]; p.own {
				if _, still := u.owners[p.coll]; !still {
					u.toDelete = append(u.toDelete, p.names...)
				}
			}
		}
	}
	return u, nil
}

// apply installs u in the kind's LinearCache, which notifies the delta
// streams watching the changed endpoints.
func (l *ledsKind) apply(u *ledsUpdate) error {
	l.entries = u.entries
	if len(u.toUpdate) == 0 && len(u.toDelete) == 0 {
		return nil
	}
	return l.cache.UpdateResources(u.toUpdate, u.toDelete)
}

// keep reports whether e, unchanged since the last push, holds as it is:
// every collection it shares is owned in this push with the same
// endpoints. It then claims the collections e owns.
func (u *ledsUpdate) keep(e *ledsEntry) bool {
	for i := range e.locs {
		if loc := &e.locs[i]; !loc.own {
			if o := u.owners[loc.coll]; o == nil || !sameLbs(o.lbs, loc.lbs) {
				return false
			}
		}
	}
	for i := range e.locs {
		if loc := &e.locs[i]; loc.own {
			u.claim(loc)
		}
	}
	return true
}

// claim records loc as the owner of its collection in this push.
func (u *ledsUpdate) claim(loc *ledsLocality) {
	u.owners[loc.coll] = loc
	u.collections[loc.coll] = struct{}{}
	k := shapeOf(loc.lbs)
	u.byShape[k] = append(u.byShape[k], loc.coll)
}

// shared returns the owned collection of this push that loc can share:
// the one it shared last time (prev, may be nil) when it still holds
// loc's endpoints, else any that does; "" when none does. A locality
// that owned its collection last time keeps it (never shares): a
// collection's endpoints then move only when they change.
func (u *ledsUpdate) shared(loc, prev *ledsLocality) string {
	if prev != nil && prev.own {
		return ""
	}
	if prev != nil {
		if o := u.owners[prev.coll]; o != nil && sameLbs(o.lbs, loc.lbs) {
			return prev.coll
		}
	}
	for _, c := range u.byShape[shapeOf(loc.lbs)] {
		if sameLbs(u.owners[c].lbs, loc.lbs) {
			return c
		}
	}
	return ""
}

// newEntry makes the LEDS form of cla (prev, may be nil, being the last
// one of its cluster): its localities with their locality, weight,
// priority and metadata (the fields the Builder sets) and the collection
// each names, its own or a shared one (ledsLocality), and one LbEndpoint
// resource per endpoint of each collection it owns; it records in u what
// changed since prev.
func (u *ledsUpdate) newEntry(cla *endpoint.ClusterLoadAssignment, prev *ledsEntry) (*ledsEntry, error) {
	name := cla.GetClusterName()
	out := &endpoint.ClusterLoadAssignment{ClusterName: name, Policy: cla.GetPolicy()}
	e := &ledsEntry{src: cla, out: out, locs: make([]ledsLocality, len(cla.GetEndpoints()))}
	var prevLocs map[string]*ledsLocality
	if prev != nil {
		prevLocs = make(map[string]*ledsLocality, len(prev.locs))
		for i := range prev.locs {
			prevLocs[prev.locs[i].base] = &prev.locs[i]
		}
	}
	used := make(map[string]bool, len(cla.GetEndpoints()))
	for i, ll := range cla.GetEndpoints() {
		loc := &e.locs[i]
		loc.base = baseCollection(name, ll.GetLocality(), used)
		loc.lbs = ll.GetLbEndpoints()
		p := prevLocs[loc.base]
		if loc.coll = u.shared(loc, p); loc.coll == "" {
			loc.coll, loc.own = loc.base, true
			if p != nil && !p.own {
				p = nil // its collection was deleted when it began to share
			}
			if _, dup := u.owners[loc.coll]; dup {
				return nil, fmt.Errorf("%w: ClusterLoadAssignment %q: locality %s/%s twice", xdscontract.ErrInvalidResource,
					name, ll.GetLocality().GetRegion(), ll.GetLocality().GetZone())
			}
			if err := u.diffLocality(name, loc, p); err != nil {
				return nil, err
			}
			u.claim(loc)
		}
		out.Endpoints = append(out.Endpoints, &endpoint.LocalityLbEndpoints{
			Locality:            ll.GetLocality(),
			LoadBalancingWeight: ll.GetLoadBalancingWeight(),
			Priority:            ll.GetPriority(),
			Metadata:            ll.GetMetadata(),
			LbConfig: &endpoint.LocalityLbEndpoints_LedsClusterLocalityConfig{
				LedsClusterLocalityConfig: &endpoint.LedsClusterLocalityConfig{
					LedsConfig:         ledsConfigSource(),
					LedsCollectionName: loc.coll,
				},
			},
		})
	}
	if err := out.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%w: LEDS ClusterLoadAssignment %q: %w", xdscontract.ErrInvalidResource, name, err)
	}
	return e, nil
}

// baseCollection is the collection a locality of cluster owns: named by
// the cluster, region and zone (xdscontract.LEDSCollection); the same
// region and zone listed again in the cluster (at another priority, which
// a State allows) or a region and zone escaping to the same name get a
// numbered one (#2, #3, ... in the cluster's locality order), so that no
// two localities of a cluster own one collection. used holds the names
// the cluster's earlier localities took.
func baseCollection(cluster string, l *core.Locality, used map[string]bool) string {
	base := xdscontract.LEDSCollection(cluster, l.GetRegion(), l.GetZone())
	for k := 2; used[base]; k++ {
		base = xdscontract.LEDSCollection(cluster, l.GetRegion(), l.GetZone()+"#"+strconv.Itoa(k))
	}
	used[base] = true
	return base
}

// diffLocality names loc's endpoints and records in u what changed since
// prev (nil: a new locality). When the endpoints line up with prev's by
// position, or by a shift (diffShifted: the Builder's canonical order,
// an endpoint added or removed, a change of weight, health or metadata),
// only the messages that differ are named again; otherwise the two are
// compared by name.
func (u *ledsUpdate) diffLocality(cluster string, loc, prev *ledsLocality) error {
	loc.names = make([]string, len(loc.lbs))
	if prev != nil && u.diffShifted(cluster, loc, prev) {
		return nil
	}
	aligned := prev != nil && len(prev.lbs) == len(loc.lbs)
	var changed []int
	for j, lb := range loc.lbs {
		if aligned && prev.lbs[j] == lb {
			loc.names[j] = prev.names[j]
			continue
		}
		loc.names[j] = lbName(loc.coll, lb)
		if aligned && loc.names[j] != prev.names[j] {
			aligned = false
		}
		changed = append(changed, j)
	}
	if aligned {
		for _, j := range changed {
			u.toUpdate[loc.names[j]] = loc.lbs[j]
		}
		return nil
	}
	for j, lb := range loc.lbs { // names of the positions skipped above
		if loc.names[j] == "" {
			loc.names[j] = lbName(loc.coll, lb)
		}
	}
	was := make(map[string]*endpoint.LbEndpoint)
	if prev != nil {
		for j, n := range prev.names {
			was[n] = prev.lbs[j]
		}
	}
	seen := make(map[string]struct{}, len(loc.names))
	for j, n := range loc.names {
		if _, dup := seen[n]; dup {
			return fmt.Errorf("%w: ClusterLoadAssignment %q: endpoint %s twice in one locality", xdscontract.ErrInvalidResource, cluster, n)
		}
		seen[n] = struct{}{}
		if was[n] != loc.lbs[j] {
			u.toUpdate[n] = loc.lbs[j]
		}
		delete(was, n)
	}
	for n := range was {
		u.toDelete = append(u.toDelete, n)
	}
	return nil
}

// maxShifted bounds the endpoints diffShifted names anew before it leaves
// the locality to the full comparison.
const maxShifted = 64

// diffShifted is diffLocality's path for the Builder's output: endpoints
// sorted by address and port, an unchanged one kept as the same message.
// Walking loc, it finds each endpoint's message in prev (shiftWalk, as
// the Builder's memo does) and takes its name from there. Only the rest, the fresh messages, are named: each is an update,
// and prev's messages left unmatched whose name no fresh one took are
// deletions. One cell's death in a 1,000-endpoint locality costs a few
// comparisons instead of naming every endpoint and two maps of them (half
// of a 1,000-cell controller's push). Duplicate addresses are adjacent in
// that order, so a fresh name is checked against its neighbours'. It
// reports false, having recorded nothing, when more than maxShifted are
// fresh: the full comparison then runs. loc.names must have loc.lbs's
// length.
func (u *ledsUpdate) diffShifted(cluster string, loc, prev *ledsLocality) bool {
	matched := make([]bool, len(prev.lbs))
	var fresh []int
	var walk shiftWalk
	for j, lb := range loc.lbs {
		if x := walk.find(j, len(prev.lbs), func(x int) bool { return !matched[x] && prev.lbs[x] == lb }); x >= 0 {
			matched[x], loc.names[j] = true, prev.names[x]
			continue
		}
		if fresh = append(fresh, j); len(fresh) > maxShifted {
			clear(loc.names)
			return false
		}
	}
	for _, j := range fresh {
		loc.names[j] = lbName(loc.coll, loc.lbs[j])
	}
	named := make(map[string]struct{}, len(fresh))
	for _, j := range fresh {
		n := loc.names[j]
		if j > 0 && loc.names[j-1] == n || j+1 < len(loc.names) && loc.names[j+1] == n {
			clear(loc.names)
			return false // the full comparison refuses it, with its message
		}
		named[n] = struct{}{}
	}
	for _, j := range fresh {
		u.toUpdate[loc.names[j]] = loc.lbs[j]
	}
	for x, ok := range matched {
		if _, again := named[prev.names[x]]; !ok && !again {
			u.toDelete = append(u.toDelete, prev.names[x])
		}
	}
	return true
}

// lbName is the LEDS resource name of lb in collection coll.
func lbName(coll string, lb *endpoint.LbEndpoint) string {
	sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
	return xdscontract.LEDSEndpointName(coll, net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)))
}

// errLEDSDeltaOnly refuses a state-of-the-world LEDS watch: LEDS is served
// over delta xDS only, as in Envoy (leds.proto).
var errLEDSDeltaOnly = errors.New("xds: LbEndpoint (LEDS) resources are served over delta xDS only")

// ledsCache serves one kind's LinearCache to delta watches, a glob
// collection subscription as a wildcard one (see the top of this file).
type ledsCache struct{ lc *cache.LinearCache }

var _ cache.Cache = ledsCache{}

// CreateWatch implements cache.Cache: refused (never routed here).
func (ledsCache) CreateWatch(*cache.Request, cache.Subscription, chan cache.Response) (func(), error) {
	return nil, errLEDSDeltaOnly
}

// CreateDeltaWatch implements cache.Cache.
func (c ledsCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	return c.lc.CreateDeltaWatch(req, globSubscription{sub}, ch)
}

// Fetch implements cache.Cache: refused.
func (ledsCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errLEDSDeltaOnly
}

// globSubscription is a delta subscription whose glob collection names
// make it wildcard on the kind's LinearCache.
type globSubscription struct{ cache.Subscription }

// IsWildcard implements cache.Subscription.
func (g globSubscription) IsWildcard() bool {
	if g.Subscription.IsWildcard() {
		return true
	}
	for n := range g.SubscribedResources() {
		if xdscontract.IsLEDSCollection(n) {
			return true
		}
	}
	return false
}
