package regional

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"reflect"
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
	// PinnedRoutes is one residency slice's split (ModelRoutes.Pinned).
	PinnedRoutes = debugapi.PinnedRoutes
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
	case errors.Is(err, ErrResidencyPlan):
		return "residency"
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
	if p.GetEpoch() == 0 {
		return nil, badPlan("epoch 0")
	}
	if err := checkFence(p, fence, inForce); err != nil {
		return nil, err
	}
	if p.GetValidUntil() == nil || p.GetValidUntil().CheckValid() != nil {
		return nil, badPlan("no valid_until")
	}
	switch {
	case len(p.GetLeaderId()) > maxLeaderIDLen:
		return nil, badPlan("leader_id of %d bytes, at most %d", len(p.GetLeaderId()), maxLeaderIDLen)
	case len(p.GetPlans()) > summary.MaxModels:
		return nil, badPlan("%d model plans, at most %d", len(p.GetPlans()), summary.MaxModels)
	case len(p.GetIngress()) > summary.MaxRegions:
		return nil, badPlan("%d ingress addresses, at most %d", len(p.GetIngress()), summary.MaxRegions)
	}
	until, err := planUntil(p, now, skew)
	if err != nil {
		return nil, err
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
			return nil, badPlan("ingress region %q", in.GetRegion())
		}
		if err := ingressAddress(in.GetAddress()); err != nil {
			return nil, badPlan("ingress of %s: %v", in.GetRegion(), err)
		}
		t.Ingress[in.GetRegion()] = in.GetAddress()
	}
	for _, mp := range p.GetPlans() {
		if err := addModelPlan(t, mp, region); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// badPlan is an ErrInvalidPlan saying what is wrong.
func badPlan(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidPlan, fmt.Sprintf(format, a...))
}

// checkFence refuses a plan below the fence, or the fenced plan itself
// while a plan is in force (ErrStalePlan).
func checkFence(p *isobarpb.RoutingPlan, fence *RouteTable, inForce bool) error {
	if fence == nil {
		return nil
	}
	lower := p.GetEpoch() < fence.Epoch || (p.GetEpoch() == fence.Epoch && p.GetSequence() < fence.Sequence)
	same := p.GetEpoch() == fence.Epoch && p.GetSequence() == fence.Sequence
	if lower || (same && inForce) {
		return fmt.Errorf("%w: epoch %d sequence %d after epoch %d sequence %d", ErrStalePlan,
			p.GetEpoch(), p.GetSequence(), fence.Epoch, fence.Sequence)
	}
	return nil
}

// planUntil is the time, on this region's clock, until which the plan
// holds (see planTable's Lifetime).
func planUntil(p *isobarpb.RoutingPlan, now time.Time, skew time.Duration) (time.Time, error) {
	until := p.GetValidUntil().AsTime()
	if is := p.GetIssuedAt(); is != nil {
		left, err := planLifeLeft(p, now, skew)
		if err != nil {
			return time.Time{}, err
		}
		until = now.Add(left)
	}
	if !until.After(now) {
		return time.Time{}, fmt.Errorf("%w: valid until %v, now %v", ErrExpiredPlan, until, now)
	}
	if until.Sub(now) > maxPlanLifetime {
		return time.Time{}, badPlan("valid until %v, more than %v from now", until, maxPlanLifetime)
	}
	return until, nil
}

// planLifeLeft is the life a plan with issued_at has left at now.
func planLifeLeft(p *isobarpb.RoutingPlan, now time.Time, skew time.Duration) (time.Duration, error) {
	is, until := p.GetIssuedAt(), p.GetValidUntil().AsTime()
	if is.CheckValid() != nil {
		return 0, badPlan("invalid issued_at")
	}
	life := until.Sub(is.AsTime())
	switch {
	case life <= 0:
		return 0, fmt.Errorf("%w: valid until %v, issued %v", ErrExpiredPlan, until, is.AsTime())
	case life > maxPlanLifetime:
		return 0, badPlan("valid for %v, at most %v", life, maxPlanLifetime)
	}
	left := life
	if sa := p.GetSentAt(); sa != nil {
		// The life left at the send, on the leader's clock.
		if sa.CheckValid() != nil {
			return 0, badPlan("invalid sent_at")
		}
		age := sa.AsTime().Sub(is.AsTime())
		if age < 0 {
			return 0, badPlan("sent %v before it was issued", -age)
		}
		if left -= age; left <= 0 {
			return 0, fmt.Errorf("%w: sent %v after it was issued, with a maximum age of %v", ErrExpiredPlan, age, life)
		}
	} else if late := until.Add(skew).Sub(now); late < left {
		// No send stamp: bounded on this clock, with the skew allowance.
		if left = late; left <= 0 {
			return 0, fmt.Errorf("%w: issued %v with a maximum age of %v, now %v (beyond the clock-skew allowance of %v; if the leader's clock is behind this one's, fix the clocks or raise --max-clock-skew)",
				ErrExpiredPlan, is.AsTime(), life, now, skew)
		}
	}
	return left, nil
}

