// Package reqclass is the request-class contract: a request's criticality
// and tenant, spelled and bounded the same way by every part that reads
// them (the gateway and its picker, the lab, the bench, the planners).
//
// Criticality is what a request may lose under overload: sheddable
// requests are shed first, then standard ones; critical ones only when
// critical demand alone exceeds every capacity it may use. The Gateway API
// Inference Extension gives a request an objective (header
// x-gateway-inference-objective naming an InferenceObjective) whose integer
// priority orders requests, "higher value is more important"; llm-d's flow
// control and the Inference Extension treat a negative priority as
// sheddable (gateway-api-inference-extension, api/v1alpha2
// inferenceobjective_types.go, Priority; site-src/api-types/
// inferenceobjective.md). FromPriority maps priority < 0 to Sheddable, 0
// to Standard and > 0 to Critical: the third band is isobar's, the first
// two are theirs.
//
// A tenant is an opaque name a trusted client sends; it is bounded in
// length (MaxTenantLen) and, through Tenants, in how many distinct names a
// process tracks, so it can never grow a metric label or a map without
// bound. Tenants never leave the data plane: reports and summaries carry
// criticality and residency sets, never tenants.
//
// Everything here is a pure value or guarded by its own mutex (Tenants);
// no package state.
package reqclass

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Criticality orders requests under overload. The zero value is Critical;
// use Standard for a request that says nothing.
type Criticality uint8

// The criticalities, most important first.
const (
	Critical Criticality = iota
	Standard
	Sheddable
	// Count is the number of criticalities (array sizes).
	Count = 3
)

// ShedOrder lists the criticalities in the order a shortfall sheds them.
func ShedOrder() [Count]Criticality { return [Count]Criticality{Sheddable, Standard, Critical} }

// All lists the criticalities, most important first.
func All() [Count]Criticality { return [Count]Criticality{Critical, Standard, Sheddable} }

func names() [Count]string { return [Count]string{"critical", "standard", "sheddable"} }

// String is the criticality's header value and label: "critical",
// "standard" or "sheddable".
func (c Criticality) String() string {
	if int(c) < Count {
		return names()[c]
	}
	return "standard"
}

// Parse reads a criticality header value (case and surrounding space
// ignored). An empty value is Standard and ok; an unknown one is Standard
// and not ok (the caller counts it).
func Parse(s string) (c Criticality, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Standard, true
	}
	for i, n := range names() {
		if strings.EqualFold(s, n) {
			return Criticality(i), true
		}
	}
	return Standard, false
}

// FromPriority maps an Inference Extension objective priority: < 0
// Sheddable, 0 Standard, > 0 Critical.
func FromPriority(p int) Criticality {
	switch {
	case p < 0:
		return Sheddable
	case p > 0:
		return Critical
	}
	return Standard
}

// Proto is c on the wire.
func (c Criticality) Proto() isobarpb.Criticality {
	switch c {
	case Critical:
		return isobarpb.Criticality_CRITICALITY_CRITICAL
	case Sheddable:
		return isobarpb.Criticality_CRITICALITY_SHEDDABLE
	}
	return isobarpb.Criticality_CRITICALITY_STANDARD
}

// FromProto reads a wire criticality; unspecified and unknown values are
// Standard.
func FromProto(p isobarpb.Criticality) Criticality {
	switch p {
	case isobarpb.Criticality_CRITICALITY_CRITICAL:
		return Critical
	case isobarpb.Criticality_CRITICALITY_SHEDDABLE:
		return Sheddable
	}
	return Standard
}

// Lower returns the less important of a and b: what an untrusted source
// gets when it asks for a (it may demote itself, never promote).
func Lower(a, b Criticality) Criticality { return max(a, b) }

// MaxTenantLen bounds a tenant name in bytes; a longer one is truncated.
const MaxTenantLen = 64

// DefaultMaxTenants is how many distinct tenants a Tenants tracks by
// default before pooling the rest into OtherTenant.
const DefaultMaxTenants = 64

// OtherTenant is the pool of every tenant beyond a Tenants' bound, and
// the tenant of a request that names none (NoTenant aside).
const OtherTenant = "_other"

// NoTenant is the tenant of a request that names none.
const NoTenant = ""

// NormalizeTenant trims s and truncates it to MaxTenantLen bytes at a
// rune boundary. Control characters and invalid UTF-8 make the name
// unusable: it returns NoTenant and bad = true. truncated reports a cut.
func NormalizeTenant(s string) (t string, truncated, bad bool) {
	s = strings.TrimSpace(s)
	if !utf8.ValidString(s) {
		return NoTenant, false, true
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return NoTenant, false, true
		}
	}
	if len(s) > MaxTenantLen {
		cut := MaxTenantLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return s[:cut], true, false
	}
	return s, false, false
}

// Tenants bounds the tenants a process tracks: the first max distinct
// names keep their own bucket, every later one shares OtherTenant. Safe
// for concurrent use.
type Tenants struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

// NewTenants tracks at most max tenants (DefaultMaxTenants when max < 1).
func NewTenants(max int) *Tenants {
	if max < 1 {
		max = DefaultMaxTenants
	}
	return &Tenants{max: max, seen: make(map[string]struct{})}
}

// Bucket returns the bucket of tenant t: t itself while it is tracked or
// there is room to track it, OtherTenant otherwise. NoTenant stays
// NoTenant. pooled reports that t was pooled.
func (ts *Tenants) Bucket(t string) (bucket string, pooled bool) {
	if t == NoTenant || t == OtherTenant {
		return t, false
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if _, ok := ts.seen[t]; ok {
		return t, false
	}
	if len(ts.seen) < ts.max {
		ts.seen[t] = struct{}{}
		return t, false
	}
	return OtherTenant, true
}
