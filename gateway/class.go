package gateway

import (
	"fmt"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// The request class. Before a request's route is matched, the gateway
// (handleGenerate) and the picker (Gateway.Pick) settle its class with
// classify, the one reading of the class headers:
//
//   - Criticality: xdscontract.CriticalityHeader ("critical", "standard",
//     "sheddable", case ignored: reqclass.Parse); without it, the Inference
//     Extension objective (xdscontract.ObjectiveHeader) through
//     Config.ObjectivePriority and reqclass.FromPriority (priority < 0
//     sheddable, 0 standard, > 0 critical, as GIE and llm-d define it);
//     otherwise standard. A repeated or unknown value, or an objective the
//     operator did not map, is standard and counted.
//   - Trust: only a request proven forwarded by another isobar gateway
//     (the hop proof, hop.go) or arriving from Config.TrustedSources keeps
//     "critical"; from anyone else it is lowered to standard and counted
//     (reqclass.Lower: a client may demote itself to sheddable, never
//     promote itself).
//   - Tenant: xdscontract.TenantHeader, reqclass.NormalizeTenant (bad
//     values dropped, long ones truncated, both counted). Fairness and
//     labels use the bounded bucket (reqclass.Tenants, the rest pooled
//     into reqclass.OtherTenant); residency uses the tenant itself.
//   - Residency: Config.Residency.Lookup(tenant, model).
//
// The headers are then rewritten canonically, so that the routes match
// what the gateway decided and the next hop (a cell, or another region's
// gateway) reads the same: the criticality header always set to the
// effective value, the tenant header to the normalised tenant (removed
// when none), xdscontract.ResidencyHeader set to the residency set or
// removed whatever the client sent.

// classOf is a request's class as classify settled it.
type classOf struct {
	crit reqclass.Criticality
	// tenant is the normalised tenant, bucket its bounded bucket (metrics,
	// queue fairness).
	tenant, bucket string
	// set is the residency set ("" unpinned); regions its allowed regions.
	set     string
	regions []string
}

// Reasons a class header is counted, as the class metric's label.
const (
	classUnknown          = "unknown_criticality"   // a criticality value reqclass.Parse does not know
	classRepeated         = "repeated_criticality"  // more than one criticality header
	classUnknownObjective = "unknown_objective"     // an objective Config.ObjectivePriority does not map
	classDemoted          = "demoted"               // "critical" from an untrusted source, lowered to standard
	classTenantBad        = "bad_tenant"            // a tenant with control characters or invalid UTF-8, dropped
	classTenantTruncated  = "truncated_tenant"      // a tenant above reqclass.MaxTenantLen, truncated
	classTenantPooled     = "pooled_tenant"         // a tenant beyond Config.MaxTenants, pooled into reqclass.OtherTenant
	classResidencyUnknown = "unknown_residency_set" // a residency set the config does not define: no region allowed
	classPooledSlice      = "pooled_slice"          // a pinned demand slice beyond the report's bound, counted as unpinned
)

var classReasons = []string{classUnknown, classRepeated, classUnknownObjective, classDemoted, classTenantBad, classTenantTruncated, classTenantPooled, classResidencyUnknown, classPooledSlice}

// classMetrics count the request classes.
type classMetrics struct {
	anomalies *prometheus.CounterVec // reason
	requests  *prometheus.CounterVec // criticality
	residency prometheus.Counter     // requests refused: no allowed endpoint
}

func newClassMetrics() *classMetrics {
	m := &classMetrics{
		anomalies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_request_class_anomalies_total",
			Help: "Class headers the gateway corrected, by reason: unknown_criticality, repeated_criticality and unknown_objective (taken as standard), demoted (critical from an untrusted source, lowered to standard), bad_tenant (dropped), truncated_tenant, pooled_tenant (beyond the tracked tenants), unknown_residency_set, pooled_slice (a report's pinned slice past its bound, counted as unpinned).",
		}, []string{"reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_requests_by_criticality_total",
			Help: "Client requests classified, by effective criticality (after trust).",
		}, []string{"criticality"}),
		residency: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_gateway_residency_refused_total",
			Help: "Requests answered 503 because no endpoint of their residency set's regions was left.",
		}),
	}
	for _, r := range classReasons {
		m.anomalies.WithLabelValues(r)
	}
	for _, c := range reqclass.All() {
		m.requests.WithLabelValues(c.String())
	}
	return m
}

func (m *classMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.anomalies, m.requests, m.residency}
}

