package extproc

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
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

// largeCells is the size of the region TestPickerFollowsLargeRegion
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

// A picker follows a region of many cells: the EDS response, far above
// gRPC's default receive limit, is taken whole and every endpoint reaches
// the table (the gateway's half is gateway's
// TestDataPlanesFollowLargeRegion).
func TestPickerFollowsLargeRegion(t *testing.T) {
	n := largeCells()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{ContextClasses: []uint32{4096, 8192, 32768}}, largeRegion(n))
	all := func(tb *xdsclient.Table) bool {
		return tb != nil && len(tb.Clusters[xdscontract.ClusterName(model)].Endpoints) == n
	}
	// A generous deadline: decoding and checking the whole EDS is slow under
	// -race on a busy machine; this is no timing assert.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	begin := time.Now()
	p, err := New(Config{Gateway: gateway.Config{Controller: ctrl.addr, Region: "r1"}},
		Deps{Gateway: gateway.Deps{Logger: discardLogger(), DialOptions: insecureDial}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	if _, err := p.WaitForTable(ctx, all); err != nil {
		t.Fatalf("picker: %d endpoints not reached: %v", n, err)
	}
	t.Logf("picker: all %d endpoints after %v", n, time.Since(begin))
}
