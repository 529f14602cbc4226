package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// TestLoadRecordsEnd: every outcome carries its end, after its start, and
// the stream's TTFT between the two — the phase split (in flight at the
// injection or not) depends on it.
func TestLoadRecordsEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	l := StartLoad(context.Background(), LoadConfig{RPS: 200, Model: "m", MaxRequests: 5},
		[]Ingress{{Region: "a", Addr: strings.TrimPrefix(srv.URL, "http://")}}, nil)
	// The count is checked below, after Stop.
	eventually.Wait(10*time.Second, func() bool { done, _ := l.Progress(); return done == 5 })
	os, _ := l.Stop()
	if len(os) != 5 {
		t.Fatalf("%d outcomes, want 5", len(os))
	}
	for _, o := range os {
		if !o.OK || o.End.IsZero() || o.End.Before(o.Start) || o.TTFT <= 0 || o.Start.Add(o.TTFT).After(o.End) {
			t.Errorf("outcome %+v: want OK with start <= start+TTFT <= end", o)
		}
	}
}
