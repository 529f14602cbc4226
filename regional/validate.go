package regional

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"

	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/summary"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// Heartbeat refusal classes. Each is a reason label of
// isobar_regional_heartbeats_rejected_total; test with errors.Is.
var (
	ErrInvalidHeartbeat = errors.New("regional: invalid heartbeat")
	ErrWrongRegion      = errors.New("regional: heartbeat for another region")
	ErrStaleSequence    = errors.New("regional: stale or replayed heartbeat sequence")
	ErrDuplicateCell    = errors.New("regional: cell id already connected on another stream")
	ErrIdentityMismatch = errors.New("regional: client certificate does not match the cell id")
	// ErrIdentityRegion: the client certificate is for a cell of another
	// region than the heartbeat's or this controller's.
	ErrIdentityRegion = errors.New("regional: client certificate is for a cell of another region")
	// ErrNoCellIdentity: the client certificate carries no
	// spiffe://isobar/region/<region>/cell/<id> identity (another kind, the
	// older cell form, or none).
	ErrNoCellIdentity = errors.New("regional: client certificate carries no cell identity")
	ErrOversized      = errors.New("regional: heartbeat message too large")
)

// rejectReason maps a refusal to its metric label.
func rejectReason(err error) string {
	switch {
	case errors.Is(err, ErrWrongRegion):
		return "wrong_region"
	case errors.Is(err, ErrStaleSequence):
		return "stale_sequence"
	case errors.Is(err, ErrDuplicateCell):
		return "duplicate_cell"
	case errors.Is(err, ErrIdentityMismatch):
		return "identity_mismatch"
	case errors.Is(err, ErrIdentityRegion):
		return "identity_region"
	case errors.Is(err, ErrNoCellIdentity):
		return "no_identity"
	case errors.Is(err, ErrEndpointNotAllowed):
		return "endpoint_not_allowed"
	case errors.Is(err, ErrOversized):
		return "oversized"
	case errors.Is(err, ErrTooManyCells):
		return "too_many_cells"
	case errors.Is(err, ErrRateLimited):
		return "rate_limited"
	case errors.Is(err, ErrInvalidHeartbeat):
		return "invalid"
	default:
		return "other"
	}
}

// maxModelLenLimit bounds max_model_len: no model has a context of more than
// 64 Mi tokens; a larger value is corruption.
const maxModelLenLimit = 64 << 20

// maxNumSeqsLimit bounds max_num_seqs: no engine runs a batch of more than
// 1 Mi sequences; a larger value is corruption.
const maxNumSeqsLimit = 1 << 20

// validateHeartbeat checks everything a heartbeat carries that does not
// depend on other cells. It returns an error wrapping ErrInvalidHeartbeat
// or ErrWrongRegion that names the offending field.
func validateHeartbeat(hb *isobarpb.CellHeartbeat, region string) error {
	return validateHeartbeatOn(hb, region, nil)
}

// validMemo is the cell id and endpoint a stream's last accepted
// heartbeat carried (its streamState's). A stream repeats them in every
// heartbeat, and their checks depend on nothing but the strings, so
// validateHeartbeatOn checks each only when it differs from the memo's:
// the id's regexp and the endpoint's parse were half of a heartbeat's
// validation, the regexp alone 1.4 % of the controllers' CPU at 10,000
// cells (docs/bench.md).
type validMemo struct{ id, endpoint string }

// validateHeartbeatOn is validateHeartbeat on a stream whose last valid
// id and endpoint are m (nil: none known). It records hb's in m when hb
// is valid.
func validateHeartbeatOn(hb *isobarpb.CellHeartbeat, region string, m *validMemo) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidHeartbeat, fmt.Sprintf(format, a...))
	}
	if m == nil {
		m = &validMemo{}
	}
	if id := hb.GetCellId(); id != m.id || id == "" {
		if !summary.ValidName(id) {
			return bad("cell_id %q: want 1-128 characters of [A-Za-z0-9._-]", trunc(id))
		}
	}
	if hb.GetRegion() != region {
		return fmt.Errorf("%w: cell %s says region %q, this controller serves %q", ErrWrongRegion, hb.GetCellId(), trunc(hb.GetRegion()), region)
	}
	st := lifecycle.FromProto(hb.GetState())
	if st == lifecycle.Unknown {
		return bad("cell %s: state %v is not a lifecycle state", hb.GetCellId(), hb.GetState())
	}
	if ep := hb.GetEndpoint(); ep != m.endpoint || ep == "" {
		if err := validateEndpoint(ep); err != nil {
			return bad("cell %s: endpoint: %v", hb.GetCellId(), err)
		}
	}
	if c := hb.GetCapability(); c != nil {
		if len(c.GetModel()) > 256 {
			return bad("cell %s: model name longer than 256 bytes", hb.GetCellId())
		}
		if c.GetMaxModelLen() > maxModelLenLimit {
			return bad("cell %s: max_model_len %d exceeds %d", hb.GetCellId(), c.GetMaxModelLen(), maxModelLenLimit)
		}
		// !(x >= 0) also catches NaN.
		if r := c.GetPrefillTokensPerS(); !(r >= 0) || r > xdscontract.MaxPrefillTokensPerSecond {
			return bad("cell %s: prefill_tokens_per_s %v: want 0 (unknown) up to %g", hb.GetCellId(), r, float64(xdscontract.MaxPrefillTokensPerSecond))
		}
		if c.GetMaxNumSeqs() > maxNumSeqsLimit {
			return bad("cell %s: max_num_seqs %d exceeds %d", hb.GetCellId(), c.GetMaxNumSeqs(), maxNumSeqsLimit)
		}
	}
	if (st == lifecycle.Ready || st == lifecycle.Loading) && hb.GetCapability().GetModel() == "" {
		return bad("cell %s: %s without a model name", hb.GetCellId(), st)
	}
	if hb.GetSequence() == 0 {
		return bad("cell %s: sequence must start at 1", hb.GetCellId())
	}
	if len(hb.GetIncarnation()) > 128 || len(hb.GetReason()) > 1024 {
		return bad("cell %s: incarnation or reason too long", hb.GetCellId())
	}
	if err := validateSignals(hb.GetCellId(), hb.GetSignals()); err != nil {
		return err
	}
	m.id, m.endpoint = hb.GetCellId(), hb.GetEndpoint()
	return nil
}

