package regional

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/score"
)

// CellDebug is the JSON shape of GET /debug/cells/{id}: everything that
// went into a cell's weight.
type CellDebug struct {
	ID          string    `json:"id"`
	Endpoint    string    `json:"endpoint"`
	Model       string    `json:"model"`
	MaxModelLen uint32    `json:"max_model_len"`
	State       string    `json:"state"`
	StateSince  time.Time `json:"state_since"`
	Reason      string    `json:"reason"`
	LastSeen    time.Time `json:"last_seen"`
	Sequence    uint64    `json:"sequence"`
	// Suspect: the heartbeat stream broke without a Terminated report.
	Suspect bool `json:"suspect,omitempty"`
	// Raw signals as reported, plus the controller's own RTT/jitter.
	Raw map[string]float64 `json:"raw"`
	// Normalised score, configured weight and contribution per present
	// signal.
	Signals  map[string]SignalDebug `json:"signals"`
	Pressure float64                `json:"pressure"`
	Fallback bool                   `json:"fallback"`
	Sources  map[string]SourceDebug `json:"sources"`
	// Weight published to the data plane (0 = not in the load balancer)
	// and the target the cell's state and slow signals alone would give.
	Weight       uint32 `json:"weight"`
	TargetWeight uint32 `json:"target_weight"`
	// ClassWeight is the weight in the context-class clusters the cell
	// fits when its max_model_len is below its model's longest (Weight is
	// then 1, for the main cluster); absent otherwise.
	ClassWeight uint32 `json:"class_weight,omitempty"`
	// Band is the weight band behind the target ("full", "1/2", ...,
	// "probe", "out") and BandReason why; Degraded: published with EDS
	// health DEGRADED (a hardware derate). Load signals never move a band.
	Band             string  `json:"band"`
	BandReason       string  `json:"band_reason"`
	Degraded         bool    `json:"degraded"`
	Penalty          float64 `json:"penalty"`
	Probation        bool    `json:"probation"`
	PenaltyTrips     int     `json:"penalty_trips"`
	OperatorDrain    bool    `json:"operator_drain"`
	EndpointConflict bool    `json:"endpoint_conflict"`
	// ClockSkewSeconds is the cell's sent_at minus the receive time of its
	// last heartbeat (absent when it carried none); ClockSkewed: beyond
	// the bound. Skew never affects liveness.
	ClockSkewSeconds *float64 `json:"clock_skew_seconds,omitempty"`
	ClockSkewed      bool     `json:"clock_skewed"`
}

// SignalDebug explains one signal's part in the pressure.
type SignalDebug struct {
	Normalized   float64 `json:"normalized"`
	Weight       float64 `json:"weight"`
	Contribution float64 `json:"contribution"`
}

// SourceDebug is a telemetry source's health.
type SourceDebug struct {
	OK          bool       `json:"ok"`
	Error       string     `json:"error,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
}

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
	for s := score.Signal(0); s < score.NumSignals; s++ {
		if cv.Score.Present[s] {
			d.Signals[s.String()] = SignalDebug{
				Normalized: cv.Score.Normalized[s], Weight: sc.Weights[s], Contribution: cv.Score.Contribution[s],
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
// POST /v1/cells/ID/{drain,undrain}.
func newHTTPHandler(reg *Registry, routes func() *RouteTable, sc score.Config, gatherer prometheus.Gatherer, adminToken string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/routes", func(w http.ResponseWriter, _ *http.Request) {
		t := routes()
		if t == nil {
			writeJSON(w, http.StatusOK, map[string]string{"source": RoutesLocal, "note": "no cross-region routing configured"})
			return
		}
		writeJSON(w, http.StatusOK, t)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /debug/cells", func(w http.ResponseWriter, _ *http.Request) {
		v := reg.View()
		out := struct {
			At    time.Time   `json:"at"`
			Cycle uint64      `json:"cycle"`
			Cells []CellDebug `json:"cells"`
		}{At: v.At, Cycle: v.Cycle, Cells: make([]CellDebug, 0, len(v.Cells))}
		for _, cv := range v.Cells {
			out.Cells = append(out.Cells, debugCell(cv, sc))
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /debug/cells/{id}", func(w http.ResponseWriter, r *http.Request) {
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
			if adminToken != "" {
				got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				if subtle.ConstantTimeCompare([]byte(got), []byte(adminToken)) != 1 {
					writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong bearer token"})
					return
				}
			}
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
	mux.HandleFunc("POST /v1/cells/{id}/drain", drain(true))
	mux.HandleFunc("POST /v1/cells/{id}/undrain", drain(false))
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
