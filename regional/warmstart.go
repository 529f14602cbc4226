package regional

// Warm start (docs/design.md §5.4 "Static stability"): a controller that
// starts holds its first xDS push until its cells have had a chance to
// reconnect, and never pushes a state that drops a model its data planes
// serve without a reason it can name.
//
// Why holding is enough: the data planes (Envoy, isobar's gateway) keep
// their last good configuration while the controller is away, and the
// xDS server answers nobody before its first snapshot. go-control-plane's
// snapshot cache keeps a watch open for a node it holds no snapshot of
// (pkg/cache/v3/simple.go CreateWatch: with no snapshot for the node the
// watch is only recorded, and answered by the first SetSnapshot), so a
// gateway that reconnects during the hold waits on its old table. What
// the controller must not do is push what it knows before its cells are
// back: the first push of a fresh registry lists only the cells that
// happened to reconnect first, and models whose cells are still in their
// backoff vanish from routing (404 "no route").
//
// The mechanism:
//   - After every successful push the publisher writes the cells and
//     models of the state it pushed to WarmStartConfig.StateDir
//     (warm-state.json, written to a temporary file and renamed).
//   - At Start the registry reads it back. Until the hold ends every
//     projected state is kept back; the hold ends when Quorum of those
//     cells heartbeat again, or at Hold (default TTL plus the agents'
//     largest reconnect backoff), whichever comes first, and, when the
//     region routes across regions, once a route table is in force (a
//     plan or the fallback computed after the cells are back; bounded by
//     two summary intervals more). The syncer neither publishes summaries
//     nor installs a fallback while the cells are not back.
//   - The models of the file stay routable (an empty cluster: 503 "no
//     healthy upstream", retryable, and remote localities may still serve
//     them) until a cell of theirs registers, or ForgetAfter passes, as a
//     cell that failed at the restart would.
//   - Every model that leaves the pushed state is logged and counted with
//     its reason (isobar_regional_xds_models_dropped_total{reason}):
//     terminated (its cells reported Terminated), forgotten (its cells,
//     or the file's record of them, were forgotten after ForgetAfter) or
//     routes (it was served only by other regions and the route table no
//     longer sends it there).
//
// Ownership: the hold state (warmHold) belongs to the registry loop; the
// file is written by the publisher goroutine only (warmSaver) and read
// once, before the loop starts.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// WarmStartConfig says how a starting controller holds its first xDS
// push. Zero fields take the defaults noted.
type WarmStartConfig struct {
	// StateDir is where the controller keeps the cells and models of its
	// last pushed xDS state (warm-state.json), so that after a restart it
	// knows which cells to wait for and which models to keep routable,
	// and the highest plan it applied (plan-fence.json, FileFence), so
	// that a restart does not reopen the plan fence.
	// "": nothing is kept; the hold, when one is set, then runs to Hold.
	StateDir string
	// Hold bounds how long the first push waits for the cells. Zero:
	// TTL + 2 x AgentBackoffMax when StateDir is set, no hold otherwise (the
	// isobar binary sets it: --warm-start-hold). Negative: no hold.
	Hold time.Duration
	// AgentBackoffMax is the agents' largest reconnect backoff
	// (cellagent.Config.BackoffMax). Default 2 s, the agent's default.
	AgentBackoffMax time.Duration
	// Quorum is the share of the cells of the last pushed state whose
	// heartbeats end the hold early, in (0, 1]. Default 1: every one.
	Quorum float64
}

// DefaultAgentBackoffMax is the cellagent's default largest reconnect
// backoff (cellagent.DefaultBackoffMax); the hold's default assumes it.
const DefaultAgentBackoffMax = 2 * time.Second

// DefaultWarmStartHold is the hold of a controller with the default
// heartbeat timing: TTL (1 s) + 2 x DefaultAgentBackoffMax. Two backoffs:
// an agent's first attempt after the controller is back comes within one
// backoff of it, and one that lands while the controller is still coming
// up waits one more; the TTL covers the handshake and first heartbeat.
// The quorum ends the hold early in the usual case, so the margin costs
// only the restarts where a cell does not come back.
const DefaultWarmStartHold = time.Second + 2*DefaultAgentBackoffMax

func (w *WarmStartConfig) withDefaults(ttl time.Duration) {
	if w.AgentBackoffMax == 0 {
		w.AgentBackoffMax = DefaultAgentBackoffMax
	}
	if w.Quorum == 0 {
		w.Quorum = 1
	}
	w.Hold = w.hold(ttl)
}

