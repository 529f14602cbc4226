package lab

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// maxAdminBody bounds an admin request body.
const maxAdminBody = 64 << 10

// OperatorName is the operator identity the lab issues a certificate for.
const OperatorName = "lab"

// admin is the lab's admin API: fleet state and fault injection over HTTPS,
// for clients presenting an operator identity only.
type admin struct {
	l        *Lab
	log      *slog.Logger
	srv      *http.Server
	ln       net.Listener
	operator identity
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
}

func (l *Lab) startAdmin() error {
	sid, err := l.pki.issue("admin", "")
	if err != nil {
		return err
	}
	op, err := l.pki.issue("operator-"+OperatorName, certs.OperatorURI(OperatorName))
	if err != nil {
		return err
	}
	tc, err := certs.ServerConfig(sid.cert, sid.key, l.pki.ca)
	if err != nil {
		return err
	}
	// A client without a certificate gets a 401 that says what to present
	// (and is counted) instead of a bare handshake failure; one whose
	// certificate does not chain to the CA still fails the handshake.
	tc.ClientAuth = tls.VerifyClientCertIfGiven
	a := &admin{l: l, log: l.log.With("component", "admin"), operator: op, reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_lab_admin_requests_total",
			Help: "Admin API requests by result: ok, unauthenticated, forbidden, bad_request, error.",
		}, []string{"result"})}
	if err := a.reg.Register(a.requests); err != nil {
		return fmt.Errorf("lab: admin metrics: %w", err)
	}
	ln, err := net.Listen("tcp", l.cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("lab: --admin-listen %s: %w", l.cfg.AdminListen, err)
	}
	a.ln = ln
	a.srv = &http.Server{Handler: a, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)}
	go func() { _ = a.srv.ServeTLS(ln, "", "") }()
	l.onStop(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.srv.Shutdown(ctx)
	})
	l.admin = a
	l.log.Warn("admin API enabled: operators can inject faults (mTLS, operator identities only)", "addr", ln.Addr().String(),
		"operator_cert", op.cert, "operator_key", op.key, "ca", l.pki.ca)
	return nil
}

// AdminAddr is the admin API's address ("" when not serving one).
func (l *Lab) AdminAddr() string {
	if l.admin == nil {
		return ""
	}
	return l.admin.ln.Addr().String()
}

// OperatorCredentials are the files of the operator certificate the lab
// issued for its admin API, and the CA bundle.
func (l *Lab) OperatorCredentials() (cert, key, ca string) {
	if l.admin == nil {
		return "", "", ""
	}
	return l.admin.operator.cert, l.admin.operator.key, l.pki.ca
}

// AdminMetrics is the admin API's registry (nil when not serving one).
func (l *Lab) AdminMetrics() *prometheus.Registry {
	if l.admin == nil {
		return nil
	}
	return l.admin.reg
}

// IssueCert issues a certificate from the lab's CA for another identity
// (tests of the admin API's refusals); it returns the cert and key files.
func (l *Lab) IssueCert(name, uri string) (cert, key string, err error) {
	id, err := l.pki.issue(name, uri)
	return id.cert, id.key, err
}

func (a *admin) fail(w http.ResponseWriter, status int, result, msg string) {
	a.requests.WithLabelValues(result).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		a.log.Warn("admin request refused: no client certificate", "remote", r.RemoteAddr, "path", r.URL.Path)
		a.fail(w, http.StatusUnauthorized, "unauthenticated",
			"the admin API needs a client certificate with an operator identity (spiffe://isobar/operator/NAME): "+
				"issue one with isobar certs issue --identity operator/NAME")
		return
	}
	id, err := certs.PeerIdentity(r.TLS.PeerCertificates[0])
	if err != nil || id.Kind != certs.KindOperator {
		who := id.URI()
		if err != nil {
			who = err.Error()
		}
		a.log.Warn("admin request refused: not an operator", "peer", who, "remote", r.RemoteAddr, "path", r.URL.Path)
		a.fail(w, http.StatusForbidden, "forbidden", fmt.Sprintf("peer %s is not an operator identity (spiffe://isobar/operator/NAME)", who))
		return
	}
	switch {
	case r.URL.Path == adminapi.PathState && r.Method == http.MethodGet:
		a.requests.WithLabelValues("ok").Inc()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a.l.State())
	case (r.URL.Path == adminapi.PathInject || r.URL.Path == adminapi.PathHeal) && r.Method == http.MethodPost:
		a.fault(w, r, id, r.URL.Path == adminapi.PathHeal)
	default:
		a.fail(w, http.StatusNotFound, "bad_request", fmt.Sprintf("no %s %s: the admin API serves GET %s, POST %s and POST %s",
			r.Method, r.URL.Path, adminapi.PathState, adminapi.PathInject, adminapi.PathHeal))
	}
}

