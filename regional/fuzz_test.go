package regional

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// FuzzValidateHeartbeat decodes arbitrary bytes as a heartbeat, as the gRPC
// server would, and checks that validation never panics, never lets a
// non-finite or out-of-range signal through, and gives the same verdict
// on a stream that already validated another heartbeat's id and endpoint.
func FuzzValidateHeartbeat(f *testing.F) {
	good := heartbeat("a", "127.0.0.1:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
	good.Signals.ErrorRate = f64(0.01)
	good.Signals.TemperatureCelsius = f64(60)
	seed, _ := proto.Marshal(good)
	f.Add(seed)
	bad := proto.Clone(good).(*isobarpb.CellHeartbeat)
	bad.Signals.KvCacheUsage = f64(math.NaN())
	seed, _ = proto.Marshal(bad)
	f.Add(seed)
	badCap := proto.Clone(good).(*isobarpb.CellHeartbeat)
	badCap.Capability.PrefillTokensPerS, badCap.Capability.MaxNumSeqs = math.Inf(1), math.MaxUint32
	seed, _ = proto.Marshal(badCap)
	f.Add(seed)
	badRate := proto.Clone(good).(*isobarpb.CellHeartbeat)
	badRate.Signals.PrefixCacheHitRate = f64(1.5)
	seed, _ = proto.Marshal(badRate)
	f.Add(seed)
	f.Add([]byte{0x0a, 0x01, 0x61})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		var hb isobarpb.CellHeartbeat
		if proto.Unmarshal(data, &hb) != nil {
			return
		}
		// A stream's memo of its last valid id and endpoint never changes
		// a verdict (validMemo).
		err := validateHeartbeat(&hb, "r1")
		memo := validMemo{id: good.GetCellId(), endpoint: good.GetEndpoint()}
		if memoErr := validateHeartbeatOn(&hb, "r1", &memo); (memoErr == nil) != (err == nil) {
			t.Fatalf("verdict with a stream's memo %v, without %v", memoErr, err)
		}
		if err != nil {
			return
		}
		if hb.GetRegion() != "r1" || hb.GetSequence() == 0 {
			t.Fatalf("accepted %v", &hb)
		}
		if c := hb.GetCapability(); !(c.GetPrefillTokensPerS() >= 0 && c.GetPrefillTokensPerS() <= xdscontract.MaxPrefillTokensPerSecond) ||
			c.GetMaxNumSeqs() > maxNumSeqsLimit {
			t.Fatalf("accepted capability %v", c)
		}
		s := hb.GetSignals()
		if s == nil {
			return
		}
		for _, p := range []*float64{s.QueueDepth, s.Running, s.TtftP95Seconds, s.ErrorRate, s.KvCacheUsage,
			s.GpuUtil, s.VramUsed, s.SmActive, s.DramActive, s.PowerWatts, s.RequestRate, s.WindowRequests, s.PrefixCacheHitRate} {
			if p != nil && (math.IsNaN(*p) || math.IsInf(*p, 0) || *p < 0) {
				t.Fatalf("accepted bad signal %v", *p)
			}
		}
		for _, p := range []*float64{s.ErrorRate, s.KvCacheUsage, s.GpuUtil, s.VramUsed, s.SmActive, s.DramActive, s.PrefixCacheHitRate} {
			if p != nil && *p > 1.0001 {
				t.Fatalf("accepted fraction %v", *p)
			}
		}
		// What the registry keeps is within the shared bounds.
		clampSignals(s)
		for _, f := range signalFields(s) {
			if *f.v != nil && **f.v > f.max {
				t.Fatalf("signal %s = %v after clamping, above its bound %v", f.name, **f.v, f.max)
			}
		}
	})
}

// FuzzValidateReport decodes arbitrary bytes as a data-plane report:
// validation never panics, and an accepted report's counts are consistent.
func FuzzValidateReport(f *testing.F) {
	seed, _ := proto.Marshal(&isobarpb.DataPlaneReport{Node: "gw", Region: "r1", IntervalSeconds: 1,
		Endpoints: []*isobarpb.EndpointStats{{CellId: "a", Requests: 10, Errors: 1, Rejected: 2}},
		Demand:    []*isobarpb.ModelDemand{{Model: "m", Requests: 5, Shed: 1}}})
	f.Add(seed)
	f.Add([]byte{})
	overflow, _ := proto.Marshal(&isobarpb.DataPlaneReport{Node: "gw", Region: "r1", IntervalSeconds: 1,
		Endpoints: []*isobarpb.EndpointStats{{CellId: "a", Requests: 1, Errors: math.MaxUint64, Rejected: 2}}})
	f.Add(overflow)
	sliced, _ := proto.Marshal(sliceReport(&isobarpb.SliceDemand{Criticality: isobarpb.Criticality_CRITICALITY_CRITICAL, Residency: "home", Requests: 20},
		&isobarpb.SliceDemand{Criticality: 7, Residency: "x+y", Requests: 80, Shed: 3}))
	f.Add(sliced)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r isobarpb.DataPlaneReport
		if len(data) > 1<<16 || proto.Unmarshal(data, &r) != nil || validateReport(&r, "r1") != nil {
			return
		}
		limit := maxReportRequests(r.GetIntervalSeconds())
		for _, e := range r.GetEndpoints() {
			if e.GetErrors() > e.GetRequests() || e.GetRejected() > e.GetRequests()-e.GetErrors() || e.GetRequests() > limit {
				t.Fatalf("accepted %v", e)
			}
		}
		for _, d := range r.GetDemand() {
			if d.GetRequests() > limit { // the shared rate bound (summary.MaxRateRPS)
				t.Fatalf("accepted demand %v over %v s", d, r.GetIntervalSeconds())
			}
			var sum uint64
			for _, s := range d.GetSlices() {
				sum += s.GetRequests()
			}
			if len(d.GetSlices()) > maxReportSlices || sum > d.GetRequests() {
				t.Fatalf("accepted slices %v of %d requests", d.GetSlices(), d.GetRequests())
			}
		}
		if !(r.GetIntervalSeconds() > 0) {
			t.Fatalf("accepted interval %v", r.GetIntervalSeconds())
		}
	})
}
