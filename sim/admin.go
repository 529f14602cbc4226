package sim

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

// MinAdminTokenLen is the shortest admin token accepted.
const MinAdminTokenLen = 16

// maxAdminBody caps admin request bodies.
const maxAdminBody = 64 << 10

// AdminConfig configures the admin API.
type AdminConfig struct {
	// Token is the bearer token every admin request must carry
	// (Authorization: Bearer <token>). Required, at least MinAdminTokenLen
	// characters.
	Token string
}

func (c AdminConfig) validate() error {
	if len(c.Token) < MinAdminTokenLen {
		return fmt.Errorf("sim: AdminConfig.Token: must be at least %d characters (generate a random one)", MinAdminTokenLen)
	}
	return nil
}

// FaultRequest is the body of POST /admin/faults. Durations are Go duration
// strings ("12s", "500ms") in model time. Fields a fault does not use are
// ignored; unknown fields are refused.
type FaultRequest struct {
	// Fault is one of kill, restart, hang, slow_start, max_model_len,
	// errors, throttle, pcie, dcgm_down, xid, clear.
	Fault string `json:"fault"`
	// On turns hang and dcgm_down on (default) or off.
	On *bool `json:"on,omitempty"`
	// Duration is the Loading time of slow_start.
	Duration string `json:"duration,omitempty"`
	// SlowStart is the Loading time after restart (default none).
	SlowStart string `json:"slow_start,omitempty"`
	// N is max_model_len's enforced context length.
	N int `json:"n,omitempty"`
	// Advertise, for max_model_len, makes /v1/models report N (default
	// true); false keeps the configured value.
	Advertise *bool `json:"advertise,omitempty"`
	// Rate (0–1) and Status (default 500) configure errors.
	Rate   float64 `json:"rate,omitempty"`
	Status int     `json:"status,omitempty"`
	// Severity (0–1) and Lead (default 12s for throttle, 5s for pcie)
	// configure throttle and pcie.
	Severity float64 `json:"severity,omitempty"`
	Lead     string  `json:"lead,omitempty"`
	// Code is the XID of the xid fault (0 clears it).
	Code int `json:"code,omitempty"`
}

// FaultsResponse is the body of GET /admin/faults and of a successful POST.
type FaultsResponse struct {
	Engine EngineStatus  `json:"engine"`
	DCGM   *DCGMStatus   `json:"dcgm,omitempty"`
	Faults []FaultStatus `json:"faults"`
}

// EngineStatus summarises the engine in admin responses.
type EngineStatus struct {
	State string `json:"state"`
	Ready bool   `json:"ready"`
	Addr  string `json:"addr"`
}

// DCGMStatus summarises the exporter in admin responses.
type DCGMStatus struct {
	Down bool   `json:"down"`
	Addr string `json:"addr"`
}

type adminMetrics struct {
	authFailures *prometheus.CounterVec
	faults       *prometheus.CounterVec
	badRequests  prometheus.Counter
}

func newAdminMetrics(reg prometheus.Registerer) (*adminMetrics, error) {
	m := &adminMetrics{
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_sim_admin_auth_failures_total",
			Help: "Admin requests refused for a missing (401) or wrong (403) bearer token.",
		}, []string{"reason"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_sim_admin_faults_total",
			Help: "Faults applied through the admin API, by fault.",
		}, []string{"fault"}),
		badRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_sim_admin_bad_requests_total",
			Help: "Admin requests refused for a malformed body or unknown fault.",
		}),
	}
	m.authFailures.WithLabelValues("missing")
	m.authFailures.WithLabelValues("invalid")
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.authFailures, m.faults, m.badRequests); err != nil {
		return nil, err
	}
	return m, nil
}

// Admin is the fault-injection API. It stands in for the node's supervisor,
// so it must be served on a listener of its own that survives an engine
// kill.
type Admin struct {
	tokenSum [sha256.Size]byte
	eng      *Engine
	dcgm     *DCGMExporter
	log      *slog.Logger
	m        *adminMetrics
	mux      *http.ServeMux
}

