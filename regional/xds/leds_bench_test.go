package xds

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// BenchmarkPushToDeltaClients times a cell's removal (every other op puts
// it back) from Push until each of k delta clients holds the change: the
// Builder, go-control-plane's caches computing each client's response,
// the wire and the client's apply. The clients are the independent
// deltaClient (the generated stream, Envoy's node kind, LEDS
// subscriptions as Envoy makes them). It is the part of a cell's death to
// its removal at an xDS client that follows the controller's cycle, at
// sizes bench scale cannot start on this machine.
func BenchmarkPushToDeltaClients(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, k := range []int{1, 4} {
			b.Run(fmt.Sprintf("endpoints=%d/clients=%d", n, k), func(b *testing.B) {
				benchPushToDeltaClients(b, n, k)
			})
		}
	}
}

func benchPushToDeltaClients(b *testing.B, n, k int) {
	// No log: at debug level the library's per-response lines would
	// cost more than what is timed.
	ts := startServerLogging(b, ledsConfig(), slog.New(slog.DiscardHandler))
	all := State{Models: []Model{fleet("m", n)}}
	less := State{Models: []Model{{Name: "m", Localities: []Locality{{Weight: 100,
		Endpoints: slices.Clone(all.Models[0].Localities[0].Endpoints[1:])}}}}}
	// The LbEndpoint resources each state is served as (one per endpoint
	// per collection: with a uniform fleet the main, local and class
	// clusters share theirs).
	lbs := func(st State) int {
		if _, err := ts.xds.Push(st); err != nil {
			b.Fatal(err)
		}
		return ts.xds.ledsKinds[0].cache.NumResources() // KindEnvoy's
	}
	lessN, allN := lbs(less), lbs(all)
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(xdscontract.MaxXDSMessageBytes(n))))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	cs := make([]*deltaClient, k)
	for i := range cs {
		cs[i] = newDeltaClient(b, conn, gatewayNode(fmt.Sprint("bench-", i)))
	}
	await := func(want int) {
		for _, c := range cs {
			deadline := time.After(time.Minute)
			for {
				c.mu.Lock()
				have, err := len(c.res[xdscontract.LbEndpointType]), c.err
				c.mu.Unlock()
				if err != nil {
					b.Fatal(err)
				}
				if have == want {
					break
				}
				select {
				case <-c.handled:
				case <-deadline:
					b.Fatalf("a delta client holds %d LbEndpoints after a minute, want %d", have, want)
				}
			}
		}
	}
	await(allN)
	b.Logf("%d LbEndpoints, %d with the cell", allN, lessN)
	var took []float64
	for i := 0; b.Loop(); i++ {
		st, want := all, allN
		if i%2 == 0 {
			st, want = less, lessN
		}
		t0 := time.Now()
		if _, err := ts.xds.Push(st); err != nil {
			b.Fatal(err)
		}
		await(want)
		took = append(took, float64(time.Since(t0))/1e6)
	}
	slices.Sort(took)
	b.ReportMetric(took[len(took)/2], "p50-ms")
	b.ReportMetric(took[len(took)*99/100], "p99-ms")
}