func validateEndpoint(ep string) error {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("%q is not host:port", trunc(ep))
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q: host must be an IP address (Envoy's EDS refuses names; resolve it in the agent with --advertise)", trunc(ep))
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port must be 1-65535", trunc(ep))
	}
	return nil
}

// signalField is one float signal of a heartbeat with its bound: the
// largest value the controller keeps (summary/bounds.go, shared with the
// summary so that a kept value can always be published). fraction: the
// value is a fraction, and more than 1.0001 is corrupt rather than large.
type signalField struct {
	name     string
	v        **float64
	max      float64
	fraction bool
}

// numSignalFields is how many float signals signalFields lists.
const numSignalFields = 13

// signalFields lists s's float signals with their bounds; the names are
// the field label of isobar_regional_signals_clamped_total (a fixed set).
// An array, not a slice: every heartbeat is checked twice, and a slice
// would be allocated each time.
func signalFields(s *isobarpb.Signals) [numSignalFields]signalField {
	return [numSignalFields]signalField{
		{"queue_depth", &s.QueueDepth, summary.MaxSignal, false},
		{"running", &s.Running, summary.MaxSignal, false},
		{"ttft_p95_seconds", &s.TtftP95Seconds, summary.MaxTTFTSeconds, false},
		{"error_rate", &s.ErrorRate, 1, true},
		{"kv_cache_usage", &s.KvCacheUsage, 1, true},
		{"gpu_util", &s.GpuUtil, 1, true},
		{"vram_used", &s.VramUsed, 1, true},
		{"sm_active", &s.SmActive, 1, true},
		{"dram_active", &s.DramActive, 1, true},
		{"power_watts", &s.PowerWatts, summary.MaxSignal, false},
		{"request_rate", &s.RequestRate, summary.MaxRateRPS, false},
		{"window_requests", &s.WindowRequests, summary.MaxSignal, false},
		{"prefix_cache_hit_rate", &s.PrefixCacheHitRate, 1, true},
	}
}

// validateSignals refuses non-finite or impossible values rather than let
// them reach the scorer: a cellagent drops bad values itself, so one that
// arrives here is a bug or an attack. A finite value above its bound is
// not refused here: clampSignals caps it, per cell, when the registry
// takes the heartbeat.
func validateSignals(cell string, s *isobarpb.Signals) error {
	if s == nil {
		return nil
	}
	for _, f := range signalFields(s) {
		if *f.v == nil {
			continue
		}
		v := **f.v
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return fmt.Errorf("%w: cell %s: signal %s is %v; want a finite number", ErrInvalidHeartbeat, cell, f.name, v)
		case v < 0:
			return fmt.Errorf("%w: cell %s: signal %s is negative (%v)", ErrInvalidHeartbeat, cell, f.name, v)
		case f.fraction && v > 1.0001:
			return fmt.Errorf("%w: cell %s: signal %s is %v; want a fraction in [0,1]", ErrInvalidHeartbeat, cell, f.name, v)
		}
	}
	if t := s.TemperatureCelsius; t != nil && (math.IsNaN(*t) || *t < -50 || *t > 200) {
		return fmt.Errorf("%w: cell %s: temperature_celsius %v outside [-50, 200]", ErrInvalidHeartbeat, cell, *t)
	}
	return nil
}

// trunc bounds outside input quoted in errors and logs.
func trunc(s string) string { return truncate.Marked(s, 64, "…") }

// clampSignals caps each of s's signals at its bound (signalFields) and
// returns the names of those it capped. A cell reporting, say, a TTFT P95
// of 1e5 s keeps its heartbeat (state, endpoint) with TTFT 86,400 s, the
// most the summary carries: the cell scores as slow as it can, and its
// region's summary stays valid. It changes s: call it on a message the
// caller owns (the registry, after Submit).
func clampSignals(s *isobarpb.Signals) []string {
	if s == nil {
		return nil
	}
	var capped []string
	for _, f := range signalFields(s) {
		if *f.v != nil && **f.v > f.max {
			hi := f.max
			*f.v = &hi
			capped = append(capped, f.name)
		}
	}
	return capped
}
