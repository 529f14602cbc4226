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
// only). A one-endpoint change is then one LbEndpoint per cluster holding
// it, whatever the cluster's size.
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
	// eps holds the cluster's LbEndpoint resources by name. The messages
	// are the EDS CLA's own (shared, never modified).
	eps         map[string]*endpoint.LbEndpoint
	collections []string
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
	clas        []*endpoint.ClusterLoadAssignment // in the order of the EDS set
	entries     map[string]*ledsEntry
	toUpdate    map[string]types.Resource
	toDelete    []string
	collections map[string]struct{}
}

// prepare computes the LEDS layout of the EDS assignments clas against
// the last applied one. An assignment that is the same pointer as last
// time keeps its entry, so the cost is that of the assignments that
// changed.
func (l *ledsKind) prepare(clas []*endpoint.ClusterLoadAssignment) (*ledsUpdate, error) {
	u := &ledsUpdate{
		clas:        make([]*endpoint.ClusterLoadAssignment, len(clas)),
		entries:     make(map[string]*ledsEntry, len(clas)),
		toUpdate:    make(map[string]types.Resource),
		collections: make(map[string]struct{}),
	}
	for i, cla := range clas {
		name := cla.GetClusterName()
		prev := l.entries[name]
		e := prev
		if prev == nil || prev.src != cla {
			var err error
			if e, err = newLEDSEntry(cla); err != nil {
				return nil, err
			}
			var prevEps map[string]*endpoint.LbEndpoint
			if prev != nil {
				prevEps = prev.eps
			}
			for n, lb := range e.eps {
				if prevEps[n] != lb {
					u.toUpdate[n] = lb
				}
			}
			for n := range prevEps {
				if _, ok := e.eps[n]; !ok {
					u.toDelete = append(u.toDelete, n)
				}
			}
		}
		u.clas[i], u.entries[name] = e.out, e
		for _, c := range e.collections {
			u.collections[c] = struct{}{}
		}
	}
	for name, prev := range l.entries {
		if _, ok := u.entries[name]; !ok {
			for n := range prev.eps {
				u.toDelete = append(u.toDelete, n)
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

// newLEDSEntry makes the LEDS form of cla: its localities with their
// locality, weight, priority and metadata (the fields the Builder sets) and
// a collection each, and one LbEndpoint resource per endpoint.
func newLEDSEntry(cla *endpoint.ClusterLoadAssignment) (*ledsEntry, error) {
	name := cla.GetClusterName()
	out := &endpoint.ClusterLoadAssignment{ClusterName: name, Policy: cla.GetPolicy()}
	e := &ledsEntry{src: cla, out: out, eps: make(map[string]*endpoint.LbEndpoint)}
	for _, ll := range cla.GetEndpoints() {
		coll := xdscontract.LEDSCollection(name, ll.GetLocality().GetRegion(), ll.GetLocality().GetZone())
		out.Endpoints = append(out.Endpoints, &endpoint.LocalityLbEndpoints{
			Locality:            ll.GetLocality(),
			LoadBalancingWeight: ll.GetLoadBalancingWeight(),
			Priority:            ll.GetPriority(),
			Metadata:            ll.GetMetadata(),
			LbConfig: &endpoint.LocalityLbEndpoints_LedsClusterLocalityConfig{
				LedsClusterLocalityConfig: &endpoint.LedsClusterLocalityConfig{
					LedsConfig:         ledsConfigSource(),
					LedsCollectionName: coll,
				},
			},
		})
		e.collections = append(e.collections, coll)
		for _, lb := range ll.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			n := xdscontract.LEDSEndpointName(coll, net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)))
			if _, dup := e.eps[n]; dup {
				return nil, fmt.Errorf("%w: ClusterLoadAssignment %q: endpoint %s twice in one locality", xdscontract.ErrInvalidResource, name, n)
			}
			e.eps[n] = lb
		}
	}
	if err := out.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%w: LEDS ClusterLoadAssignment %q: %w", xdscontract.ErrInvalidResource, name, err)
	}
	return e, nil
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
