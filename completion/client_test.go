package completion

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/xdscontract"
)

func TestClientSend(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(xdscontract.EndpointHeader, "local")
		w.Header().Set(xdscontract.RegionHeader, "a")
		switch r.URL.Path {
		case "/ok":
			if got := r.Header.Get(xdscontract.PromptTokensHeader); got != "7" {
				t.Errorf("prompt tokens header %q, want 7", got)
			}
			if c, tn := r.Header.Get(xdscontract.CriticalityHeader), r.Header.Get(xdscontract.TenantHeader); c != "critical" || tn != "acme" {
				t.Errorf("criticality %q tenant %q, want critical acme", c, tn)
			}
			w.Header().Set(xdscontract.UpstreamEndpointHeader, "remote")
			fmt.Fprint(w, "data: {\"x\":1}\n\n: comment\n\ndata: {\"x\":2}\n\ndata: [DONE]\n\n")
		case "/short":
			fmt.Fprint(w, "data: {\"x\":1}\n\n")
		default:
			http.Error(w, "  no route  ", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	c := Client{HTTP: srv.Client(), Clock: clockwork.NewFakeClock()}
	var seen []string
	res := c.Send(context.Background(), Request{URL: srv.URL + "/ok", Body: []byte(`{}`), PromptTokens: 7,
		Header: http.Header{xdscontract.CriticalityHeader: {"critical"}, xdscontract.TenantHeader: {"acme"}},
		OnData: func(d string) { seen = append(seen, d) }})
	if !res.OK || res.Err != nil || res.Status != 200 || res.Events != 2 || len(seen) != 2 || res.Endpoint != "remote" || res.Region != "a" {
		t.Errorf("ok stream: %+v, data %q", res, seen)
	}
	res = c.Send(context.Background(), Request{URL: srv.URL + "/short"})
	if res.OK || !errors.Is(res.Err, ErrIncomplete) || res.Events != 1 || res.Endpoint != "local" {
		t.Errorf("short stream: %+v", res)
	}
	res = c.Send(context.Background(), Request{URL: srv.URL + "/fail"})
	if res.OK || res.Err != nil || res.Status != http.StatusServiceUnavailable || res.Body != "no route" {
		t.Errorf("failed answer: %+v", res)
	}
	res = c.Send(context.Background(), Request{URL: "http://127.0.0.1:1/x"})
	if res.OK || res.Err == nil || res.Status != 0 {
		t.Errorf("refused: %+v", res)
	}
}
