package lab

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/xdscontract"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// Every failure a client can see gets its own cause, and a plan's 429 is
// told apart from saturation and from every other error.
func TestClassify(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name   string
		err    error
		status int
		h      http.Header
		want   string
	}{
		{"plan shed", nil, 429, hdr(xdscontract.ShedHeader, "plan"), CauseShedByPlan},
		{"saturated", nil, 429, hdr(xdscontract.ShedHeader, "saturated"), CauseSaturated},
		{"engine 429 (no shed header)", nil, 429, hdr(xdscontract.EndpointHeader, "c1"), CauseEngineError},
		{"engine 400", nil, 400, hdr(xdscontract.EndpointHeader, "c1"), CauseEngineError},
		{"remote engine 500", nil, 500, hdr(xdscontract.UpstreamEndpointHeader, "c9"), CauseEngineError},
		{"no route", nil, 404, hdr(), CauseGatewayError},
		{"queue expired", nil, 429, hdr(xdscontract.ShedHeader, "queue_expired"), CauseQueue},
		{"residency full", nil, 503, hdr(xdscontract.ShedHeader, "residency"), CauseResidency},
		{"no healthy upstream", nil, 503, hdr(), CauseGatewayError},
		{"gateway timeout", nil, 504, hdr(), CauseTimeout},
		{"connection refused", errors.New("dial tcp: connection refused"), 0, nil, CauseTransport},
		{"deadline", fmt.Errorf("post: %w", context.DeadlineExceeded), 0, nil, CauseTimeout},
		{"net timeout", timeoutErr{}, 0, nil, CauseTimeout},
	} {
		if got := classify(tc.err, tc.status, tc.h); got != tc.want {
			t.Errorf("%s: classify = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The summary counts every arrival (client drops included) and each
// failure under its cause; the report's "shed" is the plan's sheds.
func TestSummaryFailuresByCause(t *testing.T) {
	os := []Outcome{{OK: true}, {OK: true}, {Cause: CauseShedByPlan}, {Cause: CauseShedByPlan},
		{Cause: CauseEngineError}, {Cause: CauseClientDrop}, {Cause: CauseTimeout}, {Cause: CauseGatewayError},
		{Cause: CauseTransport}, {Cause: CauseSaturated}, {Cause: CauseQueue}, {Cause: CauseResidency}}
	s := summarise(os)
	want := Failures{ShedByPlan: 2, Saturated: 1, Queue: 1, Residency: 1, EngineError: 1, GatewayError: 1, TransportError: 1, Timeout: 1, ClientDrop: 1}
	if s.Requests != 12 || s.Succeeded != 2 || s.Failures != want || s.Failures.Total() != 10 {
		t.Fatalf("summary %+v, want 12 requests, 2 ok, failures %+v", s, want)
	}
	if s.SuccessRate != 2.0/12 {
		t.Errorf("success rate %v, want 0.2", s.SuccessRate)
	}
	if str := s.Failures.String(); !strings.HasPrefix(str, "shed_by_plan 2, saturated 1, queue 1, residency 1, engine_error 1") {
		t.Errorf("String() = %q", str)
	}
	if (Failures{}).String() != "none" {
		t.Errorf("no failures: %q", Failures{}.String())
	}
	if len(Causes()) != 9 {
		t.Errorf("Causes() = %v", Causes())
	}
}