// hold is the hold in force for a TTL: Hold, or its default when zero.
func (w WarmStartConfig) hold(ttl time.Duration) time.Duration {
	if w.Hold == 0 && w.StateDir != "" {
		agent := w.AgentBackoffMax
		if agent == 0 {
			agent = DefaultAgentBackoffMax
		}
		return ttl + 2*agent // as DefaultWarmStartHold
	}
	return w.Hold
}

func (w WarmStartConfig) validate() error {
	if !(w.Quorum > 0 && w.Quorum <= 1) {
		return fmt.Errorf("%w: warm start quorum %v: want a share in (0, 1]", ErrInvalidConfig, w.Quorum)
	}
	if w.AgentBackoffMax < 0 {
		return fmt.Errorf("%w: warm start agent backoff max %v: want >= 0", ErrInvalidConfig, w.AgentBackoffMax)
	}
	return nil
}

// prepareStateDir creates the state directory (New calls it).
func (w WarmStartConfig) prepareStateDir() error {
	if w.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(w.StateDir, 0o700); err != nil {
		return fmt.Errorf("regional: state dir %q cannot be created (point --state-dir at a writable directory): %w", w.StateDir, err)
	}
	return nil
}

// warmStateFile is the file name under StateDir.
const warmStateFile = "warm-state.json"

// Bounds of a warm-state file.
const (
	maxWarmStateBytes = 8 << 20
	maxWarmNameLen    = 256
	maxWarmModels     = 4096
)

// warmState is the record of the last pushed xDS state: the local cells
// with a published weight and every model routed.
type warmState struct {
	Version int        `json:"version"`
	Region  string     `json:"region"`
	SavedAt time.Time  `json:"saved_at"`
	Cells   []warmCell `json:"cells"`
	Models  []string   `json:"models"`
}

type warmCell struct {
	ID    string `json:"id"`
	Model string `json:"model"`
}

// errWarmState wraps every reason a warm-state file is refused.
var errWarmState = errors.New("regional: warm-state file refused")

// decodeWarmState parses and checks a warm-state file of region: strict
// JSON, version 1, the same region, at most maxCells cells and
// maxWarmModels models, non-empty names of at most maxWarmNameLen bytes,
// no duplicates.
func decodeWarmState(b []byte, region string, maxCells int) (*warmState, error) {
	if len(b) > maxWarmStateBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errWarmState, len(b), maxWarmStateBytes)
	}
	var s warmState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", errWarmState, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", errWarmState)
	}
	switch {
	case s.Version != 1:
		return nil, fmt.Errorf("%w: version %d, want 1", errWarmState, s.Version)
	case s.Region != region:
		return nil, fmt.Errorf("%w: written by region %q, this controller serves %q", errWarmState, s.Region, region)
	case len(s.Cells) > maxCells:
		return nil, fmt.Errorf("%w: %d cells, at most %d (--max-cells)", errWarmState, len(s.Cells), maxCells)
	case len(s.Models) > maxWarmModels:
		return nil, fmt.Errorf("%w: %d models, at most %d", errWarmState, len(s.Models), maxWarmModels)
	}
	name := func(kind, v string) error {
		if v == "" || len(v) > maxWarmNameLen {
			return fmt.Errorf("%w: %s name %q: want 1..%d bytes", errWarmState, kind, truncName(v), maxWarmNameLen)
		}
		return nil
	}
	seen := make(map[string]bool, len(s.Cells))
	for _, c := range s.Cells {
		if err := name("cell", c.ID); err != nil {
			return nil, err
		}
		if err := name("model", c.Model); err != nil {
			return nil, err
		}
		if seen[c.ID] {
			return nil, fmt.Errorf("%w: cell %q listed twice", errWarmState, c.ID)
		}
		seen[c.ID] = true
	}
	models := make(map[string]bool, len(s.Models))
	for _, m := range s.Models {
		if err := name("model", m); err != nil {
			return nil, err
		}
		if models[m] {
			return nil, fmt.Errorf("%w: model %q listed twice", errWarmState, m)
		}
		models[m] = true
	}
	return &s, nil
}

