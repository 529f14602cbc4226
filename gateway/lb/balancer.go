package lb

import (
	"fmt"
	"math"
)

// Rand is the random source of one pick. *math/rand/v2.Rand satisfies it.
// Values are used as Envoy uses Random::RandomGenerator::random(): reduced
// modulo a count.
type Rand interface {
	Uint64() uint64
}

// Active reports the requests in flight on a host (Envoy's per-host
// rq_active stat, which all workers share). host is an index into the
// weights given to Update. The caller owns the counts: it increments one
// when it sends a request to the picked host and decrements it when the
// request ends. An implementation read by several workers' goroutines must
// be safe for concurrent use (for example atomics).
type Active interface {
	Active(host int) uint64
}

// Counts is an Active over a plain slice, for single-goroutine callers.
type Counts []uint64

// Active returns c[host].
func (c Counts) Active(host int) uint64 { return c[host] }

var _ Active = Counts(nil)

// noActive stands in for a nil Active: no host has requests in flight.
type noActive struct{}

func (noActive) Active(int) uint64 { return 0 }

// Balancer is one Envoy worker thread's load balancer for one host set:
// RoundRobinLoadBalancer or LeastRequestLoadBalancer on EdfLoadBalancerBase
// (load_balancer_impl.cc), restricted to a single priority, no localities
// and no slow start.
//
// A Balancer is not safe for concurrent use: like Envoy's thread-local load
// balancer it belongs to one goroutine, which calls Update and Pick.
type Balancer struct {
	policy Policy
	// seed is EdfLoadBalancerBase::seed_, drawn once per load balancer.
	seed uint64

	weights []uint32 // the caller's weights, by host index, as of Update
	hosts   []int    // hosts with weight > 0, in index order: Envoy's host vector
	// rrIndex is RoundRobinLoadBalancer::rr_indexes_[source]: it starts at
	// seed and survives refreshes (rr_indexes_.insert does not overwrite).
	rrIndex uint64
	// edf is non-nil iff the weights of two or more hosts differ.
	edf *EDF

	active     Active            // the counts of the Update/Pick in progress
	weightFunc func(int) float64 // b.hostWeight, bound once
}

// NewBalancer returns a worker's balancer with no hosts; call Update before
// Pick. seed stands for the value Envoy draws from its random generator when
// it constructs the load balancer (seed_): the unweighted round-robin index
// starts at seed, and the EDF schedule is built as if uint32(seed) mod
// 429496729 picks had been made. The error wraps ErrInvalidPolicy.
func NewBalancer(p Policy, seed uint64) (*Balancer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	b := &Balancer{policy: p, seed: seed, rrIndex: seed}
	b.weightFunc = b.hostWeight
	return b, nil
}

// Policy returns the balancer's policy.
func (b *Balancer) Policy() Policy { return b.policy }

// Update is EdfLoadBalancerBase::refresh for the host set given by weights
// (host i has weight weights[i]; weight 0 means "not in the set"). Call it
// whenever the set or any weight changes; Envoy refreshes on every host
// membership, health or weight update. It discards the EDF schedule and, if
// the positive weights are not all equal and there are at least two hosts,
// builds a new one with the weights as they are now (for LeastRequest,
// including active, which may be nil for "all zero"). The round-robin index
// is kept, as in Envoy. weights is copied.
func (b *Balancer) Update(weights []uint32, active Active) {
	b.weights = append(b.weights[:0], weights...)
	b.hosts = b.hosts[:0]
	for i, w := range b.weights {
		if w > 0 {
			b.hosts = append(b.hosts, i)
		}
	}
	b.edf = nil
	// refresh(): skip the scheduler when hostWeightsAreEqual(hosts), and
	// (edf_lb_host_scheduler_init_fix) when there is at most one host.
	if len(b.hosts) <= 1 || b.weightsEqual() {
		return
	}
	b.active = active
	// createWithPicks(hosts, hostWeight, seed_): the uint64 seed_ is passed
	// to a uint32 parameter, so it is truncated first.
	b.edf = NewEDFWithPicks(b.hosts, b.weightFunc, uint32(b.seed))
	b.active = nil
}

