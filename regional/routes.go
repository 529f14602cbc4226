package regional

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

// Route sources, in the order a region prefers them (debugapi's, the
// contract /debug/routes serves).
const (
	// RoutesPlan: the global leader's plan, valid and unexpired.
	RoutesPlan = debugapi.RoutesPlan
	// RoutesFallback: the plan expired (global unreachable); local-first
	// with spill-over computed from the gossiped summaries.
	RoutesFallback = debugapi.RoutesFallback
	// RoutesLocal: no cross-region information at all; everything local.
	RoutesLocal = debugapi.RoutesLocal
)

type (
	// RouteTable is the cross-region routing in force for this region's
	// ingress (debugapi.RouteTable). Immutable once published.
	RouteTable = debugapi.RouteTable
	// ModelRoutes is one model's split.
	ModelRoutes = debugapi.ModelRoutes
)

// Plan refusal classes; each is a result label of
// isobar_regional_plans_total. Test with errors.Is.
var (
	ErrInvalidPlan = errors.New("regional: invalid plan")
	ErrStalePlan   = errors.New("regional: stale plan")
	ErrExpiredPlan = errors.New("regional: expired plan")
)

func planResult(err error) string {
	switch {
	case err == nil:
		return "applied"
	case errors.Is(err, ErrStalePlan):
		return "stale"
	case errors.Is(err, ErrExpiredPlan):
		return "expired"
	default:
		return "invalid"
	}
}

// sumTolerance: routes plus shed must sum to 1 within this.
const sumTolerance = 1e-6

// Plan shape limits: a plan for one region names at most summary.MaxModels
// models and summary.MaxRegions destinations and ingress addresses, and
// lives at most maxPlanLifetime.
const (
	maxPlanLifetime = 24 * time.Hour
	maxLeaderIDLen  = 512
)

