package lb

import (
	"errors"
	"math"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		name    string
		want    Policy
		wantErr error
	}{
		{name: "round_robin", want: Policy{Algorithm: RoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}},
		{name: "ROUND_ROBIN", want: Policy{Algorithm: RoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}},
		{name: " least_request ", want: Policy{Algorithm: LeastRequest, ChoiceCount: 2, ActiveRequestBias: 1}},
		{name: "least_request_full_scan", want: Policy{Algorithm: LeastRequest, ChoiceCount: 2, FullScan: true, ActiveRequestBias: 1}},
		{name: "random", wantErr: ErrUnknownPolicy},
		{name: "maglev", wantErr: ErrUnknownPolicy},
		{name: "", wantErr: ErrUnknownPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePolicy(tt.name)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ParsePolicy(%q) error = %v, want %v", tt.name, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParsePolicy(%q) = %+v, want %+v", tt.name, got, tt.want)
			}
			if err == nil {
				if err := got.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
				// String names a parsable policy for the defaults.
				if back, err := ParsePolicy(got.String()); err != nil || back != got {
					t.Errorf("ParsePolicy(%q) = %+v, %v; want %+v", got.String(), back, err, got)
				}
			}
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	lr := DefaultPolicy(LeastRequest)
	with := func(f func(*Policy)) Policy { p := lr; f(&p); return p }
	tests := []struct {
		name    string
		p       Policy
		wantErr error
	}{
		{name: "least_request defaults", p: lr},
		{name: "choice_count 5", p: with(func(p *Policy) { p.ChoiceCount = 5 })},
		// Envoy's proto: choice_count uint32 gte 2.
		{name: "choice_count 1", p: with(func(p *Policy) { p.ChoiceCount = 1 }), wantErr: ErrInvalidPolicy},
		{name: "choice_count 0", p: with(func(p *Policy) { p.ChoiceCount = 0 }), wantErr: ErrInvalidPolicy},
		{name: "full scan ignores choice_count", p: with(func(p *Policy) { p.FullScan = true; p.ChoiceCount = 0 })},
		{name: "bias 0", p: with(func(p *Policy) { p.ActiveRequestBias = 0 })},
		{name: "bias 2.5", p: with(func(p *Policy) { p.ActiveRequestBias = 2.5 })},
		{name: "bias negative", p: with(func(p *Policy) { p.ActiveRequestBias = -0.5 }), wantErr: ErrInvalidPolicy},
		{name: "bias NaN", p: with(func(p *Policy) { p.ActiveRequestBias = math.NaN() }), wantErr: ErrInvalidPolicy},
		{name: "zero value", p: Policy{}, wantErr: ErrInvalidPolicy},
		{name: "unknown algorithm", p: Policy{Algorithm: 9}, wantErr: ErrInvalidPolicy},
		{name: "round robin ignores least-request fields", p: Policy{Algorithm: RoundRobin, ActiveRequestBias: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Validate(%+v) = %v, want %v", tt.p, err, tt.wantErr)
			}
			_, nbErr := NewBalancer(tt.p, 0)
			if !errors.Is(nbErr, tt.wantErr) {
				t.Errorf("NewBalancer error = %v, want %v", nbErr, tt.wantErr)
			}
		})
	}
}

func TestPolicyString(t *testing.T) {
	p := DefaultPolicy(LeastRequest)
	p.ChoiceCount = 3
	p.ActiveRequestBias = 0.5
	if got, want := p.String(), "least_request(choice_count=3,active_request_bias=0.5)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	p.FullScan = true
	if got, want := p.String(), "least_request_full_scan(active_request_bias=0.5)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
