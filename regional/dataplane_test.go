package regional

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// Data-plane reports give the region its ingress demand and the errors
// callers saw per cell; a cell failing at the data plane (connect errors the
// engine never counts) is penalised; bad reports are refused and counted.
func TestDataPlaneReports(t *testing.T) {
	c, _ := startController(t, func(cfg *Config) {
		cfg.DataPlaneWindow = time.Hour
		cfg.HeartbeatInterval = time.Hour // the cells stay Ready without more heartbeats
	})
	cl := dialController(t, c.Addr(), nil)
	for id, ep := range map[string]string{"a": "127.0.0.1:5001", "b": "127.0.0.1:5002"} {
		_ = openStream(t, cl).Send(heartbeat(id, ep, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
	}
	conn, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rs, err := isobarpb.NewDataPlaneClient(conn).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitCells := func(cond func(*View) bool) *View {
		t.Helper()
		var v *View
		if !eventually.Wait(5*time.Second, func() bool { v = c.Registry().View(); return cond(v) }) {
			t.Fatalf("view never matched: demand %v cells %+v", v.Demand, v.Cells)
		}
		return v
	}
	waitCells(func(v *View) bool { return len(v.Cells) == 2 })
	report := &isobarpb.DataPlaneReport{
		Node: "gw-1", Region: "r1", At: timestamppb.Now(), IntervalSeconds: 2,
		Endpoints: []*isobarpb.EndpointStats{
			{CellId: "a", Requests: 20},
			{CellId: "b", Requests: 20, Errors: 10},
			{CellId: "region/r2", Requests: 4},
			{CellId: "ghost", Requests: 1},
		},
		Demand: []*isobarpb.ModelDemand{{Model: "m", Requests: 30, Shed: 2}},
	}
	if err := rs.Send(report); err != nil {
		t.Fatal(err)
	}
	v := waitCells(func(v *View) bool {
		b, _ := v.Cell("b")
		return v.Demand["m"] > 0 && b.Weight.Trips > 0
	})
	if math.Abs(v.Demand["m"]-15) > 1e-9 {
		t.Errorf("demand = %v rps, want 30 requests / 2 s = 15", v.Demand["m"])
	}
	a, _ := v.Cell("a")
	b, _ := v.Cell("b")
	if a.Weight.Trips != 0 || b.Weight.Published >= a.Weight.Published {
		t.Errorf("a %+v b %+v: b's data-plane errors must penalise b only", a.Weight, b.Weight)
	}
	if got := testutil.ToFloat64(c.metrics.unknownCells); got != 1 {
		t.Errorf("unknown cells = %v, want 1 (ghost; region/r2 is a region ingress)", got)
	}

	bad := &isobarpb.DataPlaneReport{Node: "gw-1", Region: "r1", IntervalSeconds: 1,
		Endpoints: []*isobarpb.EndpointStats{{CellId: "a", Requests: 1, Errors: 5}}}
	_ = rs.Send(bad)
	ack, err := rs.Recv()
	if err != nil || !strings.Contains(ack.GetError(), "exceed") {
		t.Fatalf("bad report ack = %v, %v", ack, err)
	}
	wrong := &isobarpb.DataPlaneReport{Node: "gw-1", Region: "elsewhere", IntervalSeconds: 1}
	_ = rs.Send(wrong)
	if ack, err := rs.Recv(); err != nil || !strings.Contains(ack.GetError(), "region") {
		t.Fatalf("wrong region ack = %v, %v", ack, err)
	}
	if got := testutil.ToFloat64(c.metrics.reports.WithLabelValues("invalid")); got != 2 {
		t.Errorf("invalid reports = %v", got)
	}
}
