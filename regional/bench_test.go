package regional

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// cycleBench is a registry of n Ready cells on an xDS server, for the
// cycle benchmarks.
type cycleBench struct {
	cfg   Config
	clock *clockwork.FakeClock
	xs    *xds.Server
	r     *Registry
	hbs   []*isobarpb.CellHeartbeat
	loads [2]float64
}

func newCycleBench(b testing.TB, n int) *cycleBench {
	return newCycleBenchXDS(b, n, xds.Config{Region: "r1", Zone: "r1"})
}

// newCycleBenchXDS is newCycleBench with an xDS server of config xc.
func newCycleBenchXDS(b testing.TB, n int, xc xds.Config) *cycleBench {
	return newCycleBenchFleet(b, n, xc, false)
}

// newCycleBenchFleet is newCycleBenchXDS whose cells' addresses, when
// scattered, do not follow the order of their ids (a fixed permutation),
// as in a real fleet, where names and addresses are unrelated: otherwise
// the endpoints the registry lists in id order come already sorted by
// address, and the xDS build's sort is skipped.
func newCycleBenchFleet(b testing.TB, n int, xc xds.Config, scattered bool) *cycleBench {
	cb := &cycleBench{cfg: DefaultConfig("r1"), clock: clockwork.NewFakeClock(), loads: [2]float64{1, 12}}
	xs, err := xds.NewServer(xc, xds.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(xs.Stop)
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	cb.xs = xs
	if cb.r, err = newRegistry(cb.cfg, cb.clock, slog.New(slog.DiscardHandler), m, xs.Push); err != nil {
		b.Fatal(err)
	}
	_, timed := b.(*testing.B)
	cb.r.auditAll = !timed // tests compare every untouched cell every cycle (touched.go)
	cb.hbs = make([]*isobarpb.CellHeartbeat, n)
	addr := func(i int) int { return i }
	if scattered {
		perm := rand.New(rand.NewPCG(1, 2)).Perm(n)
		addr = func(i int) int { return perm[i] }
	}
	for i := range cb.hbs {
		a := addr(i)
		cb.hbs[i] = heartbeat(fmt.Sprintf("cell-%05d", i), "10."+strconv.Itoa(a/62500)+"."+strconv.Itoa(a/250%250)+"."+strconv.Itoa(a%250)+":8000",
			isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		cb.r.applyHeartbeat(cb.clock.Now(), cb.hbs[i])
	}
	return cb
}

// step moves every cell's load, runs cycle i and pushes what it offered.
func (cb *cycleBench) step(b testing.TB, i int) {
	for j, hb := range cb.hbs {
		hb.Signals.QueueDepth = &cb.loads[(i+j)%2]
	}
	cb.clock.Advance(cb.cfg.Projection.MinInterval)
	now := cb.clock.Now()
	for _, c := range cb.r.cells {
		c.lastSeen = now
		cb.r.touch(c)
	}
	cb.cycle(b, now)
}

// cycle runs the registry's cycle at now and pushes what it offered.
func (cb *cycleBench) cycle(b testing.TB, now time.Time) {
	cb.r.cycle(now)
	cb.r.pub.mu.Lock()
	st := cb.r.pub.pending
	cb.r.pub.pending = nil
	cb.r.pub.mu.Unlock()
	if st == nil {
		b.Fatal("cycle did not offer a push")
	}
	if _, err := cb.xs.Push(*st); err != nil {
		b.Fatal(err)
	}
	cb.r.pub.spend(st) // as the publisher does after a push
}

// BenchmarkCycle measures one control cycle at N cells: score every cell,
// project weights, build and validate the xDS snapshot and set it in the
// cache. Weights follow slow facts, not load, so a cycle whose loads
// change pushes nothing; every iteration changes every cell's load (new
// signals for the scorer) and marks the routes new, which forces the full
// build and push of a cycle that does publish (the worst case).
func BenchmarkCycle(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("cells=%d", n), func(b *testing.B) {
			cb := newCycleBench(b, n)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				cb.r.routesNew = true
				cb.step(b, i)
			}
		})
	}
}