func (a *admin) fault(w http.ResponseWriter, r *http.Request, id certs.Identity, heal bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil || len(body) > maxAdminBody {
		a.fail(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("body unreadable or over %d bytes", maxAdminBody))
		return
	}
	f, err := adminapi.DecodeFault(body)
	if err != nil {
		a.fail(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	verb, apply := "inject", a.l.Inject
	if heal {
		verb, apply = "heal", a.l.Heal
	}
	applied, err := apply(f)
	if err != nil {
		status, result := http.StatusInternalServerError, "error"
		if errors.Is(err, ErrBadFault) {
			status, result = http.StatusBadRequest, "bad_request"
		}
		a.log.Warn("admin "+verb+" failed", "operator", id.Name, "fault", f.String(), "err", err)
		a.fail(w, status, result, err.Error())
		return
	}
	a.log.Warn("admin "+verb, "operator", id.Name, "fault", applied.String())
	a.requests.WithLabelValues("ok").Inc()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(adminapi.InjectResult{At: a.l.clock.Now(), Fault: applied})
}

// State is the fleet as the controllers and data planes see it now.
func (l *Lab) State() adminapi.FleetState {
	model := sim.DefaultModel
	st := adminapi.FleetState{At: l.clock.Now(), Model: model, Faults: l.SupportedFaults(), Pinned: l.pinned}
	var regions []*Region
	var members []adminapi.GlobalState
	var etcd *election.Embedded
	down, ctrlDown := map[*Region]bool{}, map[*Region]bool{}
	l.fleet.view(func() {
		regions = append(regions, l.fleet.regions...)
		for _, m := range l.fleet.globals {
			g := adminapi.GlobalState{Name: m.name, Up: !m.down}
			if !m.down {
				g.Leader = m.srv.IsLeader()
				g.Live = map[string]bool{}
				for _, rs := range m.srv.Regions() {
					g.Live[rs.Region] = rs.Live
				}
			}
			members = append(members, g)
		}
		etcd = l.fleet.etcd
		for _, r := range regions {
			down[r], ctrlDown[r] = r.down, r.ctrlDown
		}
	})
	st.Globals = members
	if etcd != nil {
		st.Etcd = "up"
		if !etcd.Running() {
			st.Etcd = "down"
		}
	}
	cluster := xdscontract.ClusterName(model)
	for _, r := range regions {
		rs := adminapi.RegionState{Name: r.Name, Ingress: r.ingress, Up: !down[r], ControllerDown: ctrlDown[r]}
		if down[r] {
			st.Regions = append(st.Regions, rs)
			continue
		}
		for _, c := range r.Ctrl.Registry().View().Cells {
			rs.Cells = append(rs.Cells, adminapi.CellState{ID: c.ID, State: c.State.String(), Weight: c.Weight.Published,
				Pressure: c.Score.Pressure, Fallback: c.Fallback, MaxModelLen: c.MaxModelLen})
		}
		if rt := r.Ctrl.Routes(); rt != nil {
			rs.RouteSource, rs.PlanEpoch = rt.Source, rt.Epoch
			if mr, ok := rt.Models[model]; ok {
				rs.Shares = mr.Routes
			}
		} else {
			rs.RouteSource = "local"
		}
		if t := r.Gateway.Table(); t != nil {
			rs.PinnedEndpoints, rs.PinnedRegions = pinnedEndpoints(t, model)
			for _, e := range t.Clusters[cluster].Endpoints {
				rs.Endpoints = append(rs.Endpoints, adminapi.EndpointState{Cell: e.Cell, Region: e.Region, Weight: e.Weight,
					Priority: e.Priority, MaxModelLen: e.MaxModelLen, Degraded: e.Degraded})
			}
		}
		rs.TenantRequests = tenantRequests(r.Engines)
		if rtt := r.Gossip.RTT(); len(rtt) > 0 {
			rs.RTTms = map[string]float64{}
			for peer, d := range rtt {
				rs.RTTms[peer] = float64(d) / float64(time.Millisecond)
			}
		}
		st.Regions = append(st.Regions, rs)
	}
	return st
}

// tenantRequests adds up the engines' per-tenant request counters (nil
// when no engine counted any).
func tenantRequests(engines []*sim.Engine) map[string]int64 {
	var out map[string]int64
	for _, e := range engines {
		for t, n := range e.TenantRequests() {
			if out == nil {
				out = map[string]int64{}
			}
			out[t] += n
		}
	}
	return out
}

// pinnedEndpoints counts the endpoints of each residency set's pinned
// cluster of model in t, and lists their regions (sorted, distinct). A
// set's class clusters (.../pin-S/ctx-N) hold subsets of its pinned
// cluster and are not counted.
func pinnedEndpoints(t *xdsclient.Table, model string) (map[string]int, map[string][]string) {
	var out map[string]int
	var regions map[string][]string
	prefix := xdscontract.PinnedClusterName(model, "")
	for name, c := range t.Clusters {
		set, ok := strings.CutPrefix(name, prefix)
		if !ok || c.Policy.Residency != set {
			continue
		}
		if out == nil {
			out, regions = map[string]int{}, map[string][]string{}
		}
		out[set] = len(c.Endpoints)
		var rs []string
		for _, e := range c.Endpoints {
			if !slices.Contains(rs, e.Region) {
				rs = append(rs, e.Region)
			}
		}
		slices.Sort(rs)
		regions[set] = rs
	}
	return out, regions
}
