package optimize

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

// checkReportRows asserts every row of a report adds up to 1 with its
// shed, in whole ShareUnits, zero shares left out.
func checkReportRows(t *testing.T, out Report) {
	t.Helper()
	for src, row := range out.Fractions {
		units := math.Round(out.Shed[src] / ShareUnit)
		for dst, f := range row {
			if f <= 0 {
				t.Errorf("%s→%s reported as %v; zero shares are left out", src, dst, f)
			}
			if u := f / ShareUnit; math.Abs(u-math.Round(u)) > 1e-6 {
				t.Errorf("%s→%s = %v is not a multiple of 1e-4", src, dst, f)
			}
			units += math.Round(f / ShareUnit)
		}
		if units != 1/ShareUnit {
			t.Errorf("row %s adds up to %v units of 1e-4, want 10000", src, units)
		}
	}
}

func TestNewReportWorkedExample(t *testing.T) {
	p, err := ParseInput([]byte(workedExampleJSON("1.0")))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	out := NewReport(p, pl, "latency", nil)
	checkReportRows(t, out)
	if bc := out.Fractions["b"]["c"]; bc*120 < 20 || bc*120 > 35 {
		t.Errorf("b→c = %v of 120 rps (%.1f rps), want about 20–35 rps", bc, bc*120)
	}
	if out.Fractions["a"]["a"] < 0.99 || out.Fractions["c"]["c"] != 1 {
		t.Errorf("a and c should stay (almost) local: %v", out.Fractions)
	}
	if !(out.CostMs < out.LocalOnlyCostMs) {
		t.Errorf("cost %v not below local-only %v", out.CostMs, out.LocalOnlyCostMs)
	}
	for name, limit := range map[string]float64{"a": 100, "b": 100, "c": 80} {
		if out.LoadRPS[name] > limit {
			t.Errorf("%s loaded %v above capacity %v", name, out.LoadRPS[name], limit)
		}
	}
	if out.Gap < 0 || out.Gap > 1e-6*out.CostMs {
		t.Errorf("gap %v", out.Gap)
	}
	if out.Policy != "latency" || out.Explain != nil {
		t.Errorf("policy %q explain %v", out.Policy, out.Explain)
	}
	// Field order is the JSON key order.
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, key := range []string{`"policy"`, `"fractions"`, `"shed"`, `"cost_ms"`, `"local_only_cost_ms"`, `"load_rps"`, `"iterations"`, `"gap"`} {
		at := bytes.Index(b, []byte(key))
		if at <= last {
			t.Fatalf("key %s out of order in %s", key, b)
		}
		last = at
	}
	if bytes.Contains(b, []byte(`"explain"`)) {
		t.Errorf("explain present without explanations: %s", b)
	}
}

func TestNewReportExplain(t *testing.T) {
	p, err := ParseInput([]byte(workedExampleJSON("1")))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := SolveLocalFirst(p, DefaultLocalFill)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ExplainLocalFirst(p, DefaultLocalFill, pl)
	if err != nil {
		t.Fatal(err)
	}
	out := NewReport(p, pl, "local-first", ex)
	checkReportRows(t, out)
	for region, verdict := range map[string]string{"a": VerdictLocal, "b": VerdictSpill, "c": VerdictLocal} {
		if e := out.Explain[region]; e.Verdict != verdict || e.Reason == "" {
			t.Errorf("%s: explanation %+v, want verdict %s", region, e, verdict)
		}
	}
}

// A down region has no row, no load and no shed.
func TestNewReportDown(t *testing.T) {
	p, err := ParseInput([]byte(`{"regions": [
	    {"name": "a", "demand_rps": 150, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "b", "demand_rps": 20, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "c", "demand_rps": 30, "capacity_rps": 100, "engine_latency_ms": 250, "down": true}],
	  "rtt_ms": {"a": {"b": 70, "c": 80}}}`))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := SolveLocalFirst(p, DefaultLocalFill)
	if err != nil {
		t.Fatal(err)
	}
	out := NewReport(p, pl, "local-first", nil)
	checkReportRows(t, out)
	if _, ok := out.Fractions["c"]; ok || out.LoadRPS["c"] != 0 || out.Shed["c"] != 0 {
		t.Errorf("down region c: row %v load %v shed %v", out.Fractions["c"], out.LoadRPS["c"], out.Shed["c"])
	}
	if out.Fractions["a"]["b"] == 0 {
		t.Errorf("a does not spill to b: %v", out.Fractions["a"])
	}
}

func TestRoundRow(t *testing.T) {
	for _, row := range [][]float64{
		{1, 0, 0},
		{1.0 / 3, 1.0 / 3, 1.0 / 3},
		{0.99256, 0.00744, 0},
		{0.00001, 0.00002, 0.99997},
		{0.5, 0.5000000001, 0},
		{0.2, 0.2, 0.2, 0.2, 0.2},
	} {
		units := roundRow(row)
		sum := 0
		for k, u := range units {
			sum += u
			if d := math.Abs(float64(u)*ShareUnit - row[k]); d > ShareUnit {
				t.Errorf("%v: entry %d rounded to %d units", row, k, u)
			}
			if row[k] == 0 && u != 0 {
				t.Errorf("%v: zero entry %d got %d units", row, k, u)
			}
		}
		if sum != 10000 {
			t.Errorf("%v rounds to %v, summing to %d units", row, units, sum)
		}
	}
}