// BenchmarkCycleTypical measures the cycle most cycles are: every cell's
// load moves (new signals for the scorer), and one cell leaves or
// rejoins the load balancer (its stream turns suspect, then recovers), so
// one endpoint's weight changes and the cycle pushes.
func BenchmarkCycleTypical(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("cells=%d", n), func(b *testing.B) {
			cb := newCycleBench(b, n)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				cb.r.cells[cb.hbs[0].CellId].suspect = i%2 == 0
				cb.r.touch(cb.r.cells[cb.hbs[0].CellId])
				cb.step(b, i)
			}
		})
	}
}

// BenchmarkCycleHeartbeats measures the cycle as the controller runs it:
// every 100 ms (Projection.MinInterval), with heartbeats every 500 ms, so
// each cycle sees a new heartbeat (new load signals) from a fifth of the
// cells, and one cell changes band (a suspect flag), so the cycle pushes.
// As with the prober's defaults (a round a second, at most 1,000 cells a
// round: Config.ProbeMaxPerRound), every tenth cycle also takes 1,000
// cells' new round trips, and every cell has one, so each push places the
// cells (cycle.LocalPlacement); the cells' addresses are scattered
// (newCycleBenchFleet). Applying heartbeats and probes is ingest, not the
// cycle: it is left out of the timing. BenchmarkCycleTypical, where every
// cell's load changes every cycle, is the upper bound of the same cycle.
func BenchmarkCycleHeartbeats(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("cells=%d", n), func(b *testing.B) {
			cb := newCycleBenchFleet(b, n, xds.Config{Region: "r1", Zone: "r1"}, true)
			const every = 5       // heartbeat interval / cycle interval
			const probeEvery = 10 // probe interval / cycle interval
			const perRound = 1000 // Config.ProbeMaxPerRound's default
			seq := uint64(1)
			var took []float64 // each cycle's wall time, ms: the P50 and P99 reported
			probes := func(round, count int) {
				res := make([]probeResult, count)
				for k := range res {
					j := (round*perRound + k) % n
					// A LAN's round trip, moving by a few microseconds
					// per round as a smoothed estimate does.
					res[k] = probeResult{id: cb.hbs[j].CellId, ok: true,
						rtt: 300*time.Microsecond + time.Duration((round+j)%7)*time.Microsecond, jitter: 20 * time.Microsecond}
				}
				cb.r.apply(message{probes: res})
			}
			probes(0, n) // every cell probed once before the start
			beat := func(i int) time.Time {
				cb.clock.Advance(cb.cfg.Projection.MinInterval)
				now := cb.clock.Now()
				seq++
				for j := i % every; j < n; j += every {
					hb := heartbeat(cb.hbs[j].CellId, cb.hbs[j].Endpoint, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, seq)
					hb.Signals.QueueDepth = &cb.loads[(i/every+j)%2]
					cb.r.applyHeartbeat(now, hb)
				}
				if i%probeEvery == 0 {
					probes(i/probeEvery, min(perRound, n))
				}
				cb.r.cells[cb.hbs[0].CellId].suspect = i%2 == 0
				cb.r.touch(cb.r.cells[cb.hbs[0].CellId])
				return now
			}
			// The first cycles build everything (every cell is new): that
			// is the full push BenchmarkCycle measures, not the typical
			// cycle. A probe round's worth of cycles warms up.
			for i := range probeEvery {
				cb.cycle(b, beat(i))
			}
			b.ResetTimer()
			for i := probeEvery; b.Loop(); i++ {
				b.StopTimer()
				now := beat(i)
				b.StartTimer()
				t0 := time.Now()
				cb.cycle(b, now)
				took = append(took, float64(time.Since(t0))/1e6)
			}
			slices.Sort(took)
			b.ReportMetric(took[len(took)/2], "p50-ms")
			b.ReportMetric(took[len(took)*99/100], "p99-ms")
		})
	}
}

