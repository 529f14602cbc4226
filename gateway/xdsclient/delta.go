package xdsclient

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// deltaSession runs one delta (incremental) ADS stream of the
// ClusterLoadAssignments (Subscription.Delta), as Envoy's
// docs/root/api-docs/xds_protocol.rst "Incremental xDS" describes: the
// first request subscribes to every assignment ("*"), every response is
// applied by name (resources replaced, removed_resources deleted) and
// answered with its nonce, an ACK or a NACK carrying error_detail. With
// the controller's LEDS layout (regional/xds Config.LEDS), it subscribes,
// as Envoy does, to the LbEndpoint glob collections the assignments name
// (xdscontract.LEDSCollection) and fills each locality from its
// collection. One endpoint's change costs its bytes on the wire and its
// own decode, whatever the cluster's size: ApplyDecoded gets the decoded
// view, kept up to date by the changed LbEndpoints alone (delta_apply.go);
// without ApplyDecoded, Apply gets the assignments reassembled in the EDS
// form (and decodes them in full, as on state-of-the-world). Neither is
// called while an assignment names a collection none of whose endpoints
// has arrived yet. A response refused before Apply (deltaState.apply) is
// told to Refused and changes nothing held; one ApplyDecoded or Apply
// refuses stays held: that refusal stands until the server replaces it.
func (s *Subscription) deltaSession(ctx context.Context) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opts []grpc.CallOption
	if s.MaxMsg > 0 {
		opts = append(opts, grpc.MaxCallRecvMsgSize(s.MaxMsg))
	}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(s.Conn).DeltaAggregatedResources(sctx, opts...)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: s.Node, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		return false, err
	}
	st := newDeltaState()
	first := true
	nackPace := backoff.New(backoff.Policy{Min: s.Min, Max: s.Max, Jitter: backoff.None})
	for {
		resp, err := stream.Recv()
		if err != nil {
			s.tooLarge(err)
			return got, err
		}
		if s.Size != nil {
			s.Size(proto.Size(resp), false)
		}
		if first && s.Connected != nil {
			s.Connected(true)
			first = false
		}
		sub, unsub, err := s.deltaApply(st, resp)
		ack := &discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		if err != nil {
			wait := nackPace.Next()
			s.Log.Warn("xds delta update refused", "type", s.Label, "nonce", resp.GetNonce(), "err", err, "nack_in", wait)
			if err := s.sleep(ctx, wait); err != nil {
				return got, err
			}
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: truncate.String(err.Error(), 1024)}
		} else {
			nackPace.Reset()
			got = true
		}
		if err := stream.Send(ack); err != nil {
			return got, err
		}
		if len(sub)+len(unsub) > 0 {
			if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: xdscontract.LbEndpointType,
				ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub}); err != nil {
				return got, err
			}
		}
	}
}

// tooLarge reports a stream broken by a response above MaxMsg.
func (s *Subscription) tooLarge(err error) {
	if grpcstatus.Code(err) == codes.ResourceExhausted && s.Size != nil {
		s.Size(0, true)
		s.Log.Error("xds response above the receive limit; the stream reconnects and the last configuration stays in use: set --xds-max-cells to the controller's --max-cells",
			"type", s.Label, "limit_bytes", s.MaxMsg, "err", err)
	}
}

