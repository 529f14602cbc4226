package regional

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/score"
)

// The debug API's JSON shapes live in debugapi, the contract statusview
// reads; these names keep regional's callers unchanged.
type (
	// CellDebug is the JSON shape of GET /debug/cells/{id}.
	CellDebug = debugapi.CellDebug
	// SignalDebug explains one signal's part in the pressure.
	SignalDebug = debugapi.SignalDebug
	// SourceDebug is a telemetry source's health.
	SourceDebug = debugapi.SourceDebug
)

func debugCell(cv CellView, sc score.Config) CellDebug {
	d := CellDebug{
		ID: cv.ID, Endpoint: cv.Endpoint, Model: cv.Model, MaxModelLen: cv.MaxModelLen,
		State: cv.State.String(), StateSince: cv.StateSince, Reason: cv.Reason, LastSeen: cv.LastSeen,
		Sequence: cv.Sequence, Suspect: cv.Suspect, Raw: map[string]float64{}, Signals: map[string]SignalDebug{},
		Pressure: cv.Score.Pressure, Fallback: cv.Fallback,
		Weight: cv.Weight.Published, TargetWeight: cv.Weight.Target, ClassWeight: cv.Weight.ClassWeight, Penalty: cv.Weight.Penalty,
		Band: cv.Weight.Band, BandReason: cv.Weight.BandReason, Degraded: cv.Weight.Degraded,
		Probation: cv.Weight.Probation, PenaltyTrips: cv.Weight.Trips, OperatorDrain: cv.OperatorDrain,
		EndpointConflict: cv.EndpointConflict,
		Sources:          map[string]SourceDebug{"vllm": sourceDebug(cv.VLLM), "dcgm": sourceDebug(cv.DCGM)},
		ClockSkewed:      cv.ClockSkewed,
	}
	if cv.ClockSkewKnown {
		s := cv.ClockSkew.Seconds()
		d.ClockSkewSeconds = &s
	}
	if s := cv.Signals; s != nil {
		put := func(k string, p *float64) {
			if p != nil {
				d.Raw[k] = *p
			}
		}
		put("queue_depth", s.QueueDepth)
		put("running", s.Running)
		put("ttft_p95_seconds", s.TtftP95Seconds)
		put("error_rate", s.ErrorRate)
		put("kv_cache_usage", s.KvCacheUsage)
		put("gpu_util", s.GpuUtil)
		put("vram_used", s.VramUsed)
		put("sm_active", s.SmActive)
		put("dram_active", s.DramActive)
		put("temperature_celsius", s.TemperatureCelsius)
		put("power_watts", s.PowerWatts)
		put("request_rate", s.RequestRate)
		put("window_requests", s.WindowRequests)
		put("prefix_cache_hit_rate", s.PrefixCacheHitRate)
		if s.ClockThrottleReasons != nil {
			d.Raw["clock_throttle_reasons"] = float64(*s.ClockThrottleReasons)
		}
	}
	if cv.RTTOK {
		d.Raw["rtt_seconds"] = cv.RTT.Seconds()
		d.Raw["jitter_seconds"] = cv.Jitter.Seconds()
	}
	contrib := sc.Contributions(cv.Score)
	for s := score.Signal(0); s < score.NumSignals; s++ {
		if cv.Score.Present[s] {
			d.Signals[s.String()] = SignalDebug{
				Normalized: cv.Score.Normalized[s], Weight: sc.Weights[s], Contribution: contrib[s],
			}
		}
	}
	return d
}

func sourceDebug(s SourceView) SourceDebug {
	d := SourceDebug{OK: s.OK, Error: s.Error}
	if !s.LastSuccess.IsZero() {
		t := s.LastSuccess
		d.LastSuccess = &t
	}
	return d
}

