package interop

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// judge is one independent xDS client: how to run it and what it is.
type judge struct {
	name string
	argv []string
	env  []string
}

// judges returns the xDS clients installed here, skipping t loudly for
// each one that is not.
func judges(t *testing.T) []judge {
	t.Helper()
	var out []judge
	if node, err := exec.LookPath("node"); err != nil {
		t.Log("INTEROP-SKIP: node not found (Debian nodejs); the grpc-js-xds judge does not run")
	} else if _, err := os.Stat(filepath.Join("node_modules", "@grpc", "grpc-js-xds")); err != nil {
		t.Log("INTEROP-SKIP: test/interop/node_modules lacks @grpc/grpc-js-xds (run npm ci in test/interop); the grpc-js-xds judge does not run")
	} else {
		out = append(out, judge{name: "grpc-js-xds", argv: []string{node, "xds_client.js"}})
	}
	py := pythonWithGRPC()
	if py == "" {
		t.Log("INTEROP-SKIP: no python3 with grpc (Debian python3-grpcio); the C-core judges do not run")
	} else {
		out = append(out,
			judge{name: "c-core", argv: []string{py, "xds_client.py"}},
			// C-core 1.51 reads Cluster.load_balancing_policy only with
			// this set (xds_cluster.cc, XdsCustomLbPolicyEnabled; on by
			// default from 1.55): without it, it runs the lb_policy enum,
			// unset here, which is ROUND_ROBIN. Both ways must ACK.
			judge{name: "c-core+custom-lb", argv: []string{py, "xds_client.py"}, env: []string{"GRPC_EXPERIMENTAL_XDS_CUSTOM_LB_CONFIG=true"}})
	}
	if len(out) == 0 {
		t.Skip("INTEROP-SKIP: no xDS judge installed")
	}
	return out
}

// pythonWithGRPC returns a python3 that imports grpc: ISOBAR_INTEROP_PYTHON,
// Debian's /usr/bin/python3, or the python3 on PATH.
func pythonWithGRPC() string {
	for _, p := range []string{os.Getenv("ISOBAR_INTEROP_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if exec.Command(p, "-c", "import grpc").Run() == nil {
			return p
		}
	}
	return ""
}

// bootstrap is a gRPC xDS bootstrap naming the controller at addr.
func bootstrap(addr, node string) string {
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": node, "cluster": "interop", "locality": map[string]any{"zone": "interop"}},
	})
	return string(b)
}

type event struct {
	ms      int64
	backend string
	err     string
}

// client is a running judge: its answered and failed RPCs arrive on ev.
type client struct {
	j  judge
	p  *proc
	ev chan event
}

const maxClientRPCs = 40000

func startClient(t *testing.T, j judge, xdsAddr string) *client {
	t.Helper()
	pr, pw := io.Pipe()
	env := append([]string{"GRPC_XDS_BOOTSTRAP_CONFIG=" + bootstrap(xdsAddr, "interop-"+j.name)}, j.env...)
	argv := append(append([]string(nil), j.argv...), "xds:///"+model, fmt.Sprint(maxClientRPCs), "240")
	c := &client{j: j, ev: make(chan event, maxClientRPCs+2)}
	c.p = start(t, j.name, env, pw, argv...)
	go func() { <-c.p.done; _ = pw.Close() }()
	go func() {
		defer close(c.ev)
		lines(pr, func(s string) {
			var v struct {
				MS      int64  `json:"ms"`
				Backend string `json:"backend"`
				Error   string `json:"error"`
				Done    bool   `json:"done"`
			}
			if json.Unmarshal([]byte(s), &v) != nil || v.Done {
				return
			}
			c.ev <- event{v.MS, v.Backend, v.Error}
		})
	}()
	return c
}

// next returns the judge's next RPC, failing t when the judge exits or
// nothing comes before the deadline.
func (c *client) next(t *testing.T, deadline time.Time) event {
	t.Helper()
	select {
	case e, ok := <-c.ev:
		if !ok {
			<-c.p.done
			t.Fatalf("%s exited (%v): %s", c.j.name, c.p.cmd.ProcessState, tail(c.p.out.String(), 3000))
		}
		return e
	case <-time.After(time.Until(deadline)):
		t.Fatalf("%s: no RPC result by the deadline", c.j.name)
	}
	return event{}
}

