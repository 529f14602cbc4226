package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/chaos"
	"github.com/isobar-mesh/isobar/lab"
)

// startLab starts a fast lab with its admin API and returns a chaos client
// of it.
func startLab(t *testing.T) (*lab.Lab, *chaos.Client) {
	t.Helper()
	// The residency drill's pin (acme-eu to eu-west); the other drills'
	// loads name no tenant.
	l, err := lab.Start(context.Background(), lab.Config{Cells: 3, MaxTokens: 8, TimeScale: 0.05, Fast: true,
		NoTraffic: true, AdminListen: "127.0.0.1:0", ResidencyData: lab.DrillResidency(lab.DefaultRegions())}, lab.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	cert, key, ca := l.OperatorCredentials()
	c, err := chaos.NewClient(l.AdminAddr(), cert, key, ca)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return l, c
}

func quickOptions(t *testing.T) chaos.Options {
	o := chaos.Options{Before: time.Second, During: 2 * time.Second, After: time.Second, MaxWait: 60 * time.Second,
		Settle: 60 * time.Second, Load: chaos.LoadConfig{RPS: 8, MaxTokens: 8}}
	if testing.Verbose() {
		o.Progress = os.Stderr
	}
	return o
}

// TestDrillsAgainstLab runs every drill against one lab, in the order of
// the registry (each heals before the next), and checks each report
// against what the drill injected.
func TestDrillsAgainstLab(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole fleet")
	}
	_, client := startLab(t)
	r := &chaos.Runner{Fleet: client}
	// Timers of the fast lab (lab.Config.Fast): heartbeat 200 ms with a
	// TTL of 2 s, region TTL 2 s, lease 2 s.
	//
	// No check here is a wall-clock upper bound: on a loaded machine any
	// phase can take longer, and the figures belong in the drill report
	// (isobar chaos run writes them; -v prints the table). What the test
	// checks is that each fault was detected and rerouted at all (the
	// runner fails a drill that is not, within Options.MaxWait), that
	// traffic survived, and, for faults only a timer can reveal, that
	// detection came from that timer rather than from something faster:
	// a lower bound, which load can only lengthen. Those lower bounds sit
	// at half the timer, as a heartbeat or keep-alive delayed by load
	// moves the timer's start earlier than the injection.
	const (
		heartbeatTTL = 2 * time.Second
		regionTTL    = 2 * time.Second
		leaseTTL     = 2 * time.Second
	)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	check := map[string]func(t *testing.T, rep *chaos.Report){
		"kill-cell": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			observed(t, "reroute_at_ms", rep.RerouteAtMS)
			atLeast(t, "success.after", rep.Success.After, 0.99)
			atLeast(t, "success.during", rep.Success.During, 0.97)
		},
		"silent-cell": func(t *testing.T, rep *chaos.Report) {
			// Only the TTL can tell: detection is never much sooner.
			atLeast(t, "detect_ms", rep.DetectMS, ms(heartbeatTTL/2))
			atLeast(t, "success.during", rep.Success.During, 0.99) // the engine kept serving
		},
		"kill-region": func(t *testing.T, rep *chaos.Report) {
			atLeast(t, "detect_ms", rep.DetectMS, ms(regionTTL/2))
			observed(t, "reroute_at_ms", rep.RerouteAtMS)
			atLeast(t, "success.after", rep.Success.After, 0.99)
			if rep.Requests.FailedOver == 0 {
				t.Errorf("no request of the dead region's clients failed over to another ingress")
			}
		},
		"correlated": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			atLeast(t, "success.after", rep.Success.After, 0.99)
		},
		"partition": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			atLeast(t, "success.during", rep.Success.During, 0.99) // every region still serves its own clients
		},
		"brownout": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			atLeast(t, "success.during", rep.Success.During, 0.99)
		},
		"jitter": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			atLeast(t, "success.during", rep.Success.During, 0.99)
		},
		"telemetry-loss": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			atLeast(t, "success.during", rep.Success.During, 0.99)
		},
		"capability-mismatch": func(t *testing.T, rep *chaos.Report) {
			observed(t, "detect_ms", rep.DetectMS)
			observed(t, "reroute_at_ms", rep.RerouteAtMS)
			// The leak before the data plane learns the new length is a
			// race with the heartbeat (longer on a busy machine) and is
			// reported, not bounded here (bench paper measures it in
			// virtual time); after it, no long prompt may reach the cell.
			observed(t, "leak_rate", rep.LeakRate)
			if rep.LeakedAfterReroute != 0 {
				t.Errorf("%d long prompts reached the restarted cell after the data plane carried its max_model_len, want 0", rep.LeakedAfterReroute)
			}
		},
		"leader-kill": func(t *testing.T, rep *chaos.Report) {
			// Detection is lease-driven: the lease expires TTL after its
			// last keep-alive (renewed every TTL/3).
			atLeast(t, "detect_ms", rep.DetectMS, ms(leaseTTL/3))
			if rep.Lost != 0 {
				t.Errorf("leader-kill lost %d requests, want 0", rep.Lost)
			}
		},
		"etcd-loss": func(t *testing.T, rep *chaos.Report) {
			if rep.Lost != 0 {
				t.Errorf("etcd-loss lost %d requests, want 0", rep.Lost)
			}
		},
		// Static stability (docs/design.md §5.4): a restarted controller is
		// invisible to traffic. The drill itself fails on a 404 "no
		// route", on a data plane with fewer of its cells than before, or
		// on success below 99.9 %; these checks name each figure.
		"controller-restart":          staticStable,
		"controller-restart-blackout": staticStable,
		// Residency (issue 25): none of the pinned tenant's requests
		// reached an engine outside its region, by the engines' counters,
		// through every stage; unpinned traffic was served while the
		// region was lost.
		"residency": func(t *testing.T, rep *chaos.Report) {
			res := rep.Residency
			if res == nil {
				t.Fatal("no residency figures")
			}
			t.Logf("residency %+v", *res)
			if res.PinnedOutside != 0 || res.PinnedServedOutsideSeen != 0 {
				t.Errorf("pinned requests outside %v: %d at the engines, %d answered from outside; want 0", res.Allowed, res.PinnedOutside, res.PinnedServedOutsideSeen)
			}
			if len(res.Stages) != 3 {
				t.Fatalf("stages %d, want 3", len(res.Stages))
			}
			for _, sg := range res.Stages {
				if sg.PinnedOutside != 0 || sg.Pinned == 0 {
					t.Errorf("stage %s: %d pinned requests outside of %d sent, want 0 of some", sg.Name, sg.PinnedOutside, sg.Pinned)
				}
				if sg.Name == chaos.StageRegionLoss && (sg.UnpinnedOK == 0 || sg.Misanswered != 0) {
					t.Errorf("region loss: %d unpinned requests served, %d pinned misanswered: want some served, none misanswered", sg.UnpinnedOK, sg.Misanswered)
				}
			}
			atLeast(t, "success.after", rep.Success.After, 0.99)
		},
		"controller-rolling": func(t *testing.T, rep *chaos.Report) {
			staticStable(t, rep)
			if len(rep.Faults) != 3 {
				t.Errorf("rolling restart injected %d faults, want one per region (3)", len(rep.Faults))
			}
		},
	}
	var reports []*chaos.Report
	for _, d := range chaos.Drills() {
		t.Run(d.Name, func(t *testing.T) {
			o := quickOptions(t)
			if strings.HasPrefix(d.Name, "controller-") {
				o.During = 3 * time.Second // down a few seconds, as a rescheduled process
			}
			p := chaos.Params{}
			if d.Name == "jitter" {
				// Idle, the fast lab's RTTs spread about 12 ms over 5 s (its
				// emulated WAN jitter) and the drill detects the 20 ms
				// injection in seconds; busy, they spread 100 ms and more.
				rttNoiseOrSkip(t, client, 30)
			}
			rep, err := r.Run(context.Background(), d, p, o)
			if err != nil {
				t.Fatalf("%s: %v", d.Name, err)
			}
			reports = append(reports, rep)
			if !rep.Passed {
				t.Errorf("%s failed: %v", d.Name, rep.Failures)
			}
			if len(rep.Errors) > 0 {
				t.Logf("failed requests: %v", rep.Errors)
			}
			if rep.Requests.Before == 0 || rep.Requests.During == 0 || rep.Requests.After == 0 {
				t.Errorf("requests per phase %+v: want load in every phase", rep.Requests)
			}
			atLeast(t, "success.before", rep.Success.Before, 0.99)
			check[d.Name](t, rep)
		})
	}
	if testing.Verbose() {
		chaos.WriteTable(os.Stderr, reports)
	}
}

