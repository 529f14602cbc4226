package chaos

import (
	"github.com/isobar-mesh/isobar/adminapi"
	"testing"
	"time"
)

// TestMeasurePhases: a request in flight at the injection belongs to no
// phase (its failure is the unavoidable loss), requests between the heal
// and a healthy fleet count as lost but in no phase, and every failure is
// named with its phase.
func TestMeasurePhases(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t1, recovered, end := t0.Add(10*time.Second), t0.Add(12*time.Second), t0.Add(20*time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	os := []Outcome{
		{Start: at(-3), End: at(-2), OK: true, Status: 200, TTFT: 10 * time.Millisecond},
		{Start: at(-2), End: at(-1), OK: false, Status: 503, Error: "before"},
		{Start: at(-1), End: at(1), OK: false, Status: 200, Error: "unexpected EOF"}, // cut by the fault
		{Start: at(-0.5), End: at(0.5), OK: true, Status: 200},                       // in flight, survived
		{Start: at(1), End: at(2), OK: false, Status: 503, Error: "during", Cell: "a-cell-0", Ingress: "a"},
		{Start: at(2), End: at(3), OK: true, Status: 200, TTFT: 20 * time.Millisecond},
		{Start: at(11), End: at(11.5), OK: false, Status: 503, Error: "no route yet"}, // heal window
		{Start: at(13), End: at(14), OK: true, Status: 200, TTFT: 30 * time.Millisecond},
	}
	rep := &Report{}
	d := &Drill{Name: "test"}
	(&Runner{}).measure(rep, d, &target{}, os, marks{t0: t0, t1: t1, recovered: recovered, end: end, windowEnd: t0.Add(minRerouteWindow)})
	if rep.Requests.Before != 2 || rep.Requests.During != 2 || rep.Requests.After != 1 {
		t.Errorf("requests %+v: want before 2, during 2, after 1", rep.Requests)
	}
	if rep.Requests.InFlight != 2 || rep.Requests.InFlightFailed != 1 {
		t.Errorf("in flight %d (failed %d): want 2 (1)", rep.Requests.InFlight, rep.Requests.InFlightFailed)
	}
	if *rep.Success.Before != 0.5 || *rep.Success.During != 0.5 || *rep.Success.After != 1 {
		t.Errorf("success %v/%v/%v: want 0.5/0.5/1", *rep.Success.Before, *rep.Success.During, *rep.Success.After)
	}
	if rep.Lost != 2 {
		t.Errorf("lost %d: want 2 (during and heal window; not the one in flight)", rep.Lost)
	}
	for _, k := range []string{"before: HTTP 503: before", "in flight: HTTP 200: unexpected EOF", "during: HTTP 503 from a-cell-0 via a: during", "heal: HTTP 503: no route yet"} {
		if rep.Errors[k] != 1 {
			t.Errorf("errors %v: want %q once", rep.Errors, k)
		}
	}
}

// A drill's warm-up is in no phase: a request started before the
// baseline window (target.from) counts nowhere, failed or not.
func TestMeasureSkipsTheWarmUp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	os := []Outcome{
		{Start: at(-5), End: at(-4.9), OK: false, Status: 503, Error: "shed while the plan had not seen the load"},
		{Start: at(-2), End: at(-1.9), OK: true, Status: 200},
		{Start: at(1), End: at(1.1), OK: true, Status: 200},
	}
	rep := &Report{}
	(&Runner{}).measure(rep, &Drill{Name: "test"}, &target{from: at(-3)}, os,
		marks{t0: t0, t1: at(2), recovered: at(3), end: at(4), windowEnd: t0.Add(minRerouteWindow)})
	if rep.Requests.Before != 1 || *rep.Success.Before != 1 || len(rep.Errors) != 0 {
		t.Errorf("before %d at %v, errors %v: want the warm-up's failure nowhere", rep.Requests.Before, *rep.Success.Before, rep.Errors)
	}
}

// TestMeasureLeak: a long prompt started during the drill leaks when it
// reached a restarted cell or was refused with 400; only those started at
// or after the reroute count as leaked after it. Short prompts and the
// ones outside the drill never count.
func TestMeasureLeak(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tg := &target{faults: []adminapi.Fault{{Kind: adminapi.FaultMaxModelLen, MaxModelLen: 1024}}, cells: []string{"a-cell-0"}}
	os := []Outcome{
		{Start: at(-1), End: at(-0.5), Prompt: 4000, Cell: "a-cell-0", OK: true, Status: 200}, // before
		{Start: at(0.1), End: at(0.2), Prompt: 4000, Cell: "a-cell-0", Status: 400},           // leaked, before the reroute
		{Start: at(0.3), End: at(0.4), Prompt: 4000, Cell: "a-cell-1", OK: true, Status: 200}, // kept away
		{Start: at(0.5), End: at(0.6), Prompt: 500, Cell: "a-cell-0", OK: true, Status: 200},  // short: fits
		{Start: at(1.5), End: at(1.6), Prompt: 4000, Cell: "a-cell-0", OK: true, Status: 200}, // leaked after the reroute
		{Start: at(1.7), End: at(1.8), Prompt: 4000, Cell: "a-cell-2", OK: true, Status: 200}, // kept away
		{Start: at(11), End: at(11.5), Prompt: 4000, Cell: "a-cell-0", OK: true, Status: 200}, // after the heal
	}
	rep := &Report{}
	d := &Drill{Name: "leak", leak: true}
	m := marks{t0: t0, t1: at(10), recovered: at(10.5), end: at(20), windowEnd: at(2), rerouteAt: at(1)}
	(&Runner{}).measure(rep, d, tg, os, m)
	if rep.LeakRate == nil || *rep.LeakRate != 0.5 {
		t.Errorf("leak_rate %v: want 0.5 (2 of 4 long prompts during the drill)", rep.LeakRate)
	}
	if rep.LeakedAfterReroute != 1 {
		t.Errorf("leaked after the reroute %d: want 1", rep.LeakedAfterReroute)
	}
}