// split waits for the judge's first answered RPC (failures before it are
// the client loading its configuration; it fails t if there is none
// within a minute), then for an RPC to each of names, then counts the next
// n RPCs by backend. Any failure after the first answer fails t.
func (c *client) split(t *testing.T, names []string, n int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var lastErr string
	failures := 0
	for {
		e := c.next(t, deadline)
		if e.err == "" {
			break
		}
		failures++
		lastErr = e.err
		if time.Now().After(deadline.Add(-30 * time.Second)) {
			t.Fatalf("%s: no RPC answered in a minute; %d failed, the last with %q", c.j.name, failures, lastErr)
		}
	}
	seen := map[string]bool{}
	for len(seen) < len(names) {
		e := c.next(t, deadline)
		if e.err != "" {
			t.Fatalf("%s: RPC failed after the first answer: %s", c.j.name, e.err)
		}
		seen[e.backend] = true
	}
	counts := map[string]int{}
	for range n {
		e := c.next(t, deadline)
		if e.err != "" {
			t.Fatalf("%s: RPC failed after the first answer: %s", c.j.name, e.err)
		}
		counts[e.backend]++
	}
	return counts
}

// retried counts the judge's next n RPCs completed after since by
// backend ("error" for failed ones).
func (c *client) retried(t *testing.T, since time.Time, n int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	counts := map[string]int{}
	for seen := 0; seen < n; {
		e := c.next(t, deadline)
		if e.ms < since.UnixMilli() {
			continue // completed before b0 began to fail
		}
		seen++
		if e.err != "" {
			counts["error"]++
			t.Logf("RETRY-MISS %s: %s", c.j.name, e.err)
			continue
		}
		counts[e.backend]++
	}
	return counts
}

// stopsReceiving consumes the judge's RPCs from event time since until
// quiet answered RPCs in a row miss victim, and returns how long after
// since the last RPC reached victim (0: none did).
func (c *client) stopsReceiving(t *testing.T, victim string, since time.Time, quiet int) time.Duration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last int64
	run := 0
	for run < quiet {
		e := c.next(t, deadline)
		if e.ms < since.UnixMilli() {
			continue
		}
		if e.err != "" {
			t.Fatalf("%s: RPC failed while %s left: %s", c.j.name, victim, e.err)
		}
		if e.backend == victim {
			last, run = e.ms, 0
			continue
		}
		run++
	}
	if last == 0 {
		return 0
	}
	return time.Duration(last-since.UnixMilli()) * time.Millisecond
}

// degradedWant is what each judge does with an endpoint of EDS health
// DEGRADED. grpc-js-xds keeps only UNKNOWN and HEALTHY endpoints
// (xds-dependency-manager.ts, the lb_endpoints filter); C-core as measured.
var degradedWant = map[string]string{
	"grpc-js-xds":      "excluded",
	"c-core":           "excluded",
	"c-core+custom-lb": "excluded",
}

// degradedShare watches the judge's RPCs from since: "excluded after D"
// once quiet answered RPCs in a row miss victim, or "kept: N of M" when
// victim still gets RPCs through max RPCs.
func (c *client) degradedShare(t *testing.T, victim string, since time.Time, quiet, max int) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last int64
	run, seen, hits := 0, 0, 0
	for run < quiet && seen < max {
		e := c.next(t, deadline)
		if e.ms < since.UnixMilli() {
			continue
		}
		if e.err != "" {
			t.Fatalf("%s: RPC failed after %s turned DEGRADED: %s", c.j.name, victim, e.err)
		}
		seen++
		if e.backend == victim {
			last, run = e.ms, 0
			hits++
			continue
		}
		run++
	}
	if run >= quiet {
		d := time.Duration(0)
		if last > 0 {
			d = time.Duration(last-since.UnixMilli()) * time.Millisecond
		}
		return fmt.Sprintf("excluded after %v", d)
	}
	return fmt.Sprintf("kept: %d of %d RPCs", hits, seen)
}

// tolerance is the allowed |count - n·p| for one endpoint: 5 standard
// deviations of the binomial (n, p) — a false alarm about once in 1.7
// million checks — plus, under ring_hash, the spread of the endpoint's
// share of the ring: its arc is the sum of ringPoints·p arcs of a ring of
// ringPoints random points, whose share has variance about p/ringPoints
// (the arcs are near-exponential), scaled by n².
func tolerance(n int, p float64, ringPoints float64) float64 {
	v := float64(n) * p * (1 - p)
	if ringPoints > 0 {
		v += float64(n) * float64(n) * p / ringPoints
	}
	return 5 * math.Sqrt(v)
}

// ringMinSize is isobar's default ring_hash minimum_ring_size (xds.Config
// RingSize) — the clients build at least that many points.
const ringMinSize = 1024