var _ http.Handler = (*Admin)(nil)

// NewAdminHandler returns the admin API for an engine and, when dcgm is not
// nil, its exporter. Its metrics (isobar_sim_admin_*) go to
// deps.Registerer.
func NewAdminHandler(cfg AdminConfig, deps Deps, eng *Engine, dcgm *DCGMExporter) (*Admin, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if eng == nil {
		return nil, errors.New("sim: NewAdminHandler: engine is required")
	}
	deps = deps.withDefaults()
	m, err := newAdminMetrics(deps.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sim: admin metrics: %w", err)
	}
	a := &Admin{tokenSum: sha256.Sum256([]byte(cfg.Token)), eng: eng, dcgm: dcgm,
		log: deps.Logger.With("component", "admin"), m: m, mux: http.NewServeMux()}
	a.mux.HandleFunc("GET /admin/faults", a.handleList)
	a.mux.HandleFunc("POST /admin/faults", a.handleApply)
	return a, nil
}

// ServeHTTP authenticates, then routes.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		a.m.authFailures.WithLabelValues("missing").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="isobar-sim-admin"`)
		writeError(w, http.StatusUnauthorized, "Missing bearer token.")
		return
	}
	sum := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) != 1 {
		a.m.authFailures.WithLabelValues("invalid").Inc()
		a.log.Warn("admin request with a wrong token refused", "remote", r.RemoteAddr)
		writeError(w, http.StatusForbidden, "Invalid bearer token.")
		return
	}
	a.mux.ServeHTTP(w, r)
}

func (a *Admin) status() FaultsResponse {
	resp := FaultsResponse{
		Engine: EngineStatus{State: a.eng.State().String(), Ready: a.eng.Ready(), Addr: a.eng.Addr()},
		Faults: a.eng.Faults(),
	}
	if a.dcgm != nil {
		resp.DCGM = &DCGMStatus{Down: a.dcgm.Down(), Addr: a.dcgm.Addr()}
		if resp.DCGM.Down {
			resp.Faults = append(resp.Faults, FaultStatus{Fault: FaultDCGMDown})
		}
	}
	if resp.Faults == nil {
		resp.Faults = []FaultStatus{}
	}
	return resp
}

func (a *Admin) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.status())
}

func (a *Admin) bad(w http.ResponseWriter, format string, args ...any) {
	a.m.badRequests.Inc()
	writeError(w, http.StatusBadRequest, fmt.Sprintf(format, args...))
}

func (a *Admin) handleApply(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		a.bad(w, "reading body: %v", err)
		return
	}
	req, err := ParseFaultRequest(body)
	if err != nil {
		a.bad(w, "%v", err)
		return
	}
	if err := a.Apply(req); err != nil {
		if errors.Is(err, errBadFault) {
			a.bad(w, "%v", err)
			return
		}
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, a.status())
}

// errBadFault marks fault requests that are invalid.
var errBadFault = errors.New("sim: bad fault request")

