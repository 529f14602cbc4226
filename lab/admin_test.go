package lab

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/certs"
)

// TestAdminRefusesWithoutOperatorIdentity: the admin API answers only
// clients presenting an operator certificate from the lab's CA; every
// refusal is counted and says what to present.
func TestAdminRefusesWithoutOperatorIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet")
	}
	l, err := Start(context.Background(), Config{Regions: []string{"a"}, Cells: 2, TimeScale: 0.05, Fast: true,
		NoTraffic: true, AdminListen: "127.0.0.1:0"}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	opCert, opKey, ca := l.OperatorCredentials()
	base := "https://" + l.AdminAddr()

	client := func(cert, key string) *http.Client {
		tc, err := certs.ClientConfig(cert, key, ca, "")
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	get := func(c *http.Client, method, path, body string) (int, string, error) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error string `json:"error"`
		}
		if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil {
			return resp.StatusCode, e.Error, nil
		}
		return resp.StatusCode, string(b), nil
	}

	// No client certificate: 401 naming what to present.
	pool := client(opCert, opKey).Transport.(*http.Transport).TLSClientConfig.RootCAs
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}
	code, body, err := get(noCert, http.MethodPost, adminapi.PathInject, `{"kind":"kill-engine","region":"a","cells":[0]}`)
	if err != nil || code != http.StatusUnauthorized || !strings.Contains(body, "operator") {
		t.Errorf("no certificate: %d %q %v; want 401 naming the operator identity", code, body, err)
	}

	// A valid certificate of another kind (a cell's): 403.
	cellCert, cellKey, err := l.IssueCert("intruder", certs.CellURI("a", "a-cell-0"))
	if err != nil {
		t.Fatal(err)
	}
	code, body, err = get(client(cellCert, cellKey), http.MethodPost, adminapi.PathInject, `{"kind":"kill-engine","region":"a","cells":[0]}`)
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, certs.CellURI("a", "a-cell-0")) {
		t.Errorf("cell identity: %d %q %v; want 403 naming the peer", code, body, err)
	}

	// An operator certificate from another CA: the handshake fails.
	other, err := certs.NewCA(certs.CAConfig{CommonName: "not the lab"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fc, fk, err := other.IssueTo(dir, certs.Identity{Kind: certs.KindOperator, Name: "mallory"}.Leaf(nil, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.LoadX509KeyPair(fc, fk)
	if err != nil {
		t.Fatal(err)
	}
	forged := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13,
		// Present it whatever CAs the server asks for.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreign, nil }}}}
	if code, _, err := get(forged, http.MethodGet, adminapi.PathState, ""); err == nil {
		t.Errorf("operator certificate from a foreign CA answered %d, want a failed handshake", code)
	}

	// None of the refused requests did anything.
	if e := l.Regions()[0].Engines[0]; !e.Ready() {
		t.Errorf("engine a-cell-0 is %v after refused injections", e.State())
	}

	// The operator: state, a bad fault (400, named), and an injection.
	op := client(opCert, opKey)
	code, body, err = get(op, http.MethodGet, adminapi.PathState, "")
	if err != nil || code != http.StatusOK {
		t.Fatalf("operator state: %d %q %v", code, body, err)
	}
	var st adminapi.FleetState
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Regions) != 1 || len(st.Regions[0].Cells) != 2 {
		t.Fatalf("state %q: %v", body, err)
	}
	for in, want := range map[string]string{
		`{"kind":"kill-engine","region":"zz","cells":[0]}`: `no region "zz"`,
		`{"kind":"kill-engine","region":"a","cells":[7]}`:  "no cell 7",
		`{"kind":"explode"}`:                               `kind "explode"`,
		`{"kind":"kill-engine","bogus":1}`:                 "unknown field",
		`{"kind":"partition","region":"a"}`:                "supports",
	} {
		code, body, err := get(op, http.MethodPost, adminapi.PathInject, in)
		if err != nil || code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q %v; want 400 mentioning %q", in, code, body, err, want)
		}
	}
	code, body, err = get(op, http.MethodPost, adminapi.PathInject, `{"kind":"kill-engine","region":"a","cells":[0]}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("operator inject: %d %q %v", code, body, err)
	}
	if e := l.Regions()[0].Engines[0]; e.Ready() {
		t.Error("the operator's kill-engine did not kill the engine")
	}

	if _, err := l.AdminMetrics().Gather(); err != nil {
		t.Fatal(err)
	}
	m := l.admin.requests
	for result, want := range map[string]float64{"unauthenticated": 1, "forbidden": 1, "bad_request": 5, "ok": 2} {
		if got := testutil.ToFloat64(m.WithLabelValues(result)); got != want {
			t.Errorf("isobar_lab_admin_requests_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

func TestAdminNeedsMTLS(t *testing.T) {
	_, err := Start(context.Background(), Config{Regions: []string{"a"}, Insecure: true, AdminListen: "127.0.0.1:0"}, Deps{})
	if err == nil || !strings.Contains(err.Error(), "--admin-listen needs mTLS") {
		t.Fatalf("insecure lab with an admin API: %v", err)
	}
}