// planTable validates a plan received for region against fence, the
// highest plan this region has applied (nil: none), and returns the table
// it yields. inForce says whether a plan is in force now.
//
// Fencing: a plan with a lower epoch than the fence, or the same epoch and
// a lower sequence, is stale; so is the fenced plan itself while a plan is
// in force (a duplicate). The fence is the highest plan ever applied, not
// the table in force, so it holds through fallback (every global outage)
// and, when the syncer has a FenceStore, through a restart: an old leader
// that comes back after its successor's plans cannot take the region back.
// After fallback or a restart the fenced plan itself is accepted again (the
// leader replays its latest plan to every new subscriber), with the life it
// has left.
//
// Lifetime: a plan lives from its issue time on the leader's clock
// (issued_at) for valid_until - issued_at, its maximum age; receiving it
// again (a replay to a reconnecting region) does not restart it. The
// leader stamps each copy it sends (sent_at, its clock), and the region
// grants valid_until - sent_at from now: the life left, measured on the
// leader's clock alone, so neither a replay nor clock skew between leader
// and region extends it. From a leader that does not stamp sends, the
// region grants the earlier of now + the maximum age and valid_until +
// skew on its own clock (the region's --max-clock-skew). A plan with no
// life left is expired. A plan without issued_at is judged by valid_until
// against now. Fractions must be finite, in [0,1] and sum (with shed) to
// 1; every remote destination needs an ingress address.
func planTable(p *isobarpb.RoutingPlan, region string, fence *RouteTable, inForce bool, now time.Time, skew time.Duration) (*RouteTable, error) {
	bad := func(format string, a ...any) (*RouteTable, error) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidPlan, fmt.Sprintf(format, a...))
	}
	if p.GetEpoch() == 0 {
		return bad("epoch 0")
	}
	if fence != nil {
		lower := p.GetEpoch() < fence.Epoch || (p.GetEpoch() == fence.Epoch && p.GetSequence() < fence.Sequence)
		same := p.GetEpoch() == fence.Epoch && p.GetSequence() == fence.Sequence
		if lower || (same && inForce) {
			return nil, fmt.Errorf("%w: epoch %d sequence %d after epoch %d sequence %d", ErrStalePlan,
				p.GetEpoch(), p.GetSequence(), fence.Epoch, fence.Sequence)
		}
	}
	if p.GetValidUntil() == nil || p.GetValidUntil().CheckValid() != nil {
		return bad("no valid_until")
	}
	switch {
	case len(p.GetLeaderId()) > maxLeaderIDLen:
		return bad("leader_id of %d bytes, at most %d", len(p.GetLeaderId()), maxLeaderIDLen)
	case len(p.GetPlans()) > summary.MaxModels:
		return bad("%d model plans, at most %d", len(p.GetPlans()), summary.MaxModels)
	case len(p.GetIngress()) > summary.MaxRegions:
		return bad("%d ingress addresses, at most %d", len(p.GetIngress()), summary.MaxRegions)
	}
	until := p.GetValidUntil().AsTime()
	if is := p.GetIssuedAt(); is != nil {
		if is.CheckValid() != nil {
			return bad("invalid issued_at")
		}
		life := until.Sub(is.AsTime())
		switch {
		case life <= 0:
			return nil, fmt.Errorf("%w: valid until %v, issued %v", ErrExpiredPlan, until, is.AsTime())
		case life > maxPlanLifetime:
			return bad("valid for %v, at most %v", life, maxPlanLifetime)
		}
		left := life
		if sa := p.GetSentAt(); sa != nil {
			// The life left at the send, on the leader's clock.
			if sa.CheckValid() != nil {
				return bad("invalid sent_at")
			}
			age := sa.AsTime().Sub(is.AsTime())
			if age < 0 {
				return bad("sent %v before it was issued", -age)
			}
			if left -= age; left <= 0 {
				return nil, fmt.Errorf("%w: sent %v after it was issued, with a maximum age of %v", ErrExpiredPlan, age, life)
			}
		} else if late := p.GetValidUntil().AsTime().Add(skew).Sub(now); late < left {
			// No send stamp: bounded on this clock, with the skew allowance.
			if left = late; left <= 0 {
				return nil, fmt.Errorf("%w: issued %v with a maximum age of %v, now %v (beyond the clock-skew allowance of %v; if the leader's clock is behind this one's, fix the clocks or raise --max-clock-skew)",
					ErrExpiredPlan, is.AsTime(), life, now, skew)
			}
		}
		until = now.Add(left)
	}
	if !until.After(now) {
		return nil, fmt.Errorf("%w: valid until %v, now %v", ErrExpiredPlan, until, now)
	}
	if until.Sub(now) > maxPlanLifetime {
		return bad("valid until %v, more than %v from now", until, maxPlanLifetime)
	}
	t := &RouteTable{
		Source: RoutesPlan, Epoch: p.GetEpoch(), Sequence: p.GetSequence(), LeaderID: p.GetLeaderId(),
		ValidUntil: until, Models: map[string]ModelRoutes{}, Ingress: map[string]string{},
	}
	if p.GetIssuedAt() != nil {
		t.IssuedAt = p.GetIssuedAt().AsTime()
	}
	for _, in := range p.GetIngress() {
		if !summary.ValidName(in.GetRegion()) {
			return bad("ingress region %q", in.GetRegion())
		}
		if err := ingressAddress(in.GetAddress()); err != nil {
			return bad("ingress of %s: %v", in.GetRegion(), err)
		}
		t.Ingress[in.GetRegion()] = in.GetAddress()
	}
	for _, mp := range p.GetPlans() {
		if mp.GetIngressRegion() != region {
			return bad("model plan for ingress %q sent to %s", mp.GetIngressRegion(), region)
		}
		m := mp.GetModel()
		if m == "" || len(m) > 256 {
			return bad("model name %q", trunc(m))
		}
		if _, dup := t.Models[m]; dup {
			return bad("model %s planned twice", m)
		}
		if len(mp.GetRoutes()) > summary.MaxRegions {
			return bad("model %s: %d routes, at most %d", m, len(mp.GetRoutes()), summary.MaxRegions)
		}
		mr := ModelRoutes{Routes: map[string]float64{}, Shed: mp.GetShed()}
		sum := mp.GetShed()
		if !fraction(mp.GetShed()) {
			return bad("model %s: shed %v not in [0,1]", m, mp.GetShed())
		}
		for _, r := range mp.GetRoutes() {
			d, f := r.GetDestination(), r.GetFraction()
			switch {
			case !summary.ValidName(d):
				return bad("model %s: destination %q", m, d)
			case !fraction(f):
				return bad("model %s: fraction to %s is %v; want [0,1]", m, d, f)
			case d != region && t.Ingress[d] == "":
				return bad("model %s: destination %s has no ingress address", m, d)
			}
			if _, dup := mr.Routes[d]; dup {
				return bad("model %s: destination %s listed twice", m, d)
			}
			mr.Routes[d] = f
			sum += f
		}
		if math.Abs(sum-1) > sumTolerance {
			return bad("model %s: routes and shed sum to %v, not 1", m, sum)
		}
		t.Models[m] = mr
	}
	return t, nil
}

func fraction(f float64) bool { return !math.IsNaN(f) && f >= 0 && f <= 1 }

// ingressAddress requires IP:port: the address goes into EDS.
func ingressAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port", a)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q: host must be an IP address", a)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: bad port", a)
	}
	return nil
}
