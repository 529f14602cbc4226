package regional

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

// FuzzPlanTable feeds planTable — the region's entry point for plans from
// the global leader — arbitrary encoded plans, against no table and
// against one in force. It must never panic, and a plan it accepts must
// yield a table the region can push: at most summary.MaxModels models,
// finite fractions in [0,1] summing with shed to 1, remote destinations
// with an ingress address, a newer epoch/sequence than the table in force,
// and a validity that ends after now and at most maxPlanLifetime later.
func FuzzPlanTable(f *testing.F) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	add := func(p *isobarpb.RoutingPlan) {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	add(testPlan(5, 3, now))
	skewed := testPlan(7, 1, now.Add(-time.Hour))
	add(skewed)
	noIssued := testPlan(6, 2, now)
	noIssued.IssuedAt = nil
	add(noIssued)
	long := testPlan(6, 2, now)
	long.ValidUntil = timestamppb.New(now.Add(1000 * time.Hour))
	add(long)
	for _, breaks := range []bool{false, true} {
		rp := residencyPlan(5, now, breaks) // as received by region r1, there seen from b
		rp.Plans[0].IngressRegion = "b"
		rp.Ingress = append(rp.Ingress, &isobarpb.RegionIngress{Region: "r1", Address: "127.0.0.1:9000"})
		add(rp)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		p := &isobarpb.RoutingPlan{}
		if proto.Unmarshal(b, p) != nil {
			return
		}
		cur, err := planTable(testPlan(5, 3, now), "b", nil, false, now, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*RouteTable{nil, cur} {
			tbl, err := planTable(p, "b", c, c != nil, now, 5*time.Second)
			if err != nil {
				if planResult(err) == "applied" {
					t.Fatalf("refusal %v reported as applied", err)
				}
				continue
			}
			if c != nil && (tbl.Epoch < c.Epoch || tbl.Epoch == c.Epoch && tbl.Sequence <= c.Sequence) {
				t.Fatalf("accepted epoch %d seq %d over %d/%d", tbl.Epoch, tbl.Sequence, c.Epoch, c.Sequence)
			}
			if !tbl.ValidUntil.After(now) || tbl.ValidUntil.Sub(now) > maxPlanLifetime {
				t.Fatalf("valid until %v with now %v", tbl.ValidUntil, now)
			}
			if len(tbl.Models) > summary.MaxModels {
				t.Fatalf("%d models", len(tbl.Models))
			}
			for m, mr := range tbl.Models {
				sum := mr.Shed
				for d, fr := range mr.Routes {
					if math.IsNaN(fr) || fr < 0 || fr > 1 {
						t.Fatalf("model %q: fraction %v to %q", m, fr, d)
					}
					if d != "b" && ingressAddress(tbl.Ingress[d]) != nil {
						t.Fatalf("model %q: destination %q without a valid ingress", m, d)
					}
					sum += fr
				}
				if math.Abs(sum-1) > 1e-6 {
					t.Fatalf("model %q sums to %v", m, sum)
				}
				checkPinnedRoutes(t, m, mr)
			}
		}
	})
}

// checkPinnedRoutes fails when an accepted plan's pinned slice routes a
// share outside its allowed regions or a fraction out of [0,1].
func checkPinnedRoutes(t *testing.T, m string, mr ModelRoutes) {
	t.Helper()
	for key, pr := range mr.Pinned {
		allowed := strings.Split(key, ",")
		for d, fr := range pr.Routes {
			if math.IsNaN(fr) || fr < 0 || fr > 1 || (fr > 0 && !slices.Contains(allowed, d)) {
				t.Fatalf("model %q: pinned [%s] routes %v to %q", m, key, fr, d)
			}
		}
	}
}