// ParseFaultRequest decodes and checks a POST /admin/faults body. Errors
// wrap an error that names the offending field.
func ParseFaultRequest(body []byte) (FaultRequest, error) {
	var req FaultRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return FaultRequest{}, fmt.Errorf("%w: invalid JSON: %v", errBadFault, err)
	}
	if dec.More() {
		return FaultRequest{}, fmt.Errorf("%w: trailing data after the JSON body", errBadFault)
	}
	if _, err := req.durations(); err != nil {
		return FaultRequest{}, err
	}
	switch req.Fault {
	case FaultKill, FaultRestart, FaultHang, FaultDCGMDown, FaultClear:
	case FaultSlowStart:
		if req.Duration == "" {
			return FaultRequest{}, fmt.Errorf("%w: slow_start needs duration (e.g. \"30s\")", errBadFault)
		}
	case FaultMaxModelLen:
		if req.N < 1 {
			return FaultRequest{}, fmt.Errorf("%w: max_model_len needs n >= 1", errBadFault)
		}
	case FaultErrors:
		if math.IsNaN(req.Rate) || req.Rate < 0 || req.Rate > 1 {
			return FaultRequest{}, fmt.Errorf("%w: errors needs rate in [0,1]", errBadFault)
		}
		if req.Status != 0 && (req.Status < 400 || req.Status > 599) {
			return FaultRequest{}, fmt.Errorf("%w: errors status %d: want 400-599", errBadFault, req.Status)
		}
	case FaultThrottle, FaultPCIe:
		if math.IsNaN(req.Severity) || req.Severity < 0 || req.Severity > 1 {
			return FaultRequest{}, fmt.Errorf("%w: %s needs severity in [0,1]", errBadFault, req.Fault)
		}
	case FaultXID:
		if req.Code < 0 || req.Code > 1000 {
			return FaultRequest{}, fmt.Errorf("%w: xid code %d: want 0-1000", errBadFault, req.Code)
		}
	case "":
		return FaultRequest{}, fmt.Errorf("%w: field fault is required", errBadFault)
	default:
		return FaultRequest{}, fmt.Errorf("%w: unknown fault %q: want kill, restart, hang, slow_start, max_model_len, errors, throttle, pcie, dcgm_down, xid or clear", errBadFault, req.Fault)
	}
	return req, nil
}

type faultDurations struct{ duration, slowStart, lead time.Duration }

func (req FaultRequest) durations() (faultDurations, error) {
	var d faultDurations
	parse := func(field, s string, out *time.Duration) error {
		if s == "" {
			return nil
		}
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || v > 24*time.Hour {
			return fmt.Errorf("%w: %s %q: want a duration like \"12s\" between 0 and 24h", errBadFault, field, s)
		}
		*out = v
		return nil
	}
	if err := parse("duration", req.Duration, &d.duration); err != nil {
		return d, err
	}
	if err := parse("slow_start", req.SlowStart, &d.slowStart); err != nil {
		return d, err
	}
	if err := parse("lead", req.Lead, &d.lead); err != nil {
		return d, err
	}
	return d, nil
}

// Apply performs a parsed fault request.
func (a *Admin) Apply(req FaultRequest) error {
	d, err := req.durations()
	if err != nil {
		return err
	}
	on := req.On == nil || *req.On
	switch req.Fault {
	case FaultKill:
		a.eng.Kill()
	case FaultRestart:
		if err := a.eng.RestartLoading(d.slowStart); err != nil {
			return err
		}
	case FaultHang:
		a.eng.Hang(on)
	case FaultSlowStart:
		a.eng.SlowStart(d.duration)
	case FaultMaxModelLen:
		adv := req.Advertise == nil || *req.Advertise
		a.eng.SetMaxModelLen(req.N, adv)
	case FaultErrors:
		a.eng.SetErrorRate(req.Rate, req.Status)
	case FaultThrottle:
		lead := DefaultThrottleLead
		if req.Lead != "" {
			lead = d.lead
		}
		a.eng.Throttle(req.Severity, lead)
	case FaultPCIe:
		lead := DefaultPCIeLead
		if req.Lead != "" {
			lead = d.lead
		}
		a.eng.PCIe(req.Severity, lead)
	case FaultXID:
		a.eng.GPU().SetXID(req.Code)
	case FaultDCGMDown:
		if a.dcgm == nil {
			return fmt.Errorf("%w: no dcgm exporter is attached", errBadFault)
		}
		if err := a.dcgm.SetDown(on); err != nil {
			return err
		}
	case FaultClear:
		a.eng.ClearFaults()
		if a.dcgm != nil {
			if err := a.dcgm.SetDown(false); err != nil && !errors.Is(err, ErrNotStarted) {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: unknown fault %q", errBadFault, req.Fault)
	}
	a.m.faults.WithLabelValues(req.Fault).Inc()
	a.log.Info("fault applied", "fault", req.Fault)
	return nil
}