// TestXDSJudges: for each --lb-policy, a real regional controller with
// four real cells serves the non-Go gRPC clients. Every resource must be
// ACKed by every client (a NACK anywhere fails), RPCs must split over the
// endpoints as the policy the client runs implies (binomial tolerance), a
// drained then a killed cell must stop receiving, and a cell published
// with EDS health DEGRADED (a thermal throttle on its GPU) must be handled
// as degradedWant says; the times are logged as "FIGURE".
func TestXDSJudges(t *testing.T) {
	suite(t)
	js := judges(t)
	for _, policy := range []string{"least_request", "round_robin", "ring_hash"} {
		t.Run(policy, func(t *testing.T) {
			began := time.Now()
			// phase logs each step's time from the start: a failure's
			// messages then say where a slow run spent its time.
			phase := func(what string) {
				t.Logf("PHASE %s %s at %v", policy, what, time.Since(began).Round(time.Millisecond))
			}
			f := startFleet(t, policy, 4)
			phase("fleet ready")
			names := []string{"b0", "b1", "b2", "b3"}
			ws, err := f.weights()
			if err != nil {
				t.Fatal(err)
			}
			var clients []*client
			for _, j := range js {
				if policy == "ring_hash" && strings.HasPrefix(j.name, "c-core") && knownRingHashCrash(t, f, j) {
					continue
				}
				clients = append(clients, startClient(t, j, f.ctrl))
			}
			phase("clients started")
			const n = 900
			for _, c := range clients {
				counts := c.split(t, names, n)
				phase("split measured: " + c.j.name)
				var sum float64
				for _, name := range names {
					sum += float64(ws[name])
				}
				for _, name := range names {
					// The Node and C-core clients run round_robin (under
					// wrr_locality) for least_request and round_robin:
					// endpoint weights are not used, the split is even.
					// ring_hash weighs the ring by endpoint weight.
					p, ring := 1/float64(len(names)), 0.0
					if policy == "ring_hash" {
						p, ring = float64(ws[name])/sum, ringMinSize
					}
					want, tol := float64(n)*p, tolerance(n, p, ring)
					if d := math.Abs(float64(counts[name]) - want); d > tol {
						t.Errorf("%s under %s: %s got %d of %d RPCs, want %.0f ± %.0f (weights %v)", c.j.name, policy, name, counts[name], n, want, tol, ws)
					}
				}
				t.Logf("SPLIT %s %s: %v of %d (weights %v)", policy, c.j.name, sortedCounts(counts), n, ws)
			}

			// Retries: the gRPC route retries UNAVAILABLE (num_retries 2).
			// With b0 failing every call, round robin's retry lands on
			// another endpoint, so no RPC fails. Under ring_hash a call's
			// attempts share its hash and endpoint, so it is not checked.
			if policy != "ring_hash" {
				failed0 := f.cells[0].backend.failed.Load()
				// An RPC completing after since was sent after the store.
				since := time.Now().Add(time.Millisecond)
				f.cells[0].backend.unavailable.Store(true)
				for _, c := range clients {
					// Without retries a quarter of the RPCs would fail. The
					// boundary is the client's completion time, so an RPC
					// in flight at the switch may still be answered by b0;
					// grpc-js-xds fails one RPC with b0's status in about
					// half the runs (not understood yet; logged as
					// RETRY-MISS), so up to 2 of 300 are let through.
					counts := c.retried(t, since, 300)
					if counts["error"] > 2 {
						t.Errorf("%s under %s: %d of 300 RPCs failed while b0 failed every call: the route's retry policy is not applied", c.j.name, policy, counts["error"])
					}
					t.Logf("RETRY %s %s: 300 RPCs while b0 failed every call: %s", policy, c.j.name, sortedCounts(counts))
				}
				phase("retries measured")
				f.cells[0].backend.unavailable.Store(false)
				if f.cells[0].backend.failed.Load() == failed0 {
					t.Errorf("under %s no attempt reached the failing b0: the retry check proved nothing", policy)
				}
			}

			drained := time.Now()
			f.drain(t, "cell-0")
			for _, c := range clients {
				d := c.stopsReceiving(t, "b0", drained, 300)
				t.Logf("FIGURE %s %s: drained cell-0 last reached %v after the drain call", policy, c.j.name, d)
			}
			phase("drain seen")
			killed := time.Now()
			f.cells[1].engine.kill()
			for _, c := range clients {
				d := c.stopsReceiving(t, "b1", killed, 300)
				t.Logf("FIGURE %s %s: cell-1's engine SIGKILLed, last RPC reached it %v after", policy, c.j.name, d)
			}
			phase("kill seen")
			// DEGRADED: a thermal throttle on cell-3's GPU makes the
			// controller publish it with EDS health DEGRADED.
			faultAt := time.Now()
			f.fault(t, f.cells[3], `{"fault":"throttle","severity":1,"lead":"1s"}`)
			poll(t, "cell-3 published DEGRADED", 60*time.Second, func() (bool, string) {
				d, err := f.degraded("cell-3")
				if err != nil {
					return false, err.Error()
				}
				return d, "not degraded"
			})
			t.Logf("FIGURE %s: cell-3 published DEGRADED %v after the throttle fault", policy, time.Since(faultAt))
			for _, c := range clients {
				got := c.degradedShare(t, "b3", faultAt, 300, 3000)
				t.Logf("DEGRADED %s %s: %s (from the fault)", policy, c.j.name, got)
				if want := degradedWant[c.j.name]; !strings.HasPrefix(got, want) {
					t.Errorf("%s under %s with cell-3 DEGRADED: %s, want %s", c.j.name, policy, got, want)
				}
			}
			phase("DEGRADED seen")
			checkAcked(t, f, len(clients))
		})
	}
}

