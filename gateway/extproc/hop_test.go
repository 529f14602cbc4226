package extproc

import (
	"net/http"
	"slices"
	"testing"

	filterpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// The picker applies the hop trust rule as the gateway does: a client's
// hop header is shed like any client request (and, when the request is
// let through, removed from Envoy's copy); a proven hop is picked a local
// endpoint unshed, its proof removed before Envoy sends it to the cell.
func TestPickerTrustsOnlyProvenHops(t *testing.T) {
	st, _ := threeEndpoints()
	for i := range st.Models {
		st.Models[i].Shed = 1
	}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	p := startPicker(t, ctrl, Config{Gateway: gateway.Config{HopKey: testHopKey}}, Deps{})
	hdr := func(extra map[string]string) map[string]string {
		out := map[string]string{xdscontract.DefaultModelHeader: model}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	call, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_NONE, headers: hdr(map[string]string{xdscontract.DefaultHopHeader: "r2"})})
	if err != nil {
		t.Fatal(err)
	}
	if ir := call.ans.immediate; ir == nil || ir.GetStatus().GetCode() != typepb.StatusCode_TooManyRequests {
		t.Errorf("client hop header: answer %+v, want the plan's immediate 429", call.ans)
	}
	call.finish(0)
	call, err = send(t, p.client, epRequest{mode: filterpb.ProcessingMode_NONE, headers: hdr(provenHop(t, "r2"))})
	if err != nil {
		t.Fatal(err)
	}
	if call.ans.immediate != nil || call.ans.dest == "" {
		t.Errorf("proven hop: answer %+v, want an endpoint picked", call.ans)
	}
	if !slices.Contains(call.ans.removes, xdscontract.HopAuthHeader) || slices.Contains(call.ans.removes, xdscontract.DefaultHopHeader) {
		t.Errorf("proven hop: removes %q, want the proof removed and the hop header kept", call.ans.removes)
	}
	call.finish(http.StatusOK)
	if n := metric(t, p.reg, "isobar_gateway_untrusted_hop_headers_total", map[string]string{"reason": "missing"}); n != 1 {
		t.Errorf("untrusted hops counted %v, want 1", n)
	}
}

// The picker reads the class headers as the gateway does (one function):
// "critical" is believed only from --trusted-sources (Envoy's
// source.address attribute) or a proven hop, and Envoy's copy of the
// request gets the canonical class headers.
func TestPickerClassTrust(t *testing.T) {
	st, _ := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	trusted, err := gateway.ParseTrustedSources("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, ctrl, Config{Gateway: gateway.Config{TrustedSources: trusted}}, Deps{})
	for _, tc := range []struct {
		name, source, crit, want string
	}{
		{"trusted source", "10.1.2.3:5555", "critical", "critical"},
		{"untrusted source", "203.0.113.5:1", "critical", "standard"},
		{"no source attribute", "", "critical", "standard"},
		{"self-demotion", "203.0.113.5:1", "Sheddable", "sheddable"},
		{"unknown value", "10.1.2.3:5555", "vip", "standard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_NONE, source: tc.source,
				headers: map[string]string{xdscontract.DefaultModelHeader: model, xdscontract.CriticalityHeader: tc.crit, xdscontract.TenantHeader: " acme "}})
			if err != nil {
				t.Fatal(err)
			}
			if call.ans.dest == "" {
				t.Fatalf("no pick: %+v", call.ans)
			}
			if got := call.ans.sets[xdscontract.CriticalityHeader]; got != tc.want {
				t.Errorf("criticality set to %q, want %q", got, tc.want)
			}
			if got := call.ans.sets[xdscontract.TenantHeader]; got != "acme" {
				t.Errorf("tenant set to %q, want the normalised acme", got)
			}
			call.finish(http.StatusOK)
		})
	}
}
