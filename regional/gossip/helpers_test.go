package gossip

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// t0 is the base time of summaries built by tests.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// summary builds a valid summary with models models.
func summary(region, incarnation string, seq uint64, models int) *isobarpb.RegionSummary {
	s := &isobarpb.RegionSummary{
		Region:         region,
		Incarnation:    incarnation,
		Sequence:       seq,
		At:             timestamppb.New(t0.Add(time.Duration(seq) * time.Second)),
		IngressAddress: region + ".ingress:8443",
	}
	for i := range models {
		s.Models = append(s.Models, &isobarpb.ModelSummary{
			Model:          fmt.Sprintf("model-%03d-with-a-long-enough-name-to-matter", i),
			CellsReady:     3,
			CapacityRps:    33.3 + float64(i),
			LoadRps:        12.5,
			DemandRps:      14.25,
			PressureMin:    0.1,
			PressureMean:   0.4,
			PressureP90:    0.7,
			TtftP95Seconds: 0.61,
			ErrorRate:      0.001,
			KvHeadroom:     0.5,
			ContextClasses: []*isobarpb.ContextClass{
				{MaxTokens: 4096, Cells: 3, CapacityRps: 30},
				{MaxTokens: 32768, Cells: 1, CapacityRps: 3.3},
			},
			EngineLatencyMs: 250,
		})
	}
	return s
}

func mustMarshal(t testing.TB, s *isobarpb.RegionSummary) []byte {
	t.Helper()
	b, err := proto.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testWriter sends log lines to t.Log until the test ends.
type testWriter struct {
	t    *testing.T
	done atomic.Bool
	mu   sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done.Load() {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

// testLogger logs at info and above through t.Log (memberlist's lines are
// at debug and stay out).
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done.Store(true)
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// observed records every verdict a node's book reaches.
type observed struct {
	mu   sync.Mutex
	seen []observation
}

type observation struct {
	v   verdict
	raw []byte
}

func (o *observed) record(v verdict, raw []byte) {
	o.mu.Lock()
	o.seen = append(o.seen, observation{v, bytes.Clone(raw)})
	o.mu.Unlock()
}

// verdictFor returns the verdict reached for raw, if any yet.
func (o *observed) verdictFor(raw []byte) (verdict, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.seen {
		if bytes.Equal(s.raw, raw) {
			return s.v, true
		}
	}
	return "", false
}

type testNode struct {
	*Node
	reg *prometheus.Registry
	obs *observed
}

// startNode builds and starts a node on loopback with the local profile;
// it is stopped (with a leave) at cleanup unless the test stopped it.
func startNode(t *testing.T, cfg Config, deps Deps) *testNode {
	t.Helper()
	tn := newTestNode(t, cfg, deps)
	if err := tn.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return tn
}

func newTestNode(t *testing.T, cfg Config, deps Deps) *testNode {
	t.Helper()
	if cfg.Profile == "" {
		cfg.Profile = ProfileLocal
	}
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	reg := prometheus.NewRegistry()
	deps.Registerer = reg
	n, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	n.book.observe = obs.record
	t.Cleanup(n.Stop)
	return &testNode{Node: n, reg: reg, obs: obs}
}

func regional(region string, join ...string) Config {
	return Config{Role: RoleRegional, Region: region, IngressAddress: region + ".ingress:8443", Join: join}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, timeout, what, cond)
}

// sendRaw sends payload from one node to another as a memberlist user
// message over TCP, as a (possibly misbehaving) peer would.
func sendRaw(t *testing.T, from, to *testNode, payload []byte) {
	t.Helper()
	host, port, err := net.SplitHostPort(to.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	dst := &memberlist.Node{Name: to.Name(), Addr: net.ParseIP(host), Port: uint16(p)}
	if err := from.ml.Load().SendReliable(dst, payload); err != nil {
		t.Fatal(err)
	}
}

// awaitVerdict waits until n has judged raw and returns the verdict.
func awaitVerdict(t *testing.T, n *testNode, raw []byte) verdict {
	t.Helper()
	var v verdict
	waitFor(t, 5*time.Second, "verdict on a sent message", func() bool {
		var ok bool
		v, ok = n.obs.verdictFor(raw)
		return ok
	})
	return v
}

// heldSeq is the sequence of region's summary held by n, or 0.
func heldSeq(n *testNode, region string) uint64 {
	return n.Summaries()[region].Summary.GetSequence()
}

func member(n *testNode, name string) (Member, bool) {
	for _, m := range n.Members() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// suspicionBound is an upper bound on the time between a member's silent
// death and another member declaring it dead under mc with n members: a
// full probe round, the probe timeout, and memberlist's longest suspicion
// timeout (SuspicionMaxTimeoutMult × SuspicionMult × max(1, log10 n) ×
// ProbeInterval), with awareness allowed to stretch probes twice over.
func suspicionBound(mc *memberlist.Config, n int) time.Duration {
	scale := 1
	for x := n; x >= 10; x /= 10 {
		scale++
	}
	suspicion := time.Duration(mc.SuspicionMaxTimeoutMult*mc.SuspicionMult*scale) * mc.ProbeInterval
	return 2*(time.Duration(n)*mc.ProbeInterval+mc.ProbeTimeout) + suspicion
}

// nilMetrics is a node's instruments, registered nowhere.
func nilMetrics(t testing.TB) *metrics {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
