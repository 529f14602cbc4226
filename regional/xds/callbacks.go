package xds

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// maxDetailLen bounds the NACK error detail kept and logged per stream.
const maxDetailLen = 1024

// StreamStatus is what one open xDS stream has been sent and has
// acknowledged.
type StreamStatus struct {
	// ID is the stream id given by the xDS server.
	ID int64
	// NodeID, UserAgent and Kind describe the client, from its first request.
	NodeID    string
	UserAgent string
	Kind      NodeKind
	// Types holds, per type URL, the versions sent, acknowledged and
	// rejected on this stream.
	Types map[string]TypeStatus
}

// TypeStatus is the state of one resource type on one stream.
type TypeStatus struct {
	// Sent is the version of the last response sent.
	Sent string
	// Acked is the version of the last response the client acknowledged.
	Acked string
	// Nacked is the version of the last response the client rejected, and
	// NackDetail the reason it gave (truncated).
	Nacked     string
	NackDetail string
}

// streamNode is who a stream's first request with a Node said it is,
// bounded (both stream variants keep one).
type streamNode struct {
	nodeID, userAgent string
	kind              NodeKind
	hasNode           bool
}

// noteNode records n when the stream has no node yet.
func (sn *streamNode) noteNode(n *core.Node) {
	if sn.hasNode || n == nil {
		return
	}
	sn.hasNode = true
	sn.nodeID = truncate.String(n.GetId(), xdscontract.MaxNameLen)
	sn.userAgent = truncate.String(n.GetUserAgentName(), xdscontract.MaxNameLen)
	sn.kind = ClassifyNode(n)
}

type streamState struct {
	id int64
	streamNode
	types [numTypes]typeState
}

type typeState struct {
	sentNonce   string
	sentVersion string
	acked       string
	nacked      string
	nackDetail  string
	loggedNack  string // the version whose NACK was last logged
	// loggedStale and loggedUnknown are the versions (sent, and of the
	// snapshot) for which a stale nonce and a request for unknown names
	// were last logged: bad input is logged once per version.
	loggedStale   string
	loggedUnknown uint64
}

// callbacks feeds the xDS server's stream events into the Server. The xDS
// server calls it synchronously from every stream's goroutine.
type callbacks struct{ s *Server }

var _ serverv3.Callbacks = callbacks{}