// sleep waits d on the Subscription's clock, or until ctx ends.
func (s *Subscription) sleep(ctx context.Context, d time.Duration) error {
	t := s.Clock.NewTimer(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}

// deltaApply applies one response to st and hands the result on
// (ApplyDecoded, or else Apply) once every collection named has arrived.
// A response st refuses is told to Refused.
func (s *Subscription) deltaApply(st *deltaState, resp *discovery.DeltaDiscoveryResponse) (sub, unsub []string, err error) {
	sub, unsub, err = st.apply(resp)
	if err != nil {
		if s.Refused != nil {
			s.Refused(err)
		}
		return nil, nil, err
	}
	if !st.complete() {
		return sub, unsub, nil
	}
	if s.ApplyDecoded != nil {
		clusters, changed := st.view.handOut()
		if err = s.ApplyDecoded(clusters, changed, resp.GetSystemVersionInfo()); err == nil {
			clear(st.view.dirty)
		}
		return sub, unsub, err
	}
	var rs []*anypb.Any
	if rs, err = st.assembled(); err == nil {
		err = s.Apply(rs, resp.GetSystemVersionInfo())
	}
	return sub, unsub, err
}

// deltaState is what one delta stream holds: the assignments by cluster
// name, the LbEndpoints by resource name, the collections subscribed, how
// many LbEndpoints each collection holds, and the decoded view of them
// all (delta_apply.go). A response is applied whole or not at all: it is
// decoded and validated before anything held changes, so a refused one
// (NACKed) leaves the state as the last accepted response left it, as
// Envoy keeps its last good configuration. Only the session's goroutine
// uses it.
type deltaState struct {
	clas  map[string]*endpoint.ClusterLoadAssignment
	lbs   map[string]*endpoint.LbEndpoint
	globs map[string]bool
	count map[string]int
	view  *decodedView
}

func newDeltaState() *deltaState {
	v, _ := buildView(nil, nil) // cannot fail: nothing to decode
	return &deltaState{clas: make(map[string]*endpoint.ClusterLoadAssignment),
		lbs: make(map[string]*endpoint.LbEndpoint), globs: make(map[string]bool), count: make(map[string]int), view: v}
}

// apply applies one response and returns the LEDS collections to
// subscribe to and to unsubscribe from.
func (d *deltaState) apply(resp *discovery.DeltaDiscoveryResponse) (sub, unsub []string, err error) {
	if len(resp.GetResources()) > maxResources*1024 {
		return nil, nil, invalid("delta response with %d resources", len(resp.GetResources()))
	}
	switch resp.GetTypeUrl() {
	case resource.EndpointType:
		return d.applyAssignments(resp)
	case xdscontract.LbEndpointType:
		return nil, nil, d.applyLbEndpoints(resp)
	default:
		return nil, nil, invalid("delta response of unrequested type %q", truncate.String(resp.GetTypeUrl(), 256))
	}
}

// applyAssignments applies a response of ClusterLoadAssignments: the
// view is decoded anew from them and the held LbEndpoints (a change of
// assignments is a change of topology, rare).
func (d *deltaState) applyAssignments(resp *discovery.DeltaDiscoveryResponse) (sub, unsub []string, err error) {
	clas := maps.Clone(d.clas)
	for _, r := range resp.GetResources() {
		var cla endpoint.ClusterLoadAssignment
		if err := unpack(r.GetResource(), &cla); err != nil {
			return nil, nil, err
		}
		if cla.GetClusterName() != r.GetName() {
			return nil, nil, invalid("delta resource %q holds ClusterLoadAssignment %q", truncate.String(r.GetName(), 256), truncate.String(cla.GetClusterName(), 256))
		}
		clas[r.GetName()] = &cla
	}
	for _, n := range resp.GetRemovedResources() {
		delete(clas, n)
	}
	globs, lbs := maps.Clone(d.globs), d.lbs
	sub, unsub = globChanges(clas, globs)
	if len(unsub) > 0 {
		lbs = maps.Clone(d.lbs)
		for n := range lbs {
			if c, _ := collectionOf(n); slices.Contains(unsub, c) {
				delete(lbs, n)
			}
		}
	}
	view, err := buildView(clas, lbs)
	if err != nil {
		return nil, nil, err
	}
	d.clas, d.globs, d.lbs, d.view = clas, globs, lbs, view
	if len(unsub) > 0 {
		for _, c := range unsub {
			delete(d.count, c)
		}
	}
	return sub, unsub, nil
}

// applyLbEndpoints applies a response of LbEndpoints: only they are
// validated and decoded, and only the clusters their collections fill are
// rebuilt.
func (d *deltaState) applyLbEndpoints(resp *discovery.DeltaDiscoveryResponse) error {
	added := make(map[string]*endpoint.LbEndpoint, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		if _, ok := xdscontract.LEDSCollectionOf(r.GetName()); !ok {
			return invalid("LbEndpoint %q is not in an isobar LEDS collection", truncate.String(r.GetName(), 256))
		}
		var lb endpoint.LbEndpoint
		if err := unpack(r.GetResource(), &lb); err != nil {
			return err
		}
		added[r.GetName()] = &lb
	}
	chs, err := d.view.prepare(added, resp.GetRemovedResources())
	if err != nil {
		return err
	}
	for n, lb := range added {
		if _, held := d.lbs[n]; !held {
			c, _ := collectionOf(n)
			d.count[c]++
		}
		d.lbs[n] = lb
	}
	for _, n := range resp.GetRemovedResources() {
		if _, held := d.lbs[n]; held {
			c, _ := collectionOf(n)
			if d.count[c]--; d.count[c] == 0 {
				delete(d.count, c)
			}
			delete(d.lbs, n)
		}
	}
	d.view.commit(chs)
	return nil
}

// globChanges brings the subscribed collections globs in line with those
// the assignments clas name.
func globChanges(clas map[string]*endpoint.ClusterLoadAssignment, globs map[string]bool) (sub, unsub []string) {
	named := make(map[string]bool)
	for _, cla := range clas {
		for _, ll := range cla.GetEndpoints() {
			if n := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName(); n != "" {
				named[n] = true
			}
		}
	}
	for g := range named {
		if !globs[g] {
			globs[g] = true
			sub = append(sub, g)
		}
	}
	for g := range globs {
		if !named[g] {
			delete(globs, g)
			unsub = append(unsub, g)
		}
	}
	slices.Sort(sub)
	slices.Sort(unsub)
	return sub, unsub
}

// byCollection returns the held LbEndpoint names by collection, sorted.
func (d *deltaState) byCollection() map[string][]string {
	out := make(map[string][]string)
	for n := range d.lbs {
		c, _ := xdscontract.LEDSCollectionOf(n)
		out[c] = append(out[c], n)
	}
	for _, ns := range out {
		slices.Sort(ns)
	}
	return out
}

// complete reports whether every collection an assignment names holds an
// endpoint (the controller never names an empty one).
func (d *deltaState) complete() bool {
	for g := range d.globs {
		if d.count[g] == 0 {
			return false
		}
	}
	return true
}

// assembled returns the held assignments in the EDS form, packed: the
// full path, which Apply gets when there is no ApplyDecoded, and the
// reference the decoded view is tested against.
func (d *deltaState) assembled() ([]*anypb.Any, error) {
	have := d.byCollection()
	names := make([]string, 0, len(d.clas))
	for n := range d.clas {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]*anypb.Any, 0, len(names))
	for _, n := range names {
		cla := proto.Clone(d.clas[n]).(*endpoint.ClusterLoadAssignment)
		for _, ll := range cla.GetEndpoints() {
			coll := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName()
			if coll == "" {
				continue
			}
			ll.LbConfig = nil
			for _, en := range have[coll] {
				ll.LbEndpoints = append(ll.LbEndpoints, d.lbs[en])
			}
		}
		a, err := anypb.New(cla)
		if err != nil {
			return nil, fmt.Errorf("%w: pack ClusterLoadAssignment %q: %w", ErrInvalidResource, n, err)
		}
		out = append(out, a)
	}
	return out, nil
}
