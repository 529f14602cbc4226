package extproc

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// Bounds on what one ext_proc stream may make the picker hold, beyond the
// gRPC message size (MaxBodyBytes plus extProcHeadroom).
const (
	// maxExtProcHeaders bounds a header map's entries (Envoy's default
	// max_headers_count is 100).
	maxExtProcHeaders = 1024
	// maxExtProcHeaderBytes bounds a header map's names and values
	// together (Envoy's default max_request_headers_kb is 60).
	maxExtProcHeaderBytes = 256 << 10
	// maxSubsetEntries bounds the endpoints of a subset hint.
	maxSubsetEntries = 1 << 16
)

// epHeaders is a request's headers as ext_proc sends them
// (HttpHeaders.headers: lower-case names, each value in raw_value or
// value), seen as the route matcher sees an HTTP request's (the gateway's requestView):
// pseudo-headers, ModelHeader filled from the body's model when the
// client did not send it, content-length the body's length.
type epHeaders struct {
	path, method, authority, scheme string
	hdr                             http.Header // the other headers, canonical keys
	modelHeader                     string
	model                           string // from the header or the body
	// contentLength is the body's length when known ("" otherwise: a
	// headers-only pick without a content-length header).
	contentLength string
}

var _ xdsclient.HeaderView = (*epHeaders)(nil)

func (v *epHeaders) Header(name string) (string, bool) {
	switch name {
	case ":path":
		return v.path, true
	case ":method":
		return v.method, true
	case ":authority", "host":
		return v.authority, true
	case ":scheme":
		return v.scheme, v.scheme != ""
	case "content-length":
		return v.contentLength, v.contentLength != ""
	case v.modelHeader:
		if v.model != "" {
			return v.model, true
		}
	}
	vals := v.hdr.Values(name)
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return vals[0], true
	}
	return strings.Join(vals, ","), true
}

// parseEPHeaders reads an ext_proc header map. It refuses, wrapping
// errExtProcMalformed, a map without :path or :method, with an empty or
// pseudo-header name it does not know, a repeated pseudo-header, or beyond
// maxExtProcHeaders entries or maxExtProcHeaderBytes.
func parseEPHeaders(m *core.HeaderMap, modelHeader string) (*epHeaders, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: request headers: "+format, append([]any{errExtProcMalformed}, args...)...)
	}
	hs := m.GetHeaders()
	if len(hs) > maxExtProcHeaders {
		return nil, bad("%d headers, at most %d", len(hs), maxExtProcHeaders)
	}
	v := &epHeaders{hdr: make(http.Header, len(hs)), modelHeader: modelHeader}
	size := 0
	for _, h := range hs {
		name := strings.ToLower(h.GetKey())
		val := h.GetValue()
		if raw := h.GetRawValue(); len(raw) > 0 {
			val = string(raw)
		}
		if size += len(name) + len(val); size > maxExtProcHeaderBytes {
			return nil, bad("more than %d bytes", maxExtProcHeaderBytes)
		}
		if name == "" {
			return nil, bad("a header has no name")
		}
		if name[0] != ':' {
			v.hdr.Add(name, val)
			continue
		}
		var dst *string
		switch name {
		case ":path":
			dst = &v.path
		case ":method":
			dst = &v.method
		case ":authority":
			dst = &v.authority
		case ":scheme":
			dst = &v.scheme
		case ":protocol", ":status":
			continue // extended CONNECT; a response's status: not routed on
		default:
			return nil, bad("unknown pseudo-header %q", truncate.String(name, 64))
		}
		if *dst != "" {
			return nil, bad("pseudo-header %s repeated", name)
		}
		if val == "" {
			return nil, bad("pseudo-header %s is empty", name)
		}
		*dst = val
	}
	if v.path == "" || v.method == "" {
		return nil, bad("no :path or :method")
	}
	if v.authority == "" {
		v.authority = v.hdr.Get("Host") // HTTP/1.0 without Host: "" matches "*" only
	}
	return v, nil
}