func truncName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// warmStateOf is the record of st for region.
func warmStateOf(region string, st xds.State, now time.Time) *warmState {
	ws := &warmState{Version: 1, Region: region, SavedAt: now.UTC(), Cells: []warmCell{}, Models: []string{}}
	for _, m := range st.Models {
		ws.Models = append(ws.Models, m.Name)
		for _, l := range m.Localities {
			if l.Region != region {
				continue
			}
			for _, e := range l.Endpoints {
				ws.Cells = append(ws.Cells, warmCell{ID: e.CellID, Model: m.Name})
			}
		}
	}
	slices.SortFunc(ws.Cells, func(a, b warmCell) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	slices.Sort(ws.Models)
	return ws
}

// sameContent reports whether a and b list the same cells and models.
func (s *warmState) sameContent(o *warmState) bool {
	return o != nil && slices.Equal(s.Cells, o.Cells) && slices.Equal(s.Models, o.Models)
}

// warmMetrics are the warm start's instruments.
type warmMetrics struct {
	held     prometheus.Gauge
	releases *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	errors   *prometheus.CounterVec
}

// unregisteredWarmMetrics are the registry's warm-start metrics until the
// controller installs registered ones (useWarmMetrics).
func unregisteredWarmMetrics() *warmMetrics {
	m, _ := newWarmMetrics(nil) // nothing to register: cannot fail
	return m
}

// newWarmMetrics builds the warm-start metrics and registers them with reg
// when reg is not nil; a registration error is returned, never a panic.
func newWarmMetrics(reg prometheus.Registerer) (*warmMetrics, error) {
	m := &warmMetrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_regional_warm_start_hold_seconds",
			Help: "How long this controller held its first xDS push for its cells to reconnect.",
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_warm_start_releases_total",
			Help: "First xDS pushes released after a start, by what ended the hold (quorum: enough known cells reconnected; deadline: the hold ran out; empty: the last pushed state had no cell).",
		}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_models_dropped_total",
			Help: "Models removed from the pushed xDS state, by reason (terminated, forgotten, routes).",
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_warm_state_errors_total",
			Help: "Warm-state file operations that failed, by operation (load, save); a refused file means the hold runs to its deadline.",
		}, []string{"op"}),
	}
	if reg != nil {
		if err := promreg.Register(reg, m.held, m.releases, m.dropped, m.errors); err != nil {
			return nil, fmt.Errorf("regional: register warm-start metrics: %w", err)
		}
	}
	return m, nil
}

// warmHold is the registry loop's warm-start state.
type warmHold struct {
	holding   bool
	startedAt time.Time
	until     time.Time       // the cells' deadline
	known     map[string]bool // cells of the last pushed state not yet back
	need, got int             // reconnections that end the hold (-1: unknown), seen so far
	// models of the last pushed state kept routable until a cell of
	// theirs registers or modelsUntil passes.
	models      map[string]bool
	modelsUntil time.Time
	// needRoutes: the region routes across regions; the push also waits
	// (until settledAt+routesGrace) for a route table.
	needRoutes  bool
	routesGrace time.Duration
	settledAt   time.Time
	reason      string
}

// loadWarmState reads the file under dir; nil, nil when there is none.
func loadWarmState(dir, region string, maxCells int) (*warmState, error) {
	b, err := os.ReadFile(filepath.Join(dir, warmStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errWarmState, err)
	}
	return decodeWarmState(b, region, maxCells)
}

// beginWarmStart sets the hold up from the configuration and the state
// file. Runs before the loop starts.
func (r *Registry) beginWarmStart(now time.Time) {
	w := r.cfg.WarmStart
	h := &r.warm
	h.startedAt, h.need = now, -1
	var st *warmState
	if w.StateDir != "" {
		var err error
		if st, err = loadWarmState(w.StateDir, r.cfg.Region, r.cfg.Limits.MaxCells); err != nil {
			r.warmM.errors.WithLabelValues("load").Inc()
			r.log.Warn("warm-state file refused; the first push waits for the full hold (delete or fix the file)",
				"dir", w.StateDir, "err", err)
			st = nil
		}
	}
	if st != nil {
		h.models = map[string]bool{}
		for _, m := range st.Models {
			h.models[m] = true
			r.offered[m] = true // what the data planes serve: a drop is counted
		}
		h.modelsUntil = now.Add(r.cfg.ForgetAfter)
		h.known = map[string]bool{}
		for _, c := range st.Cells {
			h.known[c.ID] = true
		}
		if len(st.Cells) > 0 {
			h.need = max(1, int(math.Ceil(w.Quorum*float64(len(st.Cells))-1e-9)))
		}
		r.saver.last = st
	}
	hold := w.hold(r.cfg.TTL())
	switch {
	case hold <= 0:
		r.settle()
	case st != nil && len(st.Cells) == 0:
		// The last push served no cell: nobody to wait for.
		r.settle()
		r.warmM.releases.WithLabelValues("empty").Inc()
	default:
		h.holding = true
		h.until = now.Add(hold)
		h.routesGrace = 2 * r.cfg.Global.SummaryInterval
		r.log.Info("holding the first xDS push until the cells reconnect",
			"known_cells", len(h.known), "quorum", h.need, "hold", hold, "models_kept", len(h.models))
	}
}