// staticStable checks a restart drill's static-stability figures: no
// request answered 404 "no route", no region's data plane on fewer of its
// cells than before, success during the drill at least 99.9 %.
func staticStable(t *testing.T, rep *chaos.Report) {
	t.Helper()
	t.Logf("requests during %d, no-route %d, success during %v, cells %+v", rep.Requests.During, rep.NoRoute,
		fmtFrac(rep.Success.During), rep.Cells)
	if rep.NoRoute != 0 {
		t.Errorf("%d requests answered 404 no route, want 0", rep.NoRoute)
	}
	if len(rep.Cells) != 3 {
		t.Errorf("cells tracked for %d regions, want 3", len(rep.Cells))
	}
	for name, c := range rep.Cells {
		if c.Before == 0 || c.Min < c.Before {
			t.Errorf("region %s: data plane cells before %d, fewest %d: want never fewer", name, c.Before, c.Min)
		}
	}
	atLeast(t, "success.during", rep.Success.During, 0.999)
}

func fmtFrac(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprintf("%.4f", *v)
}

// observed checks that the report measured v (the event happened).
func observed(t *testing.T, name string, v *float64) {
	t.Helper()
	if v == nil || *v < 0 {
		t.Errorf("%s = %v, want an observed, non-negative figure", name, v)
	}
}