// authorize applies Deps.Authorize to a stream or fetch.
func (c callbacks) authorize(ctx context.Context, what string) error {
	s := c.s
	if s.authorize == nil {
		return nil
	}
	if err := s.authorize(ctx); err != nil {
		s.m.refused.Inc()
		s.log.Warn("xds client refused", "request", what, "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// OnStreamOpen implements serverv3.Callbacks. After Stop, or when
// Deps.Authorize refuses the client, it refuses the stream.
func (c callbacks) OnStreamOpen(ctx context.Context, id int64, _ string) error {
	if err := c.authorize(ctx, "stream"); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	s.streams[id] = &streamState{id: id}
	s.m.streams.Inc()
	return nil
}

// OnStreamClosed implements serverv3.Callbacks.
func (c callbacks) OnStreamClosed(id int64, _ *core.Node) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[id]; ok {
		delete(s.streams, id)
		s.m.streams.Dec()
	}
}

// OnStreamRequest implements serverv3.Callbacks: it counts the request and,
// when it answers the last response of its type on the stream, records an
// ACK or a NACK.
//
// On a NACK it also sets the request's version_info to the rejected version
// before the cache sees it. The client reports its last good version there,
// which differs from the snapshot's, so the cache would resend the rejected
// resources at once, and the client would reject them again, thousands of
// times a second, until the next Push. Marked as holding the rejected
// version, the client is sent nothing until that type changes.
func (c callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	s := c.s
	typeURL := req.GetTypeUrl()
	label := typeLabel(typeURL)
	s.m.requests.WithLabelValues(label).Inc()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return nil
	}
	st.noteNode(req.GetNode())
	t := typeIndex(typeURL)
	if t == typeOther {
		return nil
	}
	ts := &st.types[t]
	c.checkNames(st, ts, t, label, req.GetResourceNames())
	nonce := req.GetResponseNonce()
	if nonce == "" {
		return nil // a first request
	}
	if nonce != ts.sentNonce {
		// A stale nonce (the client answers an older response) or one never
		// sent: ignored, as the xDS protocol says, and counted.
		s.m.staleNonces.WithLabelValues(label).Inc()
		if ts.loggedStale != ts.sentVersion || ts.sentVersion == "" {
			ts.loggedStale = ts.sentVersion
			s.log.Info("xds request with a stale or unknown nonce ignored",
				"node_id", st.nodeID, "user_agent", st.userAgent, "type", label,
				"nonce", truncate.String(nonce, 64), "sent_nonce", ts.sentNonce, "version", ts.sentVersion)
		}
		return nil
	}
	if req.GetErrorDetail() == nil {
		s.m.acks.WithLabelValues(label).Inc()
		ts.acked = ts.sentVersion
		if !s.stopped { // Stop closed ackCh for good
			close(s.ackCh)
			s.ackCh = make(chan struct{})
		}
		return nil
	}
	s.m.nacks.WithLabelValues(label).Inc()
	ts.nacked = ts.sentVersion
	ts.nackDetail = truncate.String(req.GetErrorDetail().GetMessage(), maxDetailLen)
	if ts.loggedNack != ts.sentVersion {
		ts.loggedNack = ts.sentVersion
		s.log.Warn("xds client rejected resources",
			"node_id", st.nodeID, "node_kind", string(st.kind), "user_agent", st.userAgent,
			"type", label, "version", ts.sentVersion, "last_good_version", req.GetVersionInfo(),
			"error_detail", ts.nackDetail)
	}
	req.VersionInfo = ts.sentVersion
	return nil
}

// checkNames counts, and logs once per snapshot version, a request that
// names resources the client's snapshot does not hold (a typo, a model
// that left, or a client probing). The cache answers with what it has.
// Called with s.mu held.
func (c callbacks) checkNames(st *streamState, ts *typeState, t resourceType, label string, names []string) {
	s := c.s
	if !st.hasNode || len(names) == 0 {
		return
	}
	k := kindIndex(st.kind)
	have := s.names[k][t]
	if have == nil {
		return // nothing pushed yet
	}
	var unknown []string
	for _, n := range names {
		if _, ok := have[n]; !ok && n != "*" {
			unknown = append(unknown, truncate.String(n, xdscontract.MaxNameLen))
			if len(unknown) == 5 {
				break
			}
		}
	}
	if len(unknown) == 0 {
		return
	}
	s.m.unknownNames.WithLabelValues(label).Inc()
	if v := s.versions[k][t]; ts.loggedUnknown != v {
		ts.loggedUnknown = v
		s.log.Info("xds request names resources this server does not have",
			"node_id", st.nodeID, "user_agent", st.userAgent, "type", label, "names", unknown, "version", v)
	}
}

// OnStreamResponse implements serverv3.Callbacks: it records the version and
// nonce sent.
func (c callbacks) OnStreamResponse(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	s := c.s
	typeURL := resp.GetTypeUrl()
	s.m.responses.WithLabelValues(typeLabel(typeURL)).Inc()
	t := typeIndex(typeURL)
	if t == typeOther {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil {
		st.types[t].sentNonce = resp.GetNonce()
		st.types[t].sentVersion = resp.GetVersionInfo()
	}
}

// deltaStreamState is what one delta stream told and was sent, for the
// served types (the type URLs typeIndex knows, and LbEndpoint).
type deltaStreamState struct {
	streamNode
	// sent holds the nonce of the last response of each type.
	sent map[string]string
	// loggedStale and loggedUnknown mark the types whose stale nonce and
	// unknown names were logged: bad input is logged once per stream and
	// type (and counted every time).
	loggedStale, loggedUnknown map[string]bool
}

// deltaServed reports whether delta requests of typeURL are tracked.
func deltaServed(typeURL string) bool {
	return typeIndex(typeURL) != typeOther || typeURL == xdscontract.LbEndpointType
}

// OnDeltaStreamOpen implements serverv3.Callbacks. Delta streams are served
// (after Deps.Authorize) and counted, their ACKs, NACKs, stale nonces and
// unknown names counted too; WaitForAck and Streams see only
// state-of-the-world streams.
func (c callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	if err := c.authorize(ctx, "delta_stream"); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	s.deltaStreams[id] = &deltaStreamState{
		sent: make(map[string]string), loggedStale: make(map[string]bool), loggedUnknown: make(map[string]bool),
	}
	s.m.streams.Inc()
	return nil
}

// OnDeltaStreamClosed implements serverv3.Callbacks. It is called for
// refused streams too.
func (c callbacks) OnDeltaStreamClosed(id int64, _ *core.Node) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.deltaStreams[id]; ok {
		delete(s.deltaStreams, id)
		s.m.streams.Dec()
	}
}

// OnStreamDeltaRequest implements serverv3.Callbacks. It counts the
// request, the names it subscribes to that the client's snapshot does not
// hold, and what its response_nonce says: an ACK or a NACK of the last
// response of its type, or a stale or made-up nonce. The xDS protocol
// (api/envoy/service/discovery/v3 and docs/root/api-docs/xds_protocol.rst,
// "Incremental xDS": the nonce pairs a response to its ACK or NACK;
// "Resource updates": a request with a stale nonce gets no response of
// its own) makes a stale nonce no ACK or NACK: it is counted in
// isobar_regional_xds_stale_nonces_total and otherwise ignored; the
// library still applies the request's subscription changes. A name that
// does not exist gets no answer now (the client's does-not-exist timeout,
// "Knowing When a Requested Resource Does Not Exist") and the resource if
// it appears later, the subscription being remembered.
func (c callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	s := c.s
	typeURL := req.GetTypeUrl()
	label := typeLabel(typeURL)
	s.m.requests.WithLabelValues(label).Inc()
	s.mu.Lock()
	defer s.mu.Unlock()
	ds := s.deltaStreams[id]
	if ds == nil {
		return nil
	}
	ds.noteNode(req.GetNode())
	if !deltaServed(typeURL) {
		return nil
	}
	c.checkDeltaNames(ds, typeURL, label, req.GetResourceNamesSubscribe())
	nonce := req.GetResponseNonce()
	switch {
	case nonce == "":
	case nonce != ds.sent[typeURL]:
		s.m.staleNonces.WithLabelValues(label).Inc()
		if !ds.loggedStale[typeURL] {
			ds.loggedStale[typeURL] = true
			s.log.Info("xds delta request with a stale or unknown nonce: not an ACK or NACK",
				"node_id", ds.nodeID, "user_agent", ds.userAgent, "type", label,
				"nonce", truncate.String(nonce, 64), "sent_nonce", ds.sent[typeURL])
		}
	case req.GetErrorDetail() == nil:
		s.m.acks.WithLabelValues(label).Inc()
	default:
		s.m.nacks.WithLabelValues(label).Inc()
		s.log.Warn("xds delta client rejected resources",
			"node_id", ds.nodeID, "node_kind", string(ds.kind), "user_agent", ds.userAgent, "type", label,
			"nonce", nonce, "error_detail", truncate.String(req.GetErrorDetail().GetMessage(), maxDetailLen))
	}
	return nil
}

// checkDeltaNames counts a delta request subscribing to names the client's
// snapshot does not hold (LbEndpoint: a collection, or a resource of a
// collection, that no assignment names). Called with s.mu held.
func (c callbacks) checkDeltaNames(ds *deltaStreamState, typeURL, label string, names []string) {
	s := c.s
	if !ds.hasNode || len(names) == 0 {
		return
	}
	k := kindIndex(ds.kind)
	var have map[string]struct{}
	if t := typeIndex(typeURL); t != typeOther {
		have = s.names[k][t]
	} else {
		have = s.collections[k]
	}
	if have == nil {
		return // nothing pushed yet, or LEDS off
	}
	var unknown []string
	for _, n := range names {
		key := n
		if coll, ok := xdscontract.LEDSCollectionOf(n); ok && typeURL == xdscontract.LbEndpointType {
			key = coll
		}
		if _, ok := have[key]; !ok && n != "*" {
			unknown = append(unknown, truncate.String(n, xdscontract.MaxNameLen))
			if len(unknown) == 5 {
				break
			}
		}
	}
	if len(unknown) == 0 {
		return
	}
	s.m.unknownNames.WithLabelValues(label).Inc()
	if !ds.loggedUnknown[typeURL] {
		ds.loggedUnknown[typeURL] = true
		s.log.Info("xds delta request subscribes to resources this server does not have",
			"node_id", ds.nodeID, "user_agent", ds.userAgent, "type", label, "names", unknown)
	}
}

// OnStreamDeltaResponse implements serverv3.Callbacks: it records the
// nonce sent.
func (c callbacks) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	s := c.s
	typeURL := resp.GetTypeUrl()
	s.m.responses.WithLabelValues(typeLabel(typeURL)).Inc()
	if !deltaServed(typeURL) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ds := s.deltaStreams[id]; ds != nil {
		ds.sent[typeURL] = resp.GetNonce()
	}
}

