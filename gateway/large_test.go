package gateway

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// largeRegion is one model served by n synthetic cells, each with the
// metadata a real cell publishes, every cell fitting all three context
// classes: the largest EDS per cell the controller builds with them.
func largeRegion(n int) xds.State {
	eps := make([]xds.Endpoint, n)
	for i := range eps {
		eps[i] = xds.Endpoint{
			CellID: fmt.Sprintf("cell-%05d", i), Host: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), Port: 8000,
			Weight: 100, ClassWeight: 90, MaxModelLen: 32768, PrefillTokensPerSecond: 12000, MaxNumSeqs: 256,
			RTT: 1200 * time.Microsecond, Jitter: 300 * time.Microsecond,
		}
	}
	return xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{{Region: "r1", Zone: "z1", Weight: 1000, Endpoints: eps}}}}}
}

// largeCells is the size of the region TestDataPlanesFollowLargeRegion
// serves: 3,000 cells by default, above what gRPC's default 4 MiB receive
// limit takes (~1.6 KB per cell), and the controller's whole default
// admission cap (10,000) with ISOBAR_LARGE_SNAPSHOT=1 (about a minute
// under -race on two cores; `make test-large`).
func largeCells() int {
	if os.Getenv("ISOBAR_LARGE_SNAPSHOT") != "" {
		return xdscontract.DefaultMaxCells
	}
	return 3000
}

// A gateway follows a region of many cells: the EDS response, far above
// gRPC's default receive limit, is taken whole and every endpoint reaches
// the table, and its size is exported against the limit. (The picker's
// half is gateway/extproc's TestPickerFollowsLargeRegion.)
func TestDataPlanesFollowLargeRegion(t *testing.T) {
	n := largeCells()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{ContextClasses: []uint32{4096, 8192, 32768}}, largeRegion(n))
	all := func(tb *xdsclient.Table) bool {
		return tb != nil && len(tb.Clusters[xdscontract.ClusterName(model)].Endpoints) == n
	}

	// A generous deadline: decoding and checking the whole EDS is slow under
	// -race on a busy machine; this is no timing assert.
	begin := time.Now()
	g := launchGateway(t, ctrl, Config{}, Deps{Logger: discardLogger()}, listen(t, "127.0.0.1:0"))
	tooLarge := func() bool { return g.metric(t, "isobar_gateway_xds_responses_too_large_total", nil) > 0 }
	eventually.True(t, 5*time.Minute, fmt.Sprintf("gateway: all %d endpoints (or a response too large)", n),
		func() bool { return all(g.Table()) || tooLarge() })
	if tooLarge() {
		t.Fatalf("gateway: the EDS stream broke on a response above the receive limit")
	}
	t.Logf("gateway: all %d endpoints after %v", n, time.Since(begin))
	size := g.metric(t, "isobar_gateway_xds_response_bytes", map[string]string{"type": "endpoint"})
	limit := g.metric(t, "isobar_gateway_xds_response_limit_bytes", nil)
	t.Logf("%d cells: EDS response %.1f MiB (%.0f bytes per cell), receive limit %.0f MiB", n, size/(1<<20), size/float64(n), limit/(1<<20))
	if size <= 4<<20 {
		t.Errorf("EDS response %v bytes: the test wants one above gRPC's default 4 MiB", size)
	}
	if limit != float64(xdscontract.MaxXDSMessageBytes(xdscontract.DefaultMaxCells)) {
		t.Errorf("receive limit %v, want the controller's default cap's %d", limit, xdscontract.MaxXDSMessageBytes(xdscontract.DefaultMaxCells))
	}
	// The controller's whole default cap fits, under the alert threshold.
	if full := size / float64(n) * xdscontract.DefaultMaxCells; full > xdsNearLimitFraction*limit {
		t.Errorf("a %d-cell region's EDS (%.1f MiB at this size per cell) is above %.0f%% of the receive limit", xdscontract.DefaultMaxCells, full/(1<<20), 100*xdsNearLimitFraction)
	}
	if tl := g.metric(t, "isobar_gateway_xds_responses_too_large_total", nil); tl != 0 {
		t.Errorf("%v responses too large", tl)
	}
}
