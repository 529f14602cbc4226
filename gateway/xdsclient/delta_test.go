package xdsclient

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/regional/xds"
)

func startWatcher(t *testing.T, addr string, delta bool) *Watcher {
	t.Helper()
	w, err := NewWatcher(WatchConfig{Server: addr, Delta: delta, NodeID: fmt.Sprintf("gw-delta-%t", delta),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		WatchDeps{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// TestDeltaWatcherMatchesStateOfTheWorld: a Watcher on delta ADS, against
// a controller serving the LEDS layout and one serving the EDS layout,
// holds after every step of a churn of single endpoints exactly what a
// state-of-the-world Watcher holds.
func TestDeltaWatcherMatchesStateOfTheWorld(t *testing.T) {
	for _, leds := range []bool{true, false} {
		t.Run(fmt.Sprintf("leds=%t", leds), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			xs, err := xds.NewServer(xds.Config{Region: "r1", LEDS: leds}, xds.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			xs.Register(gs)
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(func() { xs.Stop(); gs.Stop() })
			weights := map[string]uint32{"a": 10, "b": 20}
			if _, err := xs.Push(state(weights)); err != nil {
				t.Fatal(err)
			}
			sotw := startWatcher(t, ln.Addr().String(), false)
			delta := startWatcher(t, ln.Addr().String(), true)
			for i, w := range []map[string]uint32{
				{"a": 10, "b": 20},         // initial
				{"a": 10, "b": 20, "c": 5}, // added
				{"a": 10, "c": 5},          // removed
				{"a": 11, "c": 5},          // weight
				{"a": 11},                  // removed again
			} {
				if i > 0 {
					if _, err := xs.Push(state(w)); err != nil {
						t.Fatal(err)
					}
				}
				waitWeights(t, sotw, w)
				eventually.True(t, 10*time.Second, fmt.Sprintf("step %d: the delta watcher to hold the SotW one's assignment", i), func() bool {
					d, ok := delta.Latest()
					s, _ := sotw.Latest()
					return ok && reflect.DeepEqual(d.Clusters, s.Clusters)
				})
			}
			if delta.Nacks() != 0 || sotw.Nacks() != 0 {
				t.Errorf("nacks: delta %d, sotw %d", delta.Nacks(), sotw.Nacks())
			}
		})
	}
}
