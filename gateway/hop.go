package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// The hop proof. A request that carries Config.HopHeader is served as
// forwarded traffic (local clusters only, never shed, not counted as
// demand) only when it also carries xdscontract.HopAuthHeader with a
// valid proof: "v1.<unix seconds>.<base64url(HMAC-SHA256(key, msg))>",
// msg = "isobar-hop v1\n" + the hop header's value (the sender's region) +
// "\n" + the seconds, made with Config.HopKey, the key the operator gives
// every region's gateways and pickers, and issued within Config.HopMaxSkew
// of the receiver's clock. Anything else is a client's request: the
// internal headers (xdscontract.InternalHeaders, plus the route
// configuration's internal_only_headers) are removed before the route is
// matched, so the client is routed, shed and counted in demand like any
// other, and isobar_gateway_untrusted_hop_headers_total counts why.
//
// The proof carries no request content, so that the picker can check it
// from the headers alone: whoever sees a forwarded request on the wire
// (the spill hop is plain HTTP between regions) can replay its proof
// within HopMaxSkew. Cells never see it: the gateway removes it from every
// upstream request and sets a fresh one only on requests to another
// region's ingress.

// MinHopKeyBytes is the shortest Config.HopKey accepted.
const MinHopKeyBytes = 32

// Reasons a hop header is not trusted, as the untrusted-hop counter's
// reason label.
const (
	hopNoKey     = "no_key"        // this gateway has no hop key: it trusts no hop
	hopMissing   = "missing"       // hop header without a proof (or a proof without a hop header)
	hopMalformed = "malformed"     // the proof or the hop header does not parse, or is repeated
	hopBadMAC    = "bad_signature" // the proof was not made with this key for this region and time
	hopStale     = "stale"         // issued more than HopMaxSkew away from this clock
)

var hopReasons = []string{hopNoKey, hopMissing, hopMalformed, hopBadMAC, hopStale}

// hopAuth makes and checks hop proofs. The zero value (no key) makes none
// and accepts none.
type hopAuth struct {
	key  []byte
	skew time.Duration
}

func hopMAC(key []byte, region string, secs int64) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("isobar-hop v1\n" + region + "\n" + strconv.FormatInt(secs, 10)))
	return m.Sum(nil)
}

// token returns the proof for a request forwarded by region's gateway at
// now, "" without a key.
func (h hopAuth) token(region string, now time.Time) string {
	if len(h.key) == 0 {
		return ""
	}
	secs := now.Unix()
	return "v1." + strconv.FormatInt(secs, 10) + "." + base64.RawURLEncoding.EncodeToString(hopMAC(h.key, region, secs))
}

// check returns "" when proof proves region's hop at now, else the
// reason it does not.
func (h hopAuth) check(region, proof string, now time.Time) string {
	if len(h.key) == 0 {
		return hopNoKey
	}
	if proof == "" {
		return hopMissing
	}
	ver, rest, ok := strings.Cut(proof, ".")
	if !ok || ver != "v1" {
		return hopMalformed
	}
	ts, sig, ok := strings.Cut(rest, ".")
	if !ok || len(ts) > 19 {
		return hopMalformed
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return hopMalformed
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(mac) != sha256.Size {
		return hopMalformed
	}
	if !hmac.Equal(mac, hopMAC(h.key, region, secs)) {
		return hopBadMAC
	}
	if d := now.Sub(time.Unix(secs, 0)); d > h.skew || d < -h.skew {
		return hopStale
	}
	return ""
}

// trustHop decides whether the request with headers hdr is forwarded
// traffic from an authenticated isobar gateway. When it is not, it
// removes from hdr the internal headers (the hop header, the proof and
// extra, the route configuration's internal_only_headers), counts the
// reason when the request carried one of the first two, and returns the
// names it removed. When it is, the proof is kept in hdr (the caller
// keeps it away from cells).
func (g *Gateway) trustHop(hdr http.Header, extra []string) (trusted bool, removed []string) {
	hops := hdr.Values(g.cfg.HopHeader)
	proofs := hdr.Values(xdscontract.HopAuthHeader)
	reason := ""
	switch {
	case len(hops) == 0 && len(proofs) == 0:
	case len(g.hop.key) == 0:
		reason = hopNoKey
	case len(hops) == 0 || len(proofs) == 0:
		reason = hopMissing
	case len(hops) > 1 || len(proofs) > 1:
		reason = hopMalformed
	default:
		if reason = g.hop.check(hops[0], proofs[0], g.clock.Now()); reason == "" {
			return true, nil
		}
	}
	if reason != "" {
		g.m.untrustedHops.WithLabelValues(reason).Inc()
	}
	for _, h := range append(xdscontract.InternalHeaders(g.cfg.HopHeader), extra...) {
		if len(hdr.Values(h)) > 0 {
			hdr.Del(h)
			removed = append(removed, strings.ToLower(h))
		}
	}
	return false, removed
}