// newHTTPHandler serves /metrics, /healthz, /debug/cells[/ID], /debug/routes and
// POST /v1/cells/ID/{drain,undrain}. The debug pages and the drain API are
// admin endpoints, behind admin (see adminPolicy); /metrics and /healthz
// are open to whoever reaches the listener.
func newHTTPHandler(reg *Registry, routes func() *RouteTable, sc score.Config, gatherer prometheus.Gatherer, admin *adminPolicy) http.Handler {
	mux := http.NewServeMux()
	adm := http.NewServeMux()
	mux.Handle("/debug/", admin.guard(adm))
	mux.Handle("/v1/", admin.guard(adm))
	adm.HandleFunc("GET /debug/routes", func(w http.ResponseWriter, _ *http.Request) {
		t := routes()
		if t == nil {
			writeJSON(w, http.StatusOK, map[string]string{"source": RoutesLocal, "note": "no cross-region routing configured"})
			return
		}
		writeJSON(w, http.StatusOK, t)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	adm.HandleFunc("GET /debug/cells", func(w http.ResponseWriter, _ *http.Request) {
		v := reg.View()
		out := struct {
			At    time.Time   `json:"at"`
			Cycle uint64      `json:"cycle"`
			Cells []CellDebug `json:"cells"`
		}{At: v.At, Cycle: v.Cycle, Cells: make([]CellDebug, 0, len(v.Cells))}
		for _, cv := range v.Cells {
			out.Cells = append(out.Cells, debugCell(*cv, sc))
		}
		writeJSON(w, http.StatusOK, out)
	})
	adm.HandleFunc("GET /debug/cells/{id}", func(w http.ResponseWriter, r *http.Request) {
		cv, ok := reg.View().Cell(r.PathValue("id"))
		if !ok {
			reg.metrics.unknownCells.Inc()
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown cell " + trunc(r.PathValue("id"))})
			return
		}
		writeJSON(w, http.StatusOK, debugCell(cv, sc))
	})
	drain := func(on bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			err := reg.SetDrain(r.Context(), r.PathValue("id"), on)
			switch {
			case err == nil:
				cv, _ := reg.View().Cell(r.PathValue("id"))
				writeJSON(w, http.StatusOK, map[string]string{"cell": r.PathValue("id"), "state": cv.State.String()})
			case errors.Is(err, ErrUnknownCell):
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			case errors.Is(err, lifecycle.ErrRefused):
				writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
			default:
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			}
		}
	}
	adm.HandleFunc("POST /v1/cells/{id}/drain", drain(true))
	adm.HandleFunc("POST /v1/cells/{id}/undrain", drain(false))
	return mux
}

// adminPolicy guards the admin endpoints (debug pages, drain API).
//
// Who: when the listener runs TLS (Config.TLS set) or a token is
// configured (Config.AdminToken), a request must carry an operator
// identity, a verified client certificate naming
// spiffe://isobar/operator/NAME (as the lab admin API and isobar chaos
// use), or the bearer token. A certificate of any other identity (a cell, a
// gateway, a region) is refused with 403, none with 401. With neither TLS
// nor a token the endpoints are open (a warning is logged at start).
//
// Cross-site: a browser page must not be able to drive the drain API.
// Unsafe methods pass net/http's CrossOriginProtection (Go 1.25: refuses
// requests whose Sec-Fetch-Site is cross-site or whose Origin does not match
// the Host), and a POST must declare Content-Type application/json, which no
// HTML form can send and which a cross-origin fetch can only send after a
// CORS preflight this server never grants: so no "simple" request
// (https://fetch.spec.whatwg.org/#cors-safelisted-request-header) reaches a
// handler.
//
// Every refusal is counted in isobar_regional_admin_requests_total by
// result (unauthenticated, forbidden, cross_site); served requests as ok.
// Safe for concurrent use.
type adminPolicy struct {
	token    string
	mtls     bool
	requests *prometheus.CounterVec
	csrf     *http.CrossOriginProtection
}

func newAdminPolicy(token string, mtls bool, reg prometheus.Registerer) (*adminPolicy, error) {
	p := &adminPolicy{token: token, mtls: mtls, csrf: http.NewCrossOriginProtection(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_admin_requests_total",
			Help: "Requests to the debug pages and the drain API by result: ok, unauthenticated, forbidden, cross_site.",
		}, []string{"result"})}
	if reg != nil {
		if err := reg.Register(p.requests); err != nil {
			return nil, fmt.Errorf("regional: register admin metrics: %w", err)
		}
	}
	p.csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.refuse(w, http.StatusForbidden, "cross_site", "cross-origin request refused: the admin API takes requests from isobar clients, not from web pages")
	}))
	return p, nil
}

// open reports whether the admin endpoints need no credential.
func (p *adminPolicy) open() bool { return p.token == "" && !p.mtls }

func (p *adminPolicy) refuse(w http.ResponseWriter, code int, result, msg string) {
	p.requests.WithLabelValues(result).Inc()
	writeJSON(w, code, map[string]string{"error": msg})
}

func (p *adminPolicy) guard(next http.Handler) http.Handler {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
				p.refuse(w, http.StatusUnsupportedMediaType, "cross_site",
					"POST needs Content-Type: application/json (no form or simple cross-site request may drive the admin API)")
				return
			}
		}
		if code, result, msg := p.authorize(r); code != 0 {
			p.refuse(w, code, result, msg)
			return
		}
		p.requests.WithLabelValues("ok").Inc()
		next.ServeHTTP(w, r)
	})
	return p.csrf.Handler(inner)
}

// authorize returns 0 for a request that may proceed, else the status,
// result label and message of its refusal.
func (p *adminPolicy) authorize(r *http.Request) (int, string, string) {
	if p.open() {
		return 0, "", ""
	}
	if auth := r.Header.Get("Authorization"); auth != "" && p.token != "" {
		got, _ := strings.CutPrefix(auth, "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(p.token)) == 1 {
			return 0, "", ""
		}
		return http.StatusUnauthorized, "unauthenticated", "wrong bearer token (the content of the controller's --admin-token-file)"
	}
	if p.mtls && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		id, err := certs.VerifiedIdentity(*r.TLS)
		if err == nil && id.Kind == certs.KindOperator {
			return 0, "", ""
		}
		who := "a certificate with no isobar identity"
		if err == nil {
			who = id.String()
		}
		return http.StatusForbidden, "forbidden", fmt.Sprintf("%s may not use the admin API: present an operator certificate (spiffe://isobar/operator/NAME, isobar certs issue --role operator --name NAME)", truncate.Marked(who, 160, "..."))
	}
	var want []string
	if p.mtls {
		want = append(want, "an operator client certificate (spiffe://isobar/operator/NAME)")
	}
	if p.token != "" {
		want = append(want, "Authorization: Bearer <token from --admin-token-file>")
	}
	return http.StatusUnauthorized, "unauthenticated", "admin API: present " + strings.Join(want, " or ")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
