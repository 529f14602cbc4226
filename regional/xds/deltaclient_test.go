package xds

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// deltaClient is an incremental xDS client independent of the server's
// code: go-control-plane has no delta client (pkg/client holds only sotw),
// so it drives the generated envoy DeltaAggregatedResources stream as
// Envoy's docs/root/api-docs/xds_protocol.rst, "Incremental xDS", says:
// the first request of each type carries the node and its subscriptions
// ("*": every resource of the type); every response is applied (resources
// added or replaced by name, removed_resources deleted) and ACKed with its
// nonce; and, as Envoy does for LEDS (endpoint_components.proto
// LedsClusterLocalityConfig), the glob collections named by the received
// ClusterLoadAssignments are subscribed to, and those no longer named
// unsubscribed, on the LbEndpoint type. Only its receive goroutine sends
// after the first requests.
type deltaClient struct {
	t      testing.TB
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	res   map[string]map[string]*anypb.Any // by type URL, then name
	globs map[string]bool                  // LEDS collections subscribed
	bytes int                              // proto size of every response received
	count int                              // responses received
	err   error
	// handled gets a token after each response is applied and answered
	// (buffered 1: a waiter reads the state under mu after it).
	handled chan struct{}
}

// deltaTypes are the types a delta client subscribes to, in ADS order.
var deltaTypes = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

func newDeltaClient(t testing.TB, conn *grpc.ClientConn, node *core.Node) *deltaClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream, cancel: cancel, done: make(chan struct{}),
		res: make(map[string]map[string]*anypb.Any), globs: make(map[string]bool), handled: make(chan struct{}, 1)}
	for i, typ := range append(deltaTypes, xdscontract.LbEndpointType) {
		c.res[typ] = make(map[string]*anypb.Any)
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typ}
		if i == 0 {
			req.Node = node
		}
		if typ != xdscontract.LbEndpointType {
			req.ResourceNamesSubscribe = []string{"*"}
		}
		if typ == xdscontract.LbEndpointType {
			continue // subscribed once assignments name collections
		}
		if err := stream.Send(req); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	go c.run()
	t.Cleanup(c.close)
	return c
}

func (c *deltaClient) close() {
	c.cancel()
	<-c.done
}

func (c *deltaClient) run() {
	defer close(c.done)
	for {
		resp, err := c.stream.Recv()
		if err == nil {
			err = c.handle(resp)
		}
		select {
		case c.handled <- struct{}{}:
		default:
		}
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
	}
}

// handle applies one response and answers it: the ACK, with the LEDS
// subscription changes when assignments changed.
func (c *deltaClient) handle(resp *discovery.DeltaDiscoveryResponse) error {
	typ := resp.GetTypeUrl()
	c.mu.Lock()
	c.bytes += proto.Size(resp)
	c.count++
	have := c.res[typ]
	if have == nil {
		c.mu.Unlock()
		return fmt.Errorf("response of unrequested type %q", typ)
	}
	for _, r := range resp.GetResources() {
		have[r.GetName()] = r.GetResource()
	}
	for _, n := range resp.GetRemovedResources() {
		delete(have, n)
	}
	var sub, unsub []string
	if typ == resource.EndpointType {
		named, err := c.collectionsLocked()
		if err != nil {
			c.mu.Unlock()
			return err
		}
		for g := range named {
			if !c.globs[g] {
				c.globs[g] = true
				sub = append(sub, g)
			}
		}
		for g := range c.globs {
			if !named[g] {
				delete(c.globs, g)
				unsub = append(unsub, g)
			}
		}
	}
	c.mu.Unlock()
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.GetNonce()}); err != nil {
		return err
	}
	if len(sub)+len(unsub) == 0 {
		return nil
	}
	return c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: xdscontract.LbEndpointType,
		ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub})
}

// collectionsLocked returns the LEDS collections the held assignments name.
func (c *deltaClient) collectionsLocked() (map[string]bool, error) {
	out := make(map[string]bool)
	for _, a := range c.res[resource.EndpointType] {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			return nil, err
		}
		for _, ll := range cla.GetEndpoints() {
			if n := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName(); n != "" {
				out[n] = true
			}
		}
	}
	return out, nil
}

// received returns the bytes and count of the responses received so far.
func (c *deltaClient) received() (bytes, count int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, c.count
}