// generates reports whether the request is one the gateway proxies (POST
// /v1/completions or /v1/chat/completions, query ignored): the ones the
// picker chooses an endpoint for. Anything else passes through untouched.
func (v *epHeaders) generates() bool {
	p, _, _ := strings.Cut(v.path, "?")
	return v.method == http.MethodPost && (p == "/v1/completions" || p == "/v1/chat/completions")
}

// knownLength returns the body length the request declares in
// content-length, when it is one integer in [0, limit].
func (v *epHeaders) knownLength(limit int64) (int, bool) {
	vals := v.hdr.Values("Content-Length")
	if len(vals) != 1 {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(vals[0]), 10, 64)
	if err != nil || n < 0 || n > limit {
		return 0, false
	}
	return int(n), true
}

// subset is the Endpoint Picker Protocol's endpoint subset: the addresses
// the proxy lets the picker choose among.
type subset struct {
	addrs map[string]struct{}     // canonical host:port (net.JoinHostPort of the unmapped IP)
	ips   map[netip.Addr]struct{} // bare IPs: any port
}

// allows reports whether addr (an Endpoint.Address) is in the subset.
func (s *subset) allows(addr string) bool {
	if _, ok := s.addrs[addr]; ok {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	_, ok := s.ips[ip.Unmap()]
	return ok
}

// subsetHint reads the subset hint from a ProcessingRequest's
// metadata_context (filter metadata xdscontract.SubsetHintNamespace, key
// xdscontract.SubsetHintKey). The protocol sends a list of "ip:port" strings; as the
// reference picker (pkg/lwepp/handlers/request.go) does, each string may
// hold several separated by commas, a single string is read the same way,
// and a bare IP allows any port. Entries that are not an IP address (with
// a port) allow nothing, and a value of another kind allows nothing: the
// key's presence alone restricts the pick, so a hint the picker cannot
// read leaves no endpoint (503) rather than every endpoint. present is
// false when the key is absent. More than maxSubsetEntries entries wrap
// errExtProcMalformed.
func subsetHint(md *core.Metadata) (s *subset, present bool, err error) {
	ns := md.GetFilterMetadata()[xdscontract.SubsetHintNamespace]
	val, ok := ns.GetFields()[xdscontract.SubsetHintKey]
	if !ok {
		return nil, false, nil
	}
	s = &subset{addrs: map[string]struct{}{}, ips: map[netip.Addr]struct{}{}}
	var strs []string
	switch k := val.GetKind().(type) {
	case *structpb.Value_StringValue:
		strs = []string{k.StringValue}
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if sv, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				strs = append(strs, sv.StringValue)
			}
		}
	}
	n := 0
	for _, str := range strs {
		for e := range strings.SplitSeq(str, ",") {
			if n++; n > maxSubsetEntries {
				return nil, true, fmt.Errorf("%w: subset hint lists more than %d endpoints", errExtProcMalformed, maxSubsetEntries)
			}
			e = strings.TrimSpace(e)
			if ip, err := netip.ParseAddr(e); err == nil {
				s.ips[ip.Unmap()] = struct{}{}
				continue
			}
			if ap, err := netip.ParseAddrPort(e); err == nil {
				s.addrs[net.JoinHostPort(ap.Addr().Unmap().String(), strconv.Itoa(int(ap.Port())))] = struct{}{}
			}
		}
	}
	return s, true, nil
}

// maxSourceAddress bounds the source.address attribute read.
const maxSourceAddress = 64

// sourceAddress is the client's address from the request attributes
// Envoy sends when the ext_proc filter lists "source.address" in its
// request_attributes (ProcessingRequest.attributes, keyed by the filter's
// name; envoy/service/ext_proc/v3/external_processor.proto), or "" when
// absent, not a string or too long: the gateway then treats the client as
// not among --trusted-sources.
func sourceAddress(attrs map[string]*structpb.Struct) string {
	for _, st := range attrs {
		if v, ok := st.GetFields()["source.address"]; ok {
			if a, ok := v.GetKind().(*structpb.Value_StringValue); ok && len(a.StringValue) <= maxSourceAddress {
				return a.StringValue
			}
		}
	}
	return ""
}