// BenchmarkHeartbeatIngest measures heartbeats accepted per second through
// the real gRPC service into the registry, from 200 concurrent cell streams
// on loopback (the sending side runs in the same process and shares the
// CPUs, so this understates what the server alone can take).
func BenchmarkHeartbeatIngest(b *testing.B) {
	const streams = 200
	cfg := DefaultConfig("r1")
	cfg.HTTPListen = "-"
	cfg.HeartbeatInterval = time.Hour // nothing expires during the run
	cfg.ProbeInterval, cfg.ProbeSteadyInterval = time.Hour, time.Hour
	// Each stream sends as fast as it can: this measures ingest, not the
	// per-stream rate limit (TestHeartbeatRateLimit covers that).
	cfg.Limits.HeartbeatRate, cfg.Limits.HeartbeatBurst = 1e12, 1<<30
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(cfg, Deps{Registerer: prometheus.NewRegistry(), GRPCListener: lis})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer c.Stop()
	// Bounded: a stream that cannot open or send fails the run.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ss := make([]isobarpb.CellRegistry_HeartbeatClient, streams)
	seqs := make([]uint64, streams)
	for i := range ss {
		// A connection per stream, as each cell has: one connection takes
		// at most grpcbounds.MaxConcurrentStreams (100) streams.
		conn, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if ss[i], err = isobarpb.NewCellRegistryClient(conn).Heartbeat(ctx); err != nil {
			b.Fatal(err)
		}
		hb := heartbeat(fmt.Sprintf("cell-%04d", i), fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250), isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		seqs[i] = 1
		if err := ss[i].Send(hb); err != nil {
			b.Fatal(err)
		}
		if _, err := ss[i].Recv(); err != nil { // first ack
			b.Fatal(err)
		}
	}
	// Read every stream's acks as a cell does: unread, they would fill
	// the stream's flow-control window and stop the server's handler, and
	// with it the sender (a deadlock past ~1,000 heartbeats a stream).
	for _, s := range ss {
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					return // the benchmark's context ended
				}
			}
		}()
	}
	base := testutil.ToFloat64(c.metrics.heartbeats)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	per := b.N/streams + 1
	for i := range ss {
		wg.Go(func() {
			hb := heartbeat(fmt.Sprintf("cell-%04d", i), fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250), isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
			for range per {
				seqs[i]++
				hb.Sequence = seqs[i]
				if err := ss[i].Send(hb); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := float64(per * streams)
	for testutil.ToFloat64(c.metrics.heartbeats)-base < total {
		if time.Since(start) > 2*time.Minute {
			b.Fatalf("only %v of %v heartbeats ingested", testutil.ToFloat64(c.metrics.heartbeats)-base, total)
		}
		time.Sleep(time.Millisecond) // waiting for the registry to drain its inbox, bounded above
	}
	el := time.Since(start)
	b.ReportMetric(total/el.Seconds(), "heartbeats/s")
}

// BenchmarkDeathToDeltaClient times a cell's death at N cells, from the
// registry marking the cell suspect (its heartbeat stream broke) until a
// delta xDS client holds an assignment without it: the cycle the death
// triggers, the push (LEDS) and the client's apply, over a real delta ADS
// stream on loopback to xdsclient.Watcher (the gateway's client, which
// bench scale times deaths with). The client runs in a child process (this
// test binary again, deathWatcher), as a data plane does: its heap and
// collections are not the controller's; it reports each change over its
// stdout. Left out: the stream's end reaching the controller (bench
// scale's figure includes it: a few ms) and the hop to the publisher's
// goroutine. bench scale cannot start 10,000 cells on two cores; this can.
// Every other iteration the cell comes back, and that is timed too.
func BenchmarkDeathToDeltaClient(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("cells=%d", n), func(b *testing.B) {
			cb := newCycleBenchXDS(b, n, xds.Config{Region: "r1", Zone: "r1", LEDS: true})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			g := grpc.NewServer()
			cb.xs.Register(g)
			go func() { _ = g.Serve(lis) }() // returns at Stop
			b.Cleanup(g.Stop)
			victim := cb.hbs[0].CellId
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), deathWatcherEnv+"="+lis.Addr().String()+" "+victim+" "+strconv.Itoa(n))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			in, err := cmd.StdinPipe() // closed at cleanup: the child exits
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				in.Close()
				_ = cmd.Wait() // the child exits when its stdin closes
			})
			lines := make(chan string, 16)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			expect := func(want string) {
				select {
				case l, ok := <-lines:
					if !ok || l != want {
						b.Fatalf("the client process said %q (open %v), want %q", l, ok, want)
					}
				case <-ctx.Done():
					b.Fatalf("the client process never said %q", want)
				}
			}
			cb.clock.Advance(cb.cfg.Projection.MinInterval)
			cb.cycle(b, cb.clock.Now())
			expect("ready")
			var took, ctrl []float64
			for i := 0; b.Loop(); i++ {
				dead := i%2 == 0
				cb.clock.Advance(cb.cfg.Projection.MinInterval)
				t0 := time.Now()
				cb.r.cells[victim].suspect = dead
				cb.r.touch(cb.r.cells[victim])
				cb.cycle(b, cb.clock.Now())
				t1 := time.Now()
				expect(fmt.Sprint("held ", !dead))
				took = append(took, float64(time.Since(t0))/1e6)
				ctrl = append(ctrl, float64(t1.Sub(t0))/1e6)
			}
			// ctrl: the cycle and the push, up to the LinearCache's
			// answer to the client's watch; the rest is the response's
			// way to the client process and its apply.
			slices.Sort(took)
			slices.Sort(ctrl)
			b.ReportMetric(took[len(took)/2], "p50-ms")
			b.ReportMetric(took[len(took)*99/100], "p99-ms")
			b.ReportMetric(ctrl[len(ctrl)/2], "ctrl-p50-ms")
			b.ReportMetric(ctrl[len(ctrl)*99/100], "ctrl-p99-ms")
		})
	}
}