// OnFetchRequest implements serverv3.Callbacks; Deps.Authorize applies.
func (c callbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	c.s.m.requests.WithLabelValues(typeLabel(req.GetTypeUrl())).Inc()
	return c.authorize(ctx, "fetch")
}

// OnFetchResponse implements serverv3.Callbacks.
func (c callbacks) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

// WaitForAck blocks until some open stream has acknowledged typeURL at the
// snapshot version (a value Push returned) or newer. A type that version
// did not change counts as acknowledged by a client holding the type's
// current content. It returns ctx.Err() when ctx ends, ErrStopped after
// Stop, and an error wrapping ErrBadVersion for a version not pushed yet.
func (s *Server) WaitForAck(ctx context.Context, typeURL, version string) error {
	v, err := strconv.ParseUint(version, 10, 64)
	if err != nil || v == 0 {
		return fmt.Errorf("%w: %q is not a version returned by Push", ErrBadVersion, version)
	}
	t := typeIndex(typeURL)
	if t == typeOther {
		return fmt.Errorf("%w: type %q is not served", ErrBadVersion, typeURL)
	}
	for {
		s.mu.Lock()
		if v > s.seq {
			s.mu.Unlock()
			return fmt.Errorf("%w: %d is newer than the last pushed version %d", ErrBadVersion, v, s.seq)
		}
		ok := s.ackedLocked(t, v)
		stopped, ch := s.stopped, s.ackCh
		s.mu.Unlock()
		if ok {
			return nil
		}
		if stopped {
			return ErrStopped
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// ackedLocked reports whether some stream holds type t at version v or
// newer. Versions of a type are the pushes that changed it, so an ACK of a
// >= v holds v's content or newer, and so does an ACK of the type's current
// version.
func (s *Server) ackedLocked(t resourceType, v uint64) bool {
	for _, st := range s.streams {
		a, err := strconv.ParseUint(st.types[t].acked, 10, 64)
		if err != nil || a == 0 {
			continue
		}
		if a >= v || a == s.versions[kindIndex(st.kind)][t] {
			return true
		}
	}
	return false
}

// Streams returns the state of every open state-of-the-world stream, by id.
func (s *Server) Streams() []StreamStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StreamStatus, 0, len(s.streams))
	for _, st := range s.streams {
		ss := StreamStatus{ID: st.id, NodeID: st.nodeID, UserAgent: st.userAgent, Kind: st.kind, Types: make(map[string]TypeStatus)}
		for t := range numTypes {
			ts := &st.types[t]
			if ts.sentNonce == "" {
				continue
			}
			ss.Types[t.url()] = TypeStatus{Sent: ts.sentVersion, Acked: ts.acked, Nacked: ts.nacked, NackDetail: ts.nackDetail}
		}
		out = append(out, ss)
	}
	slices.SortFunc(out, func(a, b StreamStatus) int { return int(a.ID - b.ID) })
	return out
}