// weightsEqual is hostWeightsAreEqual (load_balancer_impl.cc).
func (b *Balancer) weightsEqual() bool {
	first := b.weights[b.hosts[0]]
	for _, h := range b.hosts[1:] {
		if b.weights[h] != first {
			return false
		}
	}
	return true
}

// Weighted reports whether picks go through the EDF scheduler (the weights
// given to the last Update differ) rather than the unweighted pick.
func (b *Balancer) Weighted() bool { return b.edf != nil }

// Pick is EdfLoadBalancerBase::chooseHostOnce: it returns the index of the
// host for one request, or -1 and false when the set is empty.
//
// r is consumed exactly as Envoy consumes its random generator: one value
// first for the host source (priority) choice, whose result cannot matter
// with a single priority; then, for LeastRequest with equal weights,
// ChoiceCount values (N_CHOICES) or one value per tie met (FULL_SCAN).
// active is read for LeastRequest only; nil means no requests in flight.
func (b *Balancer) Pick(r Rand, active Active) (host int, ok bool) {
	_ = r.Uint64() // hostSourceToUse(context, random(false))
	if active == nil {
		active = noActive{}
	}
	if b.edf != nil {
		b.active = active
		host, ok = b.edf.PickAndAdd(b.weightFunc)
		b.active = nil
		return host, ok
	}
	if len(b.hosts) == 0 {
		return -1, false
	}
	if b.policy.Algorithm == RoundRobin {
		// unweightedHostPick: hosts_to_use[rr_indexes_[source]++ % size].
		i := b.rrIndex % uint64(len(b.hosts))
		b.rrIndex++
		return b.hosts[i], true
	}
	if b.policy.FullScan {
		return b.pickFullScan(r, active), true
	}
	return b.pickNChoices(r, active), true
}

// pickNChoices is unweightedHostPickNChoices: ChoiceCount uniform draws with
// replacement; a later draw replaces the candidate only if it has strictly
// fewer active requests, so ties go to the earliest draw.
func (b *Balancer) pickNChoices(r Rand, active Active) int {
	n := uint64(len(b.hosts))
	candidate := b.hosts[r.Uint64()%n]
	for c := uint32(1); c < b.policy.ChoiceCount; c++ {
		sampled := b.hosts[r.Uint64()%n]
		if active.Active(sampled) < active.Active(candidate) {
			candidate = sampled
		}
	}
	return candidate
}

// pickFullScan is unweightedHostPickFullScan: the host with the fewest
// active requests; among k hosts tied for fewest, reservoir sampling keeps
// each with probability 1/k, drawing random()%tied at every tie met.
func (b *Balancer) pickFullScan(r Rand, active Active) int {
	candidate := b.hosts[0]
	least := active.Active(candidate)
	var tied uint64 = 1
	for _, h := range b.hosts[1:] {
		a := active.Active(h)
		switch {
		case a < least:
			candidate, least, tied = h, a, 1
		case a == least:
			tied++
			if r.Uint64()%tied == 0 {
				candidate = h
			}
		}
	}
	return candidate
}

// hostWeight is RoundRobinLoadBalancer::hostWeight (the static weight) or
// LeastRequestLoadBalancer::hostWeight:
// weight / (active+1)^active_request_bias, with Envoy's special cases for a
// bias of exactly 1 (plain division) and 0 (static weight), and its guard
// against active+1 overflowing.
func (b *Balancer) hostWeight(host int) float64 {
	w := float64(b.weights[host])
	if b.policy.Algorithm != LeastRequest || b.policy.ActiveRequestBias == 0 {
		return w
	}
	var a uint64
	if b.active != nil {
		a = b.active.Active(host)
	}
	if a != math.MaxUint64 {
		a++
	}
	if b.policy.ActiveRequestBias == 1 {
		return w / float64(a)
	}
	return w / math.Pow(float64(a), b.policy.ActiveRequestBias)
}

// String describes the balancer's mode, for test failures and logs.
func (b *Balancer) String() string {
	mode := "unweighted"
	if b.edf != nil {
		mode = "edf"
	}
	return fmt.Sprintf("%v %s hosts=%d", b.policy, mode, len(b.hosts))
}