// knownRingHashCrash runs C-core judge j alone under ring_hash. C-core
// 1.51 dies with SIGSEGV in its ring_hash picker on the first pick that
// starts a connection attempt (grpc/grpc#31766: a wrong cast in
// RingHash::Picker's SubchannelConnectionAttempter after the refactor of
// grpc/grpc#30714, fixed by grpc/grpc#32012 in 1.52). It reports true, with
// an INTEROP-KNOWN line, when j crashed that way after ACKing the
// Listener and Cluster without a NACK; false when j answered an RPC (a C-core
// without the bug: it then runs with the others). Anything else fails t.
func knownRingHashCrash(t *testing.T, f *fleet, j judge) bool {
	t.Helper()
	before := f.counter(t, "isobar_regional_xds_acks_total")
	c := startClient(t, j, f.ctrl)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case e, ok := <-c.ev:
			if ok && e.err == "" {
				c.p.stop()
				return false
			}
			if ok {
				continue
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s under ring_hash: neither an answer nor an exit in a minute", j.name)
		}
		break
	}
	<-c.p.done
	ws, _ := c.p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Fatalf("%s under ring_hash exited (%v), not the known SIGSEGV: %s", j.name, c.p.cmd.ProcessState, tail(c.p.out.String(), 3000))
	}
	after := f.counter(t, "isobar_regional_xds_acks_total")
	// It dies while applying the first ClusterLoadAssignment, before its
	// ACK leaves: listener and cluster must have been ACKed.
	for _, typ := range []string{"listener", "cluster"} {
		k := `type="` + typ + `"`
		if after[k] <= before[k] {
			t.Errorf("%s under ring_hash: crashed without ACKing %s (ACKs %v before, %v after)", j.name, typ, before, after)
		}
	}
	for labels, v := range f.counter(t, "isobar_regional_xds_nacks_total") {
		if v > 0 {
			t.Errorf("%s under ring_hash: NACK {%s}", j.name, labels)
		}
	}
	t.Logf("INTEROP-KNOWN: %s under ring_hash ACKed listener and cluster, then died with SIGSEGV in its ring_hash picker while applying the first ClusterLoadAssignment (grpc/grpc#31766, fixed in C-core 1.52); its split is not measured", j.name)
	return true
}

// checkAcked fails t on any NACK counted by the controller, and unless
// every resource type was ACKed at least once per client.
func checkAcked(t *testing.T, f *fleet, clients int) {
	t.Helper()
	nacks := f.counter(t, "isobar_regional_xds_nacks_total")
	for labels, v := range nacks {
		if v > 0 {
			t.Errorf("controller counted %v NACKs {%s}; its log says:\n%s", v, labels, grepLines(f.regional.out.String(), "rejected"))
		}
	}
	acks := f.counter(t, "isobar_regional_xds_acks_total")
	for _, typ := range []string{"listener", "cluster", "endpoint"} {
		if got := acks[`type="`+typ+`"`]; got < float64(clients) {
			t.Errorf("%s ACKs %v, want >= %d (one per client): %v", typ, got, clients, acks)
		}
	}
	t.Logf("ACKS %v NACKS %v", acks, nacks)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}