// addModelPlan validates one model's plan for region against t's ingress
// addresses and adds it to t.
func addModelPlan(t *RouteTable, mp *isobarpb.ModelPlan, region string) error {
	if mp.GetIngressRegion() != region {
		return badPlan("model plan for ingress %q sent to %s", mp.GetIngressRegion(), region)
	}
	m := mp.GetModel()
	if m == "" || len(m) > 256 {
		return badPlan("model name %q", trunc(m))
	}
	if _, dup := t.Models[m]; dup {
		return badPlan("model %s planned twice", m)
	}
	routes, err := planRoutes(t, "model "+m, mp.GetRoutes(), mp.GetShed(), region)
	if err != nil {
		return err
	}
	mr := ModelRoutes{Routes: routes, Shed: mp.GetShed()}
	if err := addSlices(t, &mr, m, mp.GetSlices(), region); err != nil {
		return err
	}
	t.Models[m] = mr
	return nil
}

// planRoutes validates one routing (a model's or a slice's, what names
// it) for region against t's ingress addresses: at most
// summary.MaxRegions routes, valid destinations listed once, fractions in
// [0,1] summing with shed to 1, every remote destination with an ingress
// address.
func planRoutes(t *RouteTable, what string, rs []*isobarpb.Route, shed float64, region string) (map[string]float64, error) {
	if len(rs) > summary.MaxRegions {
		return nil, badPlan("%s: %d routes, at most %d", what, len(rs), summary.MaxRegions)
	}
	if !fraction(shed) {
		return nil, badPlan("%s: shed %v not in [0,1]", what, shed)
	}
	routes, sum := map[string]float64{}, shed
	for _, r := range rs {
		d, f := r.GetDestination(), r.GetFraction()
		switch {
		case !summary.ValidName(d):
			return nil, badPlan("%s: destination %q", what, d)
		case !fraction(f):
			return nil, badPlan("%s: fraction to %s is %v; want [0,1]", what, d, f)
		case d != region && t.Ingress[d] == "":
			return nil, badPlan("%s: destination %s has no ingress address", what, d)
		}
		if _, dup := routes[d]; dup {
			return nil, badPlan("%s: destination %s listed twice", what, d)
		}
		routes[d] = f
		sum += f
	}
	if math.Abs(sum-1) > sumTolerance {
		return nil, badPlan("%s: routes and shed sum to %v, not 1", what, sum)
	}
	return routes, nil
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

// routesChange reports whether installing next after prev changes what
// the region pushes: the tables' routing (each model's routes, shed and
// pinned routes, the ingress addresses), or a blind shed, which the cycle
// orders by the demand it measured at the push (orderedShares), so each
// table that carries one is pushed as before. A leader's plan, or the
// fallback's table, arrives every summary interval with a new epoch,
// sequence and validity; the same routing in a new table pushes nothing
// (bench scale's live_pushes_per_s was 1.0 per hierarchical controller at
// every size, each a state build, for tables that changed nothing).
func routesChange(prev, next *RouteTable) bool {
	if prev == nil || next == nil {
		return prev != next
	}
	for _, mr := range next.Models {
		if !mr.Sliced && mr.Shed > 0 {
			return true
		}
	}
	return !maps.Equal(prev.Ingress, next.Ingress) || !reflect.DeepEqual(prev.Models, next.Models)
}

// ingressMoved reports whether the remote regions' ingress addresses,
// which the residency sets' routes use and gossip keeps (regionIngress),
// differ from those in the last offered state. It is looked at when a
// route table arrives, once a summary interval: a table that changes no
// routing pushes nothing, and an ingress that moved (a region that came
// back, healed, or moved its gateway) must still reach the data plane at
// that cadence. Loop-owned.
func (r *Registry) ingressMoved() bool {
	if r.regionIngress == nil || r.sets == nil {
		return false
	}
	return !maps.Equal(r.regionIngress(), r.sentIngress)
}