// warmCycle updates the hold from this cycle's views and reports whether
// the push must still be held back; release is true in the cycle that
// ends the hold, or lets the models kept since the start go (that cycle
// pushes whatever the projection says).
func (r *Registry) warmCycle(now time.Time, views []*CellView) (hold, release bool) {
	h := &r.warm
	for i := 0; i < len(views) && len(h.models) > 0; i++ { // most cycles keep no model: no view read
		if v := views[i]; h.models[v.Model] {
			delete(h.models, v.Model) // the cell's record keeps the model now
		}
	}
	expired := false
	if len(h.models) > 0 && !now.Before(h.modelsUntil) {
		h.models, expired = nil, true
		r.log.Info("models kept since the restart have no cell back after ForgetAfter; letting them go", "forget_after", r.cfg.ForgetAfter)
	}
	if !h.holding {
		return false, expired
	}
	for id := range h.known {
		if c := r.cells[id]; c != nil && c.state.Live() {
			delete(h.known, id)
			h.got++
		}
	}
	if h.settledAt.IsZero() {
		switch {
		case h.need >= 0 && h.got >= h.need:
			h.reason = "quorum"
		case !now.Before(h.until):
			h.reason = "deadline"
		default:
			return true, false
		}
		h.settledAt = now
		r.settle()
	}
	if h.needRoutes && r.routes == nil && now.Before(h.settledAt.Add(h.routesGrace)) {
		return true, false
	}
	h.holding = false
	held := now.Sub(h.startedAt)
	r.warmM.held.Set(held.Seconds())
	r.warmM.releases.WithLabelValues(h.reason).Inc()
	r.log.Info("first xDS push released", "reason", h.reason, "held", held, "cells_back", h.got,
		"cells_missing", len(h.known), "routes", r.routes != nil)
	return false, true
}

// useWarmMetrics swaps in registered instruments; before Start only.
func (r *Registry) useWarmMetrics(m *warmMetrics) {
	r.warmM, r.saver.m = m, m
}

// keptModels are the models of the last pushed state kept routable.
func (r *Registry) keptModels() map[string]bool { return r.warm.models }

// settle marks the cells' part of the hold over. Loop-owned (or before
// the loop starts); runs once.
func (r *Registry) settle() {
	if !r.settled.Swap(true) {
		close(r.settledCh)
	}
}

// settledC is closed once Settled is true.
func (r *Registry) settledC() <-chan struct{} { return r.settledCh }

// Settled reports whether the warm start's wait for the cells is over
// (always true without a hold): until then the syncer publishes no
// summary and installs no fallback, which would be built from the cells
// that happened to reconnect first.
func (r *Registry) Settled() bool { return r.settled.Load() }

// noteDropped logs and counts every model of the previous offer missing
// from st, with its reason.
func (r *Registry) noteDropped(views []*CellView, st xds.State) {
	next := make(map[string]bool, len(st.Models))
	for _, m := range st.Models {
		next[m.Name] = true
	}
	for m := range r.offered {
		if next[m] {
			continue
		}
		reason := "forgotten"
		for _, v := range views {
			if v.Model == m {
				reason = "terminated" // a record remains: every one is terminated
				break
			}
		}
		if reason == "forgotten" && r.remoteOnly[m] {
			reason = "routes"
		}
		r.warmM.dropped.WithLabelValues(reason).Inc()
		r.log.Warn("model dropped from the xDS state", "model", m, "reason", reason)
	}
	clear(r.offered)
	clear(r.remoteOnly)
	for _, m := range st.Models {
		r.offered[m.Name] = true
		local := false
		for _, l := range m.Localities {
			local = local || l.Region == r.cfg.Region
		}
		if !local && len(m.Localities) > 0 {
			r.remoteOnly[m.Name] = true
		}
	}
}

// warmSaver writes the warm-state file after pushes. Owned by the
// publisher goroutine (last is set before it starts).
type warmSaver struct {
	dir, region string
	log         *slog.Logger
	m           *warmMetrics
	last        *warmState
}

// save records st when its cells or models changed since the last write.
func (s *warmSaver) save(st xds.State, now time.Time) {
	if s == nil || s.dir == "" {
		return
	}
	ws := warmStateOf(s.region, st, now)
	if ws.sameContent(s.last) {
		return
	}
	if err := writeWarmState(s.dir, ws); err != nil {
		s.m.errors.WithLabelValues("save").Inc()
		s.log.Warn("warm-state file not written; a restart will hold its first push for the full hold", "dir", s.dir, "err", err)
		return
	}
	s.last = ws
}

// writeWarmState writes ws to dir atomically: a temporary file, synced,
// renamed over the old one.
func writeWarmState(dir string, ws *warmState) error {
	b, err := json.Marshal(ws)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".warm-state-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, warmStateFile))
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}
