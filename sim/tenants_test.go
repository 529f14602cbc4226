package sim

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// TestEngineCountsTenants: the engine counts every generate request that
// reaches it by its tenant header, whatever the answer; requests naming no
// tenant or an unusable one are not counted, a long name is truncated, the
// counts survive a restart, and the tenants are bounded.
func TestEngineCountsTenants(t *testing.T) {
	e := startEngine(t, tinyConfig(), Deps{})
	// A fresh connection per request: the restart closes the old ones.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	send := func(tenant, body string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url(e, "/v1/completions"), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if tenant != "" {
			req.Header.Set(xdscontract.TenantHeader, tenant)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ok := `{"prompt":"abcd","max_tokens":1}`
	send("acme-eu", ok)
	send(" acme-eu ", ok)
	send("beta", `{"prompt":`) // malformed: refused, still counted
	send("", ok)
	send("bad\xffname", ok) // invalid UTF-8: unusable
	long := strings.Repeat("t", reqclass.MaxTenantLen+10)
	send(long, ok)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	send("acme-eu", ok)
	got := e.TenantRequests()
	want := map[string]int64{"acme-eu": 3, "beta": 1, long[:reqclass.MaxTenantLen]: 1}
	if len(got) != len(want) {
		t.Errorf("tenant counts %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("tenant %q: %d requests, want %d (all: %v)", k, got[k], v, got)
		}
	}
	for i := range reqclass.DefaultMaxTenants + 5 {
		e.countTenant("t" + strings.Repeat("x", i%60) + string(rune('a'+i%26)))
	}
	if n := len(e.TenantRequests()); n > reqclass.DefaultMaxTenants+1 {
		t.Errorf("%d tenants tracked, want at most %d and the pool", n, reqclass.DefaultMaxTenants)
	}
	if e.TenantRequests()[reqclass.OtherTenant] == 0 {
		t.Errorf("no request pooled into %q past the bound", reqclass.OtherTenant)
	}
}