// deathWatcherEnv set ("ADDR CELL N") makes this test binary
// BenchmarkDeathToDeltaClient's client process (TestMain): a delta
// xdsclient.Watcher on the ADS server at ADDR that prints "ready" once it
// holds N cells of model m, then "held true" or "held false" each time
// CELL comes or goes, until its stdin closes.
const deathWatcherEnv = "ISOBAR_BENCH_DEATH_WATCHER"

// deathWatcher is the client process (deathWatcherEnv); it returns the
// process's exit code.
func deathWatcher(arg string) int {
	var addr, victim string
	var n int
	if _, err := fmt.Sscan(arg, &addr, &victim, &n); err != nil {
		fmt.Fprintln(os.Stderr, "death watcher:", err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // EOF: the benchmark is done
		cancel()
	}()
	w, err := xdsclient.NewWatcher(xdsclient.WatchConfig{Server: addr, NodeID: "bench-death", Delta: true},
		xdsclient.WatchDeps{Logger: slog.New(slog.DiscardHandler), DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(xdscontract.MaxXDSMessageBytes(n)))}})
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "death watcher:", err)
		return 1
	}
	defer w.Stop()
	ready, held := false, false
	var seq uint64
	for {
		a, err := w.WaitFor(ctx, func(a xdsclient.Assignment) bool { return a.Seq > seq })
		if err != nil {
			return 0 // stdin closed
		}
		seq = a.Seq
		eps := a.Clusters[xdscontract.ClusterName("m")]
		has := slices.ContainsFunc(eps, func(e xdsclient.Endpoint) bool { return e.Cell == victim })
		switch {
		case !ready && len(eps) == n:
			ready, held = true, has
			fmt.Println("ready")
		case ready && has != held:
			held = has
			fmt.Println("held", has)
		}
	}
}