func atLeast(t *testing.T, name string, v *float64, limit float64) {
	t.Helper()
	if v == nil {
		t.Errorf("%s is null, want >= %g", name, limit)
	} else if *v < limit {
		t.Errorf("%s = %g, want >= %g", name, *v, limit)
	}
}

var _ = errors.Is

// rttNoiseOrSkip samples the lab's gossip RTTs for 5 s (the EWMA moves
// with each probe) and skips the test when any region's RTT to a peer
// spreads wider than max ms: the jitter drill detects a 10 ms rise over a
// baseline sample, which such noise drowns. On an idle machine the fast
// lab's RTTs hold within about 12 ms and the drill runs (and can fail);
// on a busy 2-core machine under the race detector they were seen at
// 300 +/- 50 ms (70 ms idle), the same before and after issue 22's gossip
// changes.
func rttNoiseOrSkip(t *testing.T, c *chaos.Client, max float64) {
	t.Helper()
	lo, hi := map[string]float64{}, map[string]float64{}
	for i := 0; i < 10; i++ {
		if st, err := c.State(context.Background()); err == nil {
			for _, r := range st.Regions {
				for peer, ms := range r.RTTms {
					k := r.Name + ">" + peer
					if v, ok := lo[k]; !ok || ms < v {
						lo[k] = ms
					}
					if ms > hi[k] {
						hi[k] = ms
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond) // sampling a smoothed figure over time, not synchronising
	}
	for k, l := range lo {
		if spread := hi[k] - l; spread > max {
			t.Skipf("RTT noise: gossip RTT %s spread %.0f ms (%.0f-%.0f) over 5 s, more than %.0f ms: the jitter drill's 10 ms rise is not measurable on this machine now", k, spread, l, hi[k], max)
		}
	}
}
