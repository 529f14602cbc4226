package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
)

// Endpoint is one endpoint of a cluster as the control plane assigned it.
type Endpoint struct {
	Cell           string
	Address        string // host:port
	Weight         uint32
	Region, Zone   string
	LocalityWeight uint32
	Priority       uint32
	MaxModelLen    uint32
}

// Assignment is the latest set of ClusterLoadAssignments, by cluster name.
// Immutable once published.
type Assignment struct {
	Clusters map[string][]Endpoint
	// Seq counts updates received (1 for the first).
	Seq uint64
	// At is when it was received (injected clock).
	At time.Time
}

// Weights flattens the assignment to cell id → endpoint weight.
func (a Assignment) Weights() map[string]uint32 {
	out := map[string]uint32{}
	for _, eps := range a.Clusters {
		for _, e := range eps {
			out[e.Cell] = e.Weight
		}
	}
	return out
}

// WatchConfig configures a Watcher.
type WatchConfig struct {
	// Server is the regional controller's gRPC (ADS) address. Required.
	Server string
	// NodeID identifies this data plane to the control plane. Default
	// "isobar-gateway".
	NodeID string
	// MinBackoff and MaxBackoff bound the jittered exponential reconnect
	// backoff. Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
}

// WatchDeps are the Watcher's collaborators.
type WatchDeps struct {
	Clock  clockwork.Clock
	Logger *slog.Logger
	// DialOptions for the gRPC connection (credentials). Required: pass
	// insecure credentials explicitly when TLS is off.
	DialOptions []grpc.DialOption
}

// Watcher subscribes to ClusterLoadAssignments over ADS and keeps the latest.
type Watcher struct {
	cfg   WatchConfig
	clock clockwork.Clock
	log   *slog.Logger
	opts  []grpc.DialOption

	mu      sync.Mutex
	latest  Assignment
	changed chan struct{}
	nacks   int

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	done                chan struct{}
}

// NewWatcher validates cfg and returns a Watcher; it connects on Start.
func NewWatcher(cfg WatchConfig, deps WatchDeps) (*Watcher, error) {
	if cfg.Server == "" {
		return nil, errors.New("gateway: watch: the controller address is required")
	}
	if _, _, err := net.SplitHostPort(cfg.Server); err != nil {
		return nil, fmt.Errorf("gateway: watch: controller address %q: %w", cfg.Server, err)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "isobar-gateway"
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if len(deps.DialOptions) == 0 {
		return nil, errors.New("gateway: watch: dial options must carry transport credentials")
	}
	return &Watcher{
		cfg: cfg, clock: deps.Clock, log: deps.Logger, opts: deps.DialOptions,
		changed: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Start connects and keeps the subscription alive until Stop or ctx ends.
func (w *Watcher) Start(ctx context.Context) error {
	err := errors.New("gateway: watcher already started")
	w.startOnce.Do(func() {
		conn, cerr := grpc.NewClient(w.cfg.Server, w.opts...)
		if cerr != nil {
			err = fmt.Errorf("gateway: watch: %w", cerr)
			close(w.done)
			return
		}
		err = nil
		ctx, w.cancel = context.WithCancel(ctx)
		go func() {
			defer close(w.done)
			defer conn.Close()
			w.loop(ctx, conn)
		}()
	})
	return err
}

// Stop ends the subscription and waits for the goroutine. Idempotent.
func (w *Watcher) Stop() {
	w.stopOnce.Do(func() {
		w.startOnce.Do(func() { close(w.done) })
		if w.cancel != nil {
			w.cancel()
		}
	})
	<-w.done
}

// Latest returns the latest assignment; ok is false before the first one.
func (w *Watcher) Latest() (Assignment, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.latest.Seq > 0
}

// Nacks counts responses this watcher refused.
func (w *Watcher) Nacks() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nacks
}

// WaitFor blocks until cond holds for the latest assignment or ctx ends.
func (w *Watcher) WaitFor(ctx context.Context, cond func(Assignment) bool) (Assignment, error) {
	for {
		w.mu.Lock()
		a, ch := w.latest, w.changed
		w.mu.Unlock()
		if a.Seq > 0 && cond(a) {
			return a, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return a, ctx.Err()
		case <-w.done:
			return a, errors.New("gateway: watcher stopped")
		}
	}
}

func (w *Watcher) loop(ctx context.Context, conn *grpc.ClientConn) {
	backoff := w.cfg.MinBackoff
	for ctx.Err() == nil {
		got, err := w.session(ctx, conn)
		if ctx.Err() != nil {
			return
		}
		if got {
			backoff = w.cfg.MinBackoff
		}
		// Full jitter: sleep a random time in [0, backoff).
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1)
		w.log.Info("xDS stream ended; reconnecting", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-w.clock.After(wait):
		}
		backoff = min(2*backoff, w.cfg.MaxBackoff)
	}
}

// session runs one ADS stream; got reports whether any update arrived.
func (w *Watcher) session(ctx context.Context, conn *grpc.ClientConn) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node := &core.Node{Id: w.cfg.NodeID, UserAgentName: "isobar-gateway"}
	cl := sotw.NewADSClient(sctx, node, resource.EndpointType)
	if err := cl.InitConnect(conn); err != nil {
		return false, err
	}
	for {
		resp, err := cl.Fetch()
		if err != nil {
			return got, err
		}
		a, err := decode(resp)
		if err != nil {
			w.mu.Lock()
			w.nacks++
			w.mu.Unlock()
			w.log.Warn("refusing an xDS update", "err", err)
			if err := cl.Nack(err.Error()); err != nil {
				return got, err
			}
			continue
		}
		got = true
		w.publish(a)
		if err := cl.Ack(); err != nil {
			return got, err
		}
	}
}

