package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// A client that sends the hop header itself, with no proof, a forged one
// or a stale one, is routed, shed and counted in demand like any other
// client; only a request proven with the hop key is served as forwarded
// (never shed, not counted as this region's demand).
func TestClientHopHeaderIsShedAndCounted(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	st := oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096))
	st.Models[0].Shed = 1 // the plan refuses every client request
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{ReportInterval: time.Hour, HopKey: testHopKey}, Deps{})

	forged := hopAuth{key: []byte("another key, another key, another"), skew: time.Minute}.token("r2", time.Now())
	stale := hopAuth{key: testHopKey, skew: time.Minute}.token("r2", time.Now().Add(-time.Hour))
	cases := []struct {
		name    string
		headers map[string]string
		reason  string
	}{
		{"hop header alone", map[string]string{xdscontract.DefaultHopHeader: "r2"}, hopMissing},
		{"forged proof", map[string]string{xdscontract.DefaultHopHeader: "r2", xdscontract.HopAuthHeader: forged}, hopBadMAC},
		{"another region's proof", map[string]string{xdscontract.DefaultHopHeader: "r3", xdscontract.HopAuthHeader: provenHop(t, "r2")[xdscontract.HopAuthHeader]}, hopBadMAC},
		{"stale proof", map[string]string{xdscontract.DefaultHopHeader: "r2", xdscontract.HopAuthHeader: stale}, hopStale},
		{"garbage proof", map[string]string{xdscontract.DefaultHopHeader: "r2", xdscontract.HopAuthHeader: "v1.x.y"}, hopMalformed},
		{"proof alone", map[string]string{xdscontract.HopAuthHeader: provenHop(t, "r2")[xdscontract.HopAuthHeader]}, hopMissing},
	}
	const per = 10
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := g.metric(t, "isobar_gateway_untrusted_hop_headers_total", map[string]string{"reason": tc.reason})
			_, byStatus := g.spread(t, per, 2, model, 10, tc.headers)
			if byStatus[http.StatusTooManyRequests] != per {
				t.Errorf("statuses %v, want all %d shed by the plan as client requests", byStatus, per)
			}
			if d := g.metric(t, "isobar_gateway_untrusted_hop_headers_total", map[string]string{"reason": tc.reason}) - before; d != per {
				t.Errorf("untrusted hop headers (%s) counted %v times, want %d", tc.reason, d, per)
			}
		})
	}
	// A proven hop is served here, not shed.
	_, byStatus := g.spread(t, per, 2, model, 10, provenHop(t, "r2"))
	if byStatus[http.StatusOK] != per {
		t.Errorf("proven hop requests: statuses %v, want all %d served", byStatus, per)
	}
	g.Stop()
	_, demand, _ := ctrl.dp.totals()
	want := uint64(len(cases) * per)
	if d := demand[model]; d.GetRequests() != want || d.GetShed() != want {
		t.Errorf("demand %v, want %d requests, all shed: every unproven hop counts as a client's", d, want)
	}
}

// Without a hop key the gateway trusts no hop header, even a well-formed
// proof's.
func TestNoHopKeyTrustsNoHop(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	st := oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096))
	st.Models[0].Shed = 1
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{}, Deps{})
	if r := g.completion(t, model, 10, provenHop(t, "r2")); r.status != http.StatusTooManyRequests {
		t.Errorf("hop request to a gateway without a key: %d, want the plan's 429", r.status)
	}
	if n := g.metric(t, "isobar_gateway_untrusted_hop_headers_total", map[string]string{"reason": hopNoKey}); n != 1 {
		t.Errorf("no_key count %v, want 1", n)
	}
}

// A request forwarded to another region's ingress carries the hop header
// and a proof that region's gateway accepts; the client's own hop header
// never reaches the ingress.
func TestForwardedRequestsCarryProof(t *testing.T) {
	ing := startIngress(t)
	st := xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{
		{Region: "r2", Zone: "r2", Weight: 1000, Endpoints: []xds.Endpoint{endpointOf(t, "region/r2", ing.addr, 1, 0)}},
	}}}}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{HopKey: testHopKey}, Deps{})
	if r := g.completion(t, model, 10, map[string]string{xdscontract.DefaultHopHeader: "evil", xdscontract.HopAuthHeader: "v1.1.AAAA"}); r.status != http.StatusOK {
		t.Fatalf("forwarded request: %d %s", r.status, r.body)
	}
	_, hops := ing.counts()
	if hops["r1"] != 1 || len(hops) != 1 {
		t.Errorf("hop headers at the ingress %v, want r1 once", hops)
	}
	proofs := ing.proofList()
	if len(proofs) != 1 {
		t.Fatalf("proofs at the ingress %q, want one", proofs)
	}
	if why := (hopAuth{key: testHopKey, skew: time.Minute}).check("r1", proofs[0], time.Now()); why != "" {
		t.Errorf("the ingress would refuse the proof %q: %s", proofs[0], why)
	}
	if strings.Contains(proofs[0], "AAAA") {
		t.Errorf("the client's proof was passed on: %q", proofs[0])
	}
}

func TestHopProofCheck(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := hopAuth{key: testHopKey, skew: 2 * time.Minute}
	tok := h.token("eu", now)
	cases := []struct {
		name, region, proof string
		at                  time.Time
		want                string
	}{
		{"valid", "eu", tok, now, ""},
		{"valid within skew ahead", "eu", tok, now.Add(-119 * time.Second), ""},
		{"valid within skew behind", "eu", tok, now.Add(119 * time.Second), ""},
		{"stale", "eu", tok, now.Add(121 * time.Second), hopStale},
		{"from the future", "eu", tok, now.Add(-121 * time.Second), hopStale},
		{"other region", "us", tok, now, hopBadMAC},
		{"tampered time", "eu", strings.Replace(tok, "v1.1700000000.", "v1.1700000001.", 1), now, hopBadMAC},
		{"empty", "eu", "", now, hopMissing},
		{"no version", "eu", "1700000000.abc", now, hopMalformed},
		{"v2", "eu", "v2" + tok[2:], now, hopMalformed},
		{"short mac", "eu", "v1.1700000000.AAAA", now, hopMalformed},
		{"huge time", "eu", "v1.99999999999999999999." + strings.Repeat("A", 43), now, hopMalformed},
	}
	for _, tc := range cases {
		if got := h.check(tc.region, tc.proof, tc.at); got != tc.want {
			t.Errorf("%s: check = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := (hopAuth{}).check("eu", tok, now); got != hopNoKey {
		t.Errorf("no key: %q, want %q", got, hopNoKey)
	}
	if (hopAuth{}).token("eu", now) != "" {
		t.Error("a gateway without a key made a proof")
	}
}

// The proof check takes any header value without panicking, and accepts
// only the proof made for that region with the key, within the skew.
func FuzzHopProof(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	h := hopAuth{key: testHopKey, skew: 2 * time.Minute}
	f.Add("eu", h.token("eu", now))
	f.Add("eu", "v1.1700000000.")
	f.Add("", "v1..")
	f.Add("us", "v1.-1."+strings.Repeat("A", 43))
	f.Fuzz(func(t *testing.T, region, proof string) {
		got := h.check(region, proof, now)
		if got == "" && proof != h.token(region, now) {
			// The only other accepted proofs are those of other seconds
			// within the skew, made with the key.
			ok := false
			for d := -h.skew; d <= h.skew; d += time.Second {
				if proof == h.token(region, now.Add(d)) {
					ok = true
					break
				}
			}
			if !ok {
				t.Fatalf("accepted %q for region %q", proof, region)
			}
		}
	})
}
