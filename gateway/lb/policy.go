package lb

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Errors returned by ParsePolicy, Policy.Validate, NewBalancer and NewPool.
var (
	// ErrUnknownPolicy: the name is not one ParsePolicy knows. Check with
	// errors.Is(err, ErrUnknownPolicy).
	ErrUnknownPolicy = errors.New("lb: unknown policy")
	// ErrInvalidPolicy: a Policy field is out of range (choice count, active
	// request bias, algorithm) or the worker count is negative. Check with
	// errors.Is(err, ErrInvalidPolicy).
	ErrInvalidPolicy = errors.New("lb: invalid policy")
)

// Algorithm is an Envoy cluster lb_policy this package models.
type Algorithm uint8

const (
	// RoundRobin is Envoy's ROUND_ROBIN (round_robin_lb.h).
	RoundRobin Algorithm = iota + 1
	// LeastRequest is Envoy's LEAST_REQUEST (least_request_lb.cc).
	LeastRequest
)

// String is the snake_case name ParsePolicy accepts.
func (a Algorithm) String() string {
	switch a {
	case RoundRobin:
		return "round_robin"
	case LeastRequest:
		return "least_request"
	default:
		return fmt.Sprintf("Algorithm(%d)", uint8(a))
	}
}

// DefaultChoiceCount is LeastRequest.choice_count when unset.
const DefaultChoiceCount = 2

// DefaultActiveRequestBias is LeastRequest.active_request_bias when unset.
const DefaultActiveRequestBias = 1.0

// Policy configures a Balancer. Build one with DefaultPolicy or ParsePolicy
// and adjust fields; the zero value is invalid (no algorithm).
type Policy struct {
	// Algorithm: RoundRobin or LeastRequest.
	Algorithm Algorithm
	// ChoiceCount is LeastRequest's choice_count: how many hosts N_CHOICES
	// draws (with replacement) when all weights are equal. Default 2;
	// Envoy's API rejects values below 2 (proto rule uint32 gte 2), so
	// Validate does too. Ignored by RoundRobin and by FullScan.
	ChoiceCount uint32
	// FullScan selects LeastRequest's selection_method FULL_SCAN instead of
	// N_CHOICES: every host is compared and ties are broken uniformly by
	// reservoir sampling. Default false. Ignored by RoundRobin.
	FullScan bool
	// ActiveRequestBias is LeastRequest's active_request_bias: with unequal
	// weights a host's effective weight is weight/(active+1)^bias. Default
	// 1.0; 0 ignores active requests (weighted round robin). Must be >= 0
	// and not NaN. (Envoy logs and falls back to 1.0 on such a value; this
	// package refuses it.) Ignored by RoundRobin.
	ActiveRequestBias float64
}

// DefaultPolicy is Envoy's default configuration for a.
func DefaultPolicy(a Algorithm) Policy {
	return Policy{Algorithm: a, ChoiceCount: DefaultChoiceCount, ActiveRequestBias: DefaultActiveRequestBias}
}

// ParsePolicy maps a name to Envoy's defaults for it: "round_robin",
// "least_request" (N_CHOICES, choice_count 2, bias 1.0) or
// "least_request_full_scan". Case and surrounding space are ignored, so
// Envoy's enum spellings (ROUND_ROBIN, LEAST_REQUEST) work too. Any other
// name wraps ErrUnknownPolicy.
func ParsePolicy(name string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "round_robin":
		return DefaultPolicy(RoundRobin), nil
	case "least_request":
		return DefaultPolicy(LeastRequest), nil
	case "least_request_full_scan":
		p := DefaultPolicy(LeastRequest)
		p.FullScan = true
		return p, nil
	default:
		return Policy{}, fmt.Errorf("%w %q (want round_robin, least_request or least_request_full_scan)", ErrUnknownPolicy, name)
	}
}

// Validate reports, wrapping ErrInvalidPolicy, a field out of range.
func (p Policy) Validate() error {
	switch p.Algorithm {
	case RoundRobin:
		return nil
	case LeastRequest:
	default:
		return fmt.Errorf("%w: algorithm %v (want round_robin or least_request)", ErrInvalidPolicy, p.Algorithm)
	}
	if !p.FullScan && p.ChoiceCount < 2 {
		return fmt.Errorf("%w: choice_count %d, must be at least 2", ErrInvalidPolicy, p.ChoiceCount)
	}
	if math.IsNaN(p.ActiveRequestBias) || p.ActiveRequestBias < 0 {
		return fmt.Errorf("%w: active_request_bias %v, must be a number >= 0", ErrInvalidPolicy, p.ActiveRequestBias)
	}
	return nil
}

// String names the policy as ParsePolicy does, with any non-default
// setting in parentheses, e.g. "least_request(choice_count=3)".
func (p Policy) String() string {
	if p.Algorithm != LeastRequest {
		return p.Algorithm.String()
	}
	name := p.Algorithm.String()
	var opts []string
	if p.FullScan {
		name += "_full_scan"
	} else if p.ChoiceCount != DefaultChoiceCount {
		opts = append(opts, fmt.Sprintf("choice_count=%d", p.ChoiceCount))
	}
	if p.ActiveRequestBias != DefaultActiveRequestBias {
		opts = append(opts, fmt.Sprintf("active_request_bias=%g", p.ActiveRequestBias))
	}
	if len(opts) == 0 {
		return name
	}
	return name + "(" + strings.Join(opts, ",") + ")"
}