func (w *Watcher) publish(clusters map[string][]Endpoint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest = Assignment{Clusters: clusters, Seq: w.latest.Seq + 1, At: w.clock.Now()}
	close(w.changed)
	w.changed = make(chan struct{})
}

// decode validates and flattens ClusterLoadAssignments.
func decode(resp *sotw.Response) (map[string][]Endpoint, error) {
	out := make(map[string][]Endpoint, len(resp.Resources))
	for _, any := range resp.Resources {
		var cla endpoint.ClusterLoadAssignment
		if err := any.UnmarshalTo(&cla); err != nil {
			return nil, fmt.Errorf("decode ClusterLoadAssignment: %w", err)
		}
		if err := cla.ValidateAll(); err != nil {
			return nil, fmt.Errorf("invalid ClusterLoadAssignment %q: %w", cla.GetClusterName(), err)
		}
		var eps []Endpoint
		for _, loc := range cla.GetEndpoints() {
			for _, lb := range loc.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if sa == nil {
					return nil, fmt.Errorf("cluster %q: endpoint without a socket address", cla.GetClusterName())
				}
				e := Endpoint{
					Address:        net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)),
					Weight:         lb.GetLoadBalancingWeight().GetValue(),
					Region:         loc.GetLocality().GetRegion(),
					Zone:           loc.GetLocality().GetZone(),
					LocalityWeight: loc.GetLoadBalancingWeight().GetValue(),
					Priority:       loc.GetPriority(),
				}
				if md := lb.GetMetadata().GetFilterMetadata()["isobar"]; md != nil {
					e.Cell = md.GetFields()["cell"].GetStringValue()
					e.MaxModelLen = uint32(md.GetFields()["max_model_len"].GetNumberValue())
				}
				if e.Weight == 0 {
					e.Weight = 1 // Envoy's default
				}
				eps = append(eps, e)
			}
		}
		sort.Slice(eps, func(i, j int) bool { return eps[i].Address < eps[j].Address })
		out[cla.GetClusterName()] = eps
	}
	return out, nil
}

// Pick chooses an endpoint with probability proportional to its weight,
// given u uniform in [0,1). ok is false when there is no endpoint.
func Pick(a Assignment, u float64) (Endpoint, bool) {
	var all []Endpoint
	var sum float64
	names := make([]string, 0, len(a.Clusters))
	for n := range a.Clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, e := range a.Clusters[n] {
			all = append(all, e)
			sum += float64(e.Weight)
		}
	}
	if sum == 0 {
		return Endpoint{}, false
	}
	x := u * sum
	for _, e := range all {
		x -= float64(e.Weight)
		if x < 0 {
			return e, true
		}
	}
	return all[len(all)-1], true
}