// assembled returns the client's resources by type and name, each
// assignment with its LEDS localities filled from their collections
// (endpoints in name order), or an error if the stream failed or an
// assignment names a collection the client holds nothing of yet.
func (c *deltaClient) assembled() (map[string]map[string]proto.Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	byColl := make(map[string][]string)
	for n := range c.res[xdscontract.LbEndpointType] {
		coll, ok := xdscontract.LEDSCollectionOf(n)
		if !ok {
			return nil, fmt.Errorf("LbEndpoint %q is not in a collection", n)
		}
		byColl[coll] = append(byColl[coll], n)
	}
	out := make(map[string]map[string]proto.Message)
	for _, typ := range deltaTypes {
		out[typ] = make(map[string]proto.Message)
		for n, a := range c.res[typ] {
			m, err := a.UnmarshalNew()
			if err != nil {
				return nil, err
			}
			if cla, ok := m.(*endpoint.ClusterLoadAssignment); ok {
				if err := c.fillLocked(cla, byColl); err != nil {
					return nil, err
				}
			}
			out[typ][n] = m
		}
	}
	return out, nil
}

func (c *deltaClient) fillLocked(cla *endpoint.ClusterLoadAssignment, byColl map[string][]string) error {
	for _, ll := range cla.GetEndpoints() {
		coll := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName()
		if coll == "" {
			continue
		}
		names := byColl[coll]
		if len(names) == 0 {
			return fmt.Errorf("collection %q: no endpoint yet", coll)
		}
		slices.Sort(names)
		lbs := make([]*endpoint.LbEndpoint, len(names))
		for i, n := range names {
			lbs[i] = &endpoint.LbEndpoint{}
			if err := c.res[xdscontract.LbEndpointType][n].UnmarshalTo(lbs[i]); err != nil {
				return err
			}
		}
		// The EDS layout lists endpoints in lb_endpoints (the field, not
		// the lb_config oneof's load_balancer_endpoints).
		ll.LbConfig = nil
		ll.LbEndpoints = lbs
	}
	return nil
}

// sotwResources returns the state-of-the-world snapshot of kind as the
// delta client's assembled form: every resource by type and name, each
// assignment's endpoints in address order.
func sotwResources(s *Server, kind NodeKind) map[string]map[string]proto.Message {
	s.pushMu.Lock()
	snap := s.lastSnaps[kindIndex(kind)]
	s.pushMu.Unlock()
	out := make(map[string]map[string]proto.Message)
	for _, typ := range deltaTypes {
		out[typ] = make(map[string]proto.Message)
		for n, r := range snap.GetResourcesAndTTL(typ) {
			out[typ][n] = r.Resource
		}
	}
	return out
}

// lbAddress orders endpoints by address as LEDSEndpointName names them.
func lbAddress(lb *endpoint.LbEndpoint) string {
	sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
}

// sameState reports how the delta client's assembled state differs from
// the state-of-the-world snapshot of kind; nil when equal (endpoint order
// within a locality aside).
func sameState(c *deltaClient, s *Server, kind NodeKind) error {
	got, err := c.assembled()
	if err != nil {
		return err
	}
	want := sotwResources(s, kind)
	for _, typ := range deltaTypes {
		if len(got[typ]) != len(want[typ]) {
			return fmt.Errorf("%s: %d resources, snapshot has %d", typeLabel(typ), len(got[typ]), len(want[typ]))
		}
		for n, w := range want[typ] {
			g, ok := got[typ][n]
			if !ok {
				return fmt.Errorf("%s %q missing", typeLabel(typ), n)
			}
			if cla, ok := w.(*endpoint.ClusterLoadAssignment); ok {
				w = sortedCLA(cla)
				g = sortedCLA(g.(*endpoint.ClusterLoadAssignment))
			}
			if !proto.Equal(g, w) {
				return fmt.Errorf("%s %q differs:\n got %v\nwant %v", typeLabel(typ), n, g, w)
			}
		}
	}
	return nil
}

// sortedCLA returns a copy of cla with each locality's endpoints in
// address order.
func sortedCLA(cla *endpoint.ClusterLoadAssignment) *endpoint.ClusterLoadAssignment {
	out := proto.Clone(cla).(*endpoint.ClusterLoadAssignment)
	for _, ll := range out.GetEndpoints() {
		slices.SortFunc(ll.GetLbEndpoints(), func(a, b *endpoint.LbEndpoint) int { return cmp.Compare(lbAddress(a), lbAddress(b)) })
	}
	return out
}

// awaitSame waits until c agrees with the snapshot of kind.
func awaitSame(t *testing.T, c *deltaClient, s *Server, kind NodeKind, step string) {
	t.Helper()
	eventually.NoError(t, testTimeout, step+": the delta client to agree with the snapshot", func() error {
		return sameState(c, s, kind)
	})
}
