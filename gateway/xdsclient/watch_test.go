package xdsclient

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// xdsServer serves an xds.Server on addr ("127.0.0.1:0" for a new port).
func xdsServer(t *testing.T, addr string, st xds.State) (*grpc.Server, *xds.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	xs, err := xds.NewServer(xds.Config{Region: "r1"}, xds.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xs.Push(st); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	xs.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	return gs, xs, ln.Addr().String()
}

func state(weights map[string]uint32) xds.State {
	loc := xds.Locality{Region: "r1", Zone: "z1", Weight: 1}
	port := uint32(8000)
	for _, id := range []string{"a", "b", "c"} {
		if w, ok := weights[id]; ok {
			loc.Endpoints = append(loc.Endpoints, xds.Endpoint{CellID: id, Host: "127.0.0.1", Port: port, Weight: w, MaxModelLen: 4096})
		}
		port++
	}
	return xds.State{Models: []xds.Model{{Name: "m", Localities: []xds.Locality{loc}}}}
}

func waitWeights(t *testing.T, w *Watcher, want map[string]uint32) Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := w.WaitFor(ctx, func(a Assignment) bool {
		got := a.Weights()
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("weights %v never arrived; last %v", want, a.Weights())
	}
	return a
}

// The watcher decodes weights and metadata, and reconnects on its own when
// the control plane restarts.
func TestWatcherFollowsAndReconnects(t *testing.T) {
	gs, xs, addr := xdsServer(t, "127.0.0.1:0", state(map[string]uint32{"a": 10, "b": 20}))
	w, err := NewWatcher(WatchConfig{Server: addr, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		WatchDeps{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	a := waitWeights(t, w, map[string]uint32{"a": 10, "b": 20})
	eps := a.Clusters[xdscontract.ClusterName("m")]
	if len(eps) != 2 || eps[0].Address != "127.0.0.1:8000" || eps[0].MaxModelLen != 4096 || eps[0].Region != "r1" {
		t.Fatalf("decoded endpoints = %+v", eps)
	}

	// A weight change and a removal arrive.
	if _, err := xs.Push(state(map[string]uint32{"a": 5})); err != nil {
		t.Fatal(err)
	}
	waitWeights(t, w, map[string]uint32{"a": 5})

	// The control plane goes away and comes back on the same address with
	// a new state: the watcher keeps its last assignment meanwhile, then
	// follows the new one.
	xs.Stop()
	gs.Stop()
	if got, ok := w.Latest(); !ok || got.Weights()["a"] != 5 {
		t.Fatalf("assignment lost while the control plane was down: %v", got.Weights())
	}
	gs2, xs2, _ := xdsServer(t, addr, state(map[string]uint32{"a": 1, "b": 2, "c": 3}))
	defer gs2.Stop()
	defer xs2.Stop()
	waitWeights(t, w, map[string]uint32{"a": 1, "b": 2, "c": 3})
	if w.Nacks() != 0 {
		t.Errorf("nacks = %d", w.Nacks())
	}
}

func TestPickFollowsWeights(t *testing.T) {
	a := Assignment{Seq: 1, Clusters: map[string][]Endpoint{"c": {
		{Cell: "x", Weight: 1}, {Cell: "y", Weight: 3},
	}}}
	counts := map[string]int{}
	const n = 4000
	for i := range n {
		e, ok := Pick(a, (float64(i)+0.5)/n)
		if !ok {
			t.Fatal("no endpoint")
		}
		counts[e.Cell]++
	}
	if counts["x"] != 1000 || counts["y"] != 3000 {
		t.Fatalf("split %v, want 1000/3000", counts)
	}
	if _, ok := Pick(Assignment{}, 0.5); ok {
		t.Fatal("picked from an empty assignment")
	}
}

func TestNewWatcherErrors(t *testing.T) {
	creds := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	for _, tc := range []struct {
		cfg  WatchConfig
		deps WatchDeps
	}{
		{WatchConfig{}, WatchDeps{DialOptions: creds}},
		{WatchConfig{Server: "no-port"}, WatchDeps{DialOptions: creds}},
		{WatchConfig{Server: "127.0.0.1:1"}, WatchDeps{}},
	} {
		if _, err := NewWatcher(tc.cfg, tc.deps); err == nil {
			t.Errorf("NewWatcher(%+v) accepted", tc.cfg)
		}
	}
}
