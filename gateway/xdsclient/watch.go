package xdsclient

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// Endpoint is one endpoint of a cluster as the control plane assigned it.
type Endpoint struct {
	// Cell is the cell id from the endpoint metadata ("region/<name>" for a
	// remote region's ingress), "" when absent.
	Cell string
	// Address is host:port.
	Address string
	// Weight is the endpoint's load-balancing weight (1 when unset).
	Weight uint32
	// Region, Zone and SubZone name the endpoint's locality.
	Region, Zone, SubZone string
	// LocalityWeight is the locality's weight (0 when unset).
	LocalityWeight uint32
	// Priority is the locality's priority, 0 the highest.
	Priority uint32
	// MaxModelLen is the engine's context length from the metadata, 0 when
	// unknown.
	MaxModelLen uint32
	// ProbeBudget is the endpoint's probe budget from the metadata
	// (xdscontract.MetadataProbeBudget), 0 when absent: on probation after an
	// error-rate penalty, --lb isobar sends it at most this many requests
	// while it stays in the assignment. Envoy ignores it.
	ProbeBudget uint32
	// Degraded: the endpoint's EDS health status is DEGRADED. Envoy (and
	// the gateway) sends it traffic only in the share its priority's
	// healthy endpoints cannot take.
	Degraded bool
	// PrefillTokensPerSecond is the engine's prefill rate from the
	// metadata (xdscontract.MetadataPrefillRate), 0 when unknown.
	PrefillTokensPerSecond float64
	// MaxNumSeqs is the engine's batch-slot cap (vLLM max_num_seqs) from
	// the metadata, 0 when unknown: --lb isobar's slot-wait term.
	MaxNumSeqs int64
	// RTT and Jitter are the round trip to the endpoint and its jitter from
	// the endpoint's, else its locality's, metadata
	// (xdscontract.MetadataRTT, MetadataJitter), 0 when unknown.
	RTT, Jitter time.Duration
}

// Assignment is the latest set of ClusterLoadAssignments, by cluster name.
// Immutable once published.
type Assignment struct {
	// Clusters holds each assignment's endpoints, sorted by address.
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
	// Delta watches over delta (incremental) ADS, with LEDS when the
	// controller serves it (Subscription.Delta). Default false:
	// state-of-the-world.
	Delta bool
	// MinBackoff and MaxBackoff bound the jittered exponential reconnect
	// backoff. Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
}

// WatchDeps are the Watcher's collaborators.
type WatchDeps struct {
	// Clock times reconnects. Nil means the real clock.
	Clock clockwork.Clock
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
	// DialOptions for the gRPC connection (credentials). Required: pass
	// insecure credentials explicitly when TLS is off.
	DialOptions []grpc.DialOption
}

// Watcher subscribes to every ClusterLoadAssignment over ADS and keeps the
// latest set. It is the EDS part of the gateway on its own, for tests and
// tools that pick endpoints themselves.
type Watcher struct {
	cfg  WatchConfig
	deps WatchDeps

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
		return nil, fmt.Errorf("%w: watch: the controller address is required", ErrInvalidConfig)
	}
	if _, _, err := net.SplitHostPort(cfg.Server); err != nil {
		return nil, fmt.Errorf("%w: watch: controller address %q: %v", ErrInvalidConfig, cfg.Server, err)
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
		return nil, fmt.Errorf("%w: watch: dial options must carry transport credentials", ErrInvalidConfig)
	}
	return &Watcher{cfg: cfg, deps: deps, changed: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start connects and keeps the subscription alive until Stop or ctx ends.
func (w *Watcher) Start(ctx context.Context) error {
	err := ErrAlreadyStarted
	w.startOnce.Do(func() {
		conn, cerr := grpc.NewClient(w.cfg.Server, w.deps.DialOptions...)
		if cerr != nil {
			err = fmt.Errorf("gateway: watch: %w", cerr)
			close(w.done)
			return
		}
		err = nil
		ctx, w.cancel = context.WithCancel(ctx)
		sub := &Subscription{
			TypeURL: resource.EndpointType, Label: "endpoint",
			Node: &core.Node{Id: w.cfg.NodeID, UserAgentName: UserAgent},
			Conn: conn, Clock: w.deps.Clock, Log: w.deps.Logger,
			Min: w.cfg.MinBackoff, Max: w.cfg.MaxBackoff,
			Apply: w.apply,
			Delta: w.cfg.Delta,
			// Delta: the endpoints decoded as they change (delta_apply.go).
			ApplyDecoded: w.applyDecoded,
			Refused:      func(error) { w.mu.Lock(); w.nacks++; w.mu.Unlock() },
			MaxMsg:       xdscontract.MaxXDSMessageBytes(xdscontract.DefaultMaxCells),
		}
		go func() {
			defer close(w.done)
			defer conn.Close()
			sub.Run(ctx)
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

// WaitFor blocks until cond holds for the latest assignment, ctx ends
// (ctx.Err()) or the watcher stops (ErrStopped).
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
			return a, ErrStopped
		}
	}
}

func (w *Watcher) apply(rs []*anypb.Any, _ string) error {
	clusters, err := DecodeAssignments(rs)
	if err != nil {
		w.mu.Lock()
		w.nacks++
		w.mu.Unlock()
		return err
	}
	for _, eps := range clusters {
		sort.SliceStable(eps, func(i, j int) bool { return eps[i].Address < eps[j].Address })
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest = Assignment{Clusters: clusters, Seq: w.latest.Seq + 1, At: w.deps.Clock.Now()}
	close(w.changed)
	w.changed = make(chan struct{})
	return nil
}

// applyDecoded is apply for the delta stream's decoded view: only the
// changed clusters are sorted (on a copy, when not in address order
// already); the others keep the latest assignment's lists.
func (w *Watcher) applyDecoded(clusters map[string][]Endpoint, changed []string, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]Endpoint, len(clusters))
	for n := range clusters {
		out[n] = w.latest.Clusters[n]
	}
	// Clusters that share a LEDS collection share their list
	// (decodedView): it is checked, and sorted when it must be, once.
	type list struct {
		first *Endpoint
		n     int
	}
	done := make(map[list][]Endpoint)
	for _, n := range changed {
		if eps, ok := clusters[n]; ok {
			k := list{n: len(eps)}
			if len(eps) > 0 {
				k.first = &eps[0]
			}
			sorted, seen := done[k]
			if !seen {
				sorted = eps
				byAddr := func(a, b Endpoint) int { return strings.Compare(a.Address, b.Address) }
				if !slices.IsSortedFunc(eps, byAddr) { // one LEDS locality comes sorted: resource-name order
					sorted = slices.Clone(eps)
					slices.SortStableFunc(sorted, byAddr)
				}
				done[k] = sorted
			}
			out[n] = sorted
		}
	}
	w.latest = Assignment{Clusters: out, Seq: w.latest.Seq + 1, At: w.deps.Clock.Now()}
	close(w.changed)
	w.changed = make(chan struct{})
	return nil
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