// ParseTrustedSources reads a comma-separated list of CIDR prefixes or
// addresses (--trusted-sources); "" is none.
func ParseTrustedSources(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("trusted source %q is neither a CIDR prefix nor an address", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// trustedSource reports whether remote (an http.Request's RemoteAddr,
// host:port or a bare address) is in Config.TrustedSources.
func (g *Gateway) trustedSource(remote string) bool {
	if len(g.cfg.TrustedSources) == 0 || remote == "" {
		return false
	}
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(remote); err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range g.cfg.TrustedSources {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// criticality reads the criticality hdr asks for, counting what it
// corrects.
func (g *Gateway) criticality(hdr http.Header) reqclass.Criticality {
	if vs := hdr.Values(xdscontract.CriticalityHeader); len(vs) > 0 {
		if len(vs) > 1 {
			g.m.class.anomalies.WithLabelValues(classRepeated).Inc()
			return reqclass.Standard
		}
		c, ok := reqclass.Parse(vs[0])
		if !ok {
			g.m.class.anomalies.WithLabelValues(classUnknown).Inc()
		}
		return c
	}
	obj := strings.TrimSpace(hdr.Get(xdscontract.ObjectiveHeader))
	if obj == "" {
		return reqclass.Standard
	}
	p, ok := g.cfg.ObjectivePriority[obj]
	if !ok {
		g.m.class.anomalies.WithLabelValues(classUnknownObjective).Inc()
		return reqclass.Standard
	}
	return reqclass.FromPriority(p)
}

// classify settles the class of a request for model with headers hdr from
// remote (its peer address; "" unknown), hop telling whether its hop proof
// held, and rewrites hdr's class headers canonically (see above). set and
// removed are the header changes made, for a data plane that applies them
// itself (the ext_proc picker).
func (g *Gateway) classify(hdr http.Header, remote string, hop bool, model string) (c classOf, set [][2]string, removed []string) {
	c.crit = g.criticality(hdr)
	if c.crit == reqclass.Critical && !hop && !g.trustedSource(remote) {
		c.crit = reqclass.Lower(c.crit, reqclass.Standard)
		g.m.class.anomalies.WithLabelValues(classDemoted).Inc()
	}
	g.m.class.requests.WithLabelValues(c.crit.String()).Inc()
	t, truncated, bad := reqclass.NormalizeTenant(hdr.Get(xdscontract.TenantHeader))
	if len(hdr.Values(xdscontract.TenantHeader)) > 1 {
		t, bad = reqclass.NoTenant, true
	}
	switch {
	case bad:
		g.m.class.anomalies.WithLabelValues(classTenantBad).Inc()
	case truncated:
		g.m.class.anomalies.WithLabelValues(classTenantTruncated).Inc()
	}
	c.tenant = t
	var pooled bool
	if c.bucket, pooled = g.tenants.Bucket(t); pooled {
		g.m.class.anomalies.WithLabelValues(classTenantPooled).Inc()
	}
	c.set = g.cfg.Residency.Lookup(t, model)
	if c.set != "" {
		var ok bool
		if c.regions, ok = g.cfg.Residency.Regions(c.set); !ok {
			g.m.class.anomalies.WithLabelValues(classResidencyUnknown).Inc()
		}
	}
	put := func(name, v string) {
		if v == "" {
			if len(hdr.Values(name)) > 0 {
				hdr.Del(name)
				removed = append(removed, strings.ToLower(name))
			}
			return
		}
		hdr.Set(name, v)
		set = append(set, [2]string{strings.ToLower(name), v})
	}
	put(xdscontract.CriticalityHeader, c.crit.String())
	put(xdscontract.TenantHeader, t)
	put(xdscontract.ResidencyHeader, c.set)
	return c, set, removed
}

// allows reports whether a request of class c may be served by h: any
// host when c is unpinned, else a host whose region (this gateway's for
// an endpoint without one) is among the set's regions.
func (c *classOf) allows(h *hostRT, local string) bool {
	if c == nil || c.set == "" {
		return true
	}
	r := h.ep.Region
	if r == "" {
		r = local
	}
	return slices.Contains(c.regions, r)
}

// noRoute is the refusal of a request no route matched: 404 "no route
// for model", or, for a pinned request, 503 naming its residency set —
// the routes require the residency header absent unless they define the
// set, so a set the regional controller's --residency config lacks matches
// nothing and the request is served nowhere rather than anywhere.
func (c *classOf) noRoute(model string) (status int, msg string) {
	m := truncate.String(model, maxModelNameLen)
	if c == nil || c.set == "" {
		return http.StatusNotFound, fmt.Sprintf("no route for model %q", m)
	}
	return http.StatusServiceUnavailable, fmt.Sprintf("no route for residency set %q of model %q: the regional controller's routes do not define the set "+
		"(its --residency config must pin what this gateway's pins); the request is not served elsewhere", c.set, m)
}

// abortMessage is the body of a request its route's fault abort refused:
// the plan's shed (429, retry later), or a residency set's excess (503:
// its regions have no capacity left, and it is not served elsewhere).
func (c *classOf) abortMessage(status int) (reason, msg string) {
	if c != nil && c.set != "" && status == http.StatusServiceUnavailable {
		return "residency", fmt.Sprintf("request shed: the regions of residency set %q (%s) have no capacity left for it; "+
			"the request is pinned to them and is not served elsewhere", c.set, strings.Join(c.regions, ", "))
	}
	return "fault", "request shed by the routing plan; retry later"
}

// residencyMessage is the 503 body of a pinned request left with no
// allowed endpoint: it names the set and its regions.
func (c *classOf) residencyMessage() string {
	regions := "none (the set is not defined)"
	if len(c.regions) > 0 {
		regions = strings.Join(c.regions, ", ")
	}
	return fmt.Sprintf("no endpoint left in the regions of residency set %q (%s); the request is pinned to them and is not served elsewhere", c.set, regions)
}
