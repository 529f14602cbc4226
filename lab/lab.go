package lab

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/lab/wan"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/capacity"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// Lab is a running fleet.
type Lab struct {
	cfg   Config
	log   *slog.Logger
	clock clockwork.Clock
	dir   string
	own   bool
	pki   *pki
	// hopKey is the hop key every region's gateway shares, so that spilled
	// requests are served as forwarded (gateway.Config.HopKey).
	hopKey []byte

	// ctx outlives Start: components restarted by a heal run under it.
	ctx context.Context

	// The lab's parts, each owning its mutex: the running components'
	// handles (fleet), the fault injector, the emulated WAN's routes
	// (router), the routing plans seen (plans) and the shutdown stack.
	fleet   fleet
	faults  *faultInjector
	router  *wanRouter
	plans   *planRecorder
	stops   stopper
	traffic []*traffic // set by Start, read-only after
	admin   *admin
	// residency is the config every region enforces (nil: none) and
	// pinned its tenants' allowed regions; both read-only after Start.
	residency *residency.Config
	pinned    map[string][]string
}

// Region is one simulated datacenter.
type Region struct {
	Name string
	// Metrics is the region's registry (controller, gateway, gossip).
	Metrics *prometheus.Registry
	Ctrl    *regional.Controller
	Gateway *gateway.Gateway
	Gossip  *gossip.Node
	Engines []*sim.Engine
	Agents  []*cellagent.Agent
	DCGM    *sim.DCGMExporter

	idx         int
	ingress     string   // the gateway's listen address, kept across a restart
	gossipAddrs []string // every region's gossip address
	down        bool     // a kill-region fault holds it down
	ctrlDown    bool     // a stop-controller fault holds its controller down
	staggered   []int    // agents a stop-controller fault holds back
	// ctrl rebuilds the controller on given addresses (stop-controller's
	// heal); the gossip member, etcd client and state dir are reused.
	ctrl     func(ctx context.Context, grpcAddr, httpAddr string) (*regional.Controller, error)
	silenced map[int]bool
}

// CellID names cell i of region r.
func CellID(region string, i int) string { return fmt.Sprintf("%s-cell-%d", region, i) }

// Run starts a lab, drives traffic until the duration elapses or ctx ends,
// writes the report and shuts everything down.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	if deps.Out == nil {
		deps.Out = os.Stdout
	}
	l, err := Start(ctx, cfg, deps)
	if err != nil {
		return err
	}
	defer l.Stop()
	runCtx := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	view := cfg.View || cfg.Duration == 0
	tick := l.clock.NewTicker(cfg.ViewEvery)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-runCtx.Done():
			done = true
		case <-tick.Chan():
			l.notePlans()
			if view {
				l.render(deps.Out)
			}
		}
	}
	l.notePlans()
	l.StopTraffic()
	rep := l.Report()
	if view {
		l.render(deps.Out)
	}
	fmt.Fprintf(deps.Out, "\nisobar lab: %d requests, success %s; by criticality%s:\n", rep.Total.Requests,
		pct(rep.Total.Succeeded, rep.Total.Requests), map[bool]string{true: " and tenant"}[len(cfg.Tenants) > 0])
	WriteClassTable(deps.Out, rep)
	if cfg.Report != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.Report, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("lab: write report: %w", err)
		}
	}
	return nil
}

// Start builds and starts every component and the traffic; the caller must
// Stop the lab.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Lab, err error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	l := &Lab{cfg: cfg, log: deps.Logger, clock: deps.Clock, dir: cfg.Dir, ctx: ctx, router: newWANRouter(),
		plans: &planRecorder{started: deps.Clock.Now()}, hopKey: make([]byte, gateway.MinHopKeyBytes)}
	l.faults = &faultInjector{lab: l, delays: map[string][2]time.Duration{}}
	if l.residency, l.pinned, err = cfg.loadResidency(); err != nil {
		return nil, err
	}
	_, _ = crand.Read(l.hopKey) // crypto/rand.Read never fails (Go 1.24+)
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()
	if l.dir == "" {
		if l.dir, err = os.MkdirTemp("", "isobar-lab-"); err != nil {
			return nil, err
		}
		l.own = true
		l.onStop(func() { _ = os.RemoveAll(l.dir) })
	}
	if l.pki, err = newPKI(l.dir, cfg.Insecure); err != nil {
		return nil, err
	}
	if cfg.Globals > 0 {
		if err := l.startGlobals(ctx); err != nil {
			return nil, err
		}
	}
	// Addresses first, so the WAN paths can target them: each region's
	// gateway (its ingress) and gossip member.
	n := len(cfg.Regions)
	gwLns := make([]net.Listener, n)
	gossipAddrs := make([]string, n)
	for i := range cfg.Regions {
		if gwLns[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		if gossipAddrs[i], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	if n > 1 {
		if err := l.startWAN(gwLns, gossipAddrs); err != nil {
			return nil, err
		}
	}
	for i, name := range cfg.Regions {
		r, err := l.startRegion(ctx, i, name, gwLns[i], gossipAddrs)
		if err != nil {
			return nil, err
		}
		l.fleet.setRegion(i, r)
	}
	if err := l.waitReady(ctx); err != nil {
		return nil, err
	}
	if cfg.AdminListen != "" {
		if err := l.startAdmin(); err != nil {
			return nil, err
		}
	}
	if !cfg.NoTraffic {
		l.startTraffic(ctx)
	}
	return l, nil
}

// startTraffic starts each region's clients.
func (l *Lab) startTraffic(ctx context.Context) {
	for i, r := range l.Regions() {
		tcfg := l.cfg
		if v, ok := l.cfg.RegionRPS[r.Name]; ok {
			tcfg.RPS = v
		}
		t := newTraffic(tcfg, r.Name, r.Gateway.Addr(), l.cfg.Seed+uint64(i), l.clock, l.log)
		t.start(ctx)
		l.traffic = append(l.traffic, t)
		l.onStop(t.stop)
	}
}

// readyTimeout bounds how long Start waits for the fleet to be ready.
const readyTimeout = 2 * time.Minute

// waitGateway blocks until r's gateway routes the default model to every
// cell of r.
func waitGateway(ctx context.Context, r *Region) error {
	model := xdscontract.ClusterName(sim.DefaultModel)
	_, err := r.Gateway.WaitForTable(ctx, func(t *xdsclient.Table) bool {
		n := 0
		for _, e := range t.Clusters[model].Endpoints {
			if e.Region == r.Name {
				n++
			}
		}
		return t.Ready() && n == len(r.Engines)
	})
	if err != nil {
		return fmt.Errorf("lab: region %s's gateway not ready: %w", r.Name, err)
	}
	return nil
}

// waitReady blocks until every region's gateway routes to all of its
// cells and, with the global pair, every region routes on a plan — so the
// traffic measures the fleet, not its start-up.
func (l *Lab) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	regions := l.Regions()
	for _, r := range regions {
		if err := waitGateway(ctx, r); err != nil {
			return err
		}
	}
	if l.Etcd() == nil {
		return nil
	}
	t := l.clock.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ready := true
		for _, r := range regions {
			if rt := r.Ctrl.Routes(); rt == nil || rt.Source != regional.RoutesPlan {
				ready = false
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lab: regions not routing on a plan: %w", ctx.Err())
		case <-t.Chan():
		}
	}
}

func (l *Lab) onStop(f func()) { l.stops.push(f) }

// Stop shuts everything down in reverse start order. Idempotent.
func (l *Lab) Stop() { l.stops.stopAll() }

// StopTraffic ends the load (in-flight requests finish, bounded).
func (l *Lab) StopTraffic() {
	var wg sync.WaitGroup
	for _, t := range l.traffic {
		wg.Go(t.stop)
	}
	wg.Wait()
}

// Regions are the lab's regions in order (a region restarted by a heal is
// a new value).
func (l *Lab) Regions() []*Region { return l.fleet.Regions() }

// Globals are the running members of the global pair.
func (l *Lab) Globals() []*global.Server { return l.fleet.running() }

// Etcd is the embedded etcd (nil with one region).
func (l *Lab) Etcd() *election.Embedded { return l.fleet.Etcd() }

// Controller is the first region's controller (single-region use).
func (l *Lab) Controller() *regional.Controller { return l.Regions()[0].Ctrl }

// Engines are the first region's engines (single-region use).
func (l *Lab) Engines() []*sim.Engine { return l.Regions()[0].Engines }

func (l *Lab) newEtcdClient(id identity) (*clientv3.Client, error) {
	cc := election.ClientConfig{Endpoints: l.Etcd().Endpoints(), DialTimeout: 10 * time.Second}
	if !l.cfg.Insecure {
		cc.TLS = election.TLSFiles{CertFile: id.cert, KeyFile: id.key, CAFile: l.pki.ca}
	}
	return election.NewClient(cc)
}

// globalMember is one member of the global pair, restartable on the same
// addresses (a kill-leader heal).
type globalMember struct {
	name string
	id   identity
	cfg  global.Config
	srv  *global.Server
	cli  *clientv3.Client
	down bool
}

func (l *Lab) startGlobals(ctx context.Context) error {
	id, err := l.pki.issue("etcd", "")
	if err != nil {
		return err
	}
	ec := election.EmbeddedConfig{Dir: l.dir + "/etcd", UnsafeNoFsync: true}
	if !l.cfg.Insecure {
		ec.TLS = election.TLSFiles{CertFile: id.cert, KeyFile: id.key, CAFile: l.pki.ca}
	}
	e, err := election.StartEmbedded(ctx, ec)
	if err != nil {
		return err
	}
	l.fleet.update(func() { l.fleet.etcd = e })
	// Stops whichever member runs by then (an etcd-down heal replaces it).
	l.onStop(func() { l.Etcd().Stop() })
	for g := range l.cfg.Globals {
		name := fmt.Sprintf("g%d", g+1)
		gid, err := l.pki.issue("global-"+name, certs.GlobalURI(name))
		if err != nil {
			return err
		}
		gc := global.Config{Name: name, Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", Regions: l.cfg.Regions}
		if l.cfg.Fast {
			gc.LeaseTTL, gc.CycleInterval, gc.RegionTTL = 2*time.Second, 200*time.Millisecond, 2*time.Second
		}
		if !l.cfg.Insecure {
			gc.TLSCert, gc.TLSKey, gc.TLSCA = gid.cert, gid.key, l.pki.ca
		}
		m := &globalMember{name: name, id: gid, cfg: gc}
		if err := l.startMember(m); err != nil {
			return err
		}
		l.fleet.update(func() { l.fleet.globals = append(l.fleet.globals, m) })
	}
	return nil
}

// startMember starts m's server with its own etcd client; after the first
// start it reuses the addresses the first one listened on.
func (l *Lab) startMember(m *globalMember) error {
	cli, err := l.newEtcdClient(m.id)
	if err != nil {
		return err
	}
	srv, err := global.New(m.cfg, global.Deps{Etcd: cli, Logger: l.log.With("component", "global", "global", m.name)})
	if err != nil {
		_ = cli.Close()
		return err
	}
	if err := srv.Start(l.ctx); err != nil {
		_ = cli.Close()
		return err
	}
	l.onStop(func() { srv.Stop(); _ = cli.Close() })
	m.srv, m.cli, m.down = srv, cli, false
	m.cfg.Listen, m.cfg.HTTPListen = srv.Addr(), srv.HTTPAddr()
	return nil
}

// startWAN creates the emulated WAN: per ordered pair of regions a path
// for forwarded requests (gateway to gateway) and one for gossip (TCP and
// UDP); per region outside the first, a path to each global member.
func (l *Lab) startWAN(gwLns []net.Listener, gossipAddrs []string) error {
	regions := l.cfg.Regions
	for i, src := range regions {
		for j := range regions {
			if i == j {
				continue
			}
			d := l.cfg.Delay(i, j)
			gw, err := wan.New(wan.Config{Path: "http:" + src + ">" + regions[j], Listen: "127.0.0.1:0",
				Target: gwLns[j].Addr().String(), Delay: d, Jitter: l.cfg.Jitter, Seed: l.cfg.Seed + uint64(i*16+j)},
				wan.Deps{Logger: l.log})
			if err != nil {
				return err
			}
			if err := gw.Start(); err != nil {
				return err
			}
			l.onStop(gw.Stop)
			l.router.add("http:"+src+">"+regions[j], gw, src, gwLns[j].Addr().String(), gw.Addr())
			gp, err := wan.NewPath(wan.Config{Path: "gossip:" + src + ">" + regions[j], Listen: "127.0.0.1:0",
				Target: gossipAddrs[j], Delay: d, Jitter: l.cfg.Jitter, Seed: l.cfg.Seed + uint64(i*16+j+256)},
				wan.Deps{Logger: l.log})
			if err != nil {
				return err
			}
			if err := gp.Start(); err != nil {
				return err
			}
			l.onStop(gp.Stop)
			l.router.add("gossip:"+src+">"+regions[j], gp, src, gossipAddrs[j], gp.Addr())
		}
		if i == 0 {
			continue // the global pair runs in the first region
		}
		for _, m := range l.fleet.members() {
			g := m.srv
			p, err := wan.New(wan.Config{Path: "global:" + src + ">" + g.ID(), Listen: "127.0.0.1:0",
				Target: g.Addr(), Delay: l.cfg.Delay(i, 0), Jitter: l.cfg.Jitter, Seed: l.cfg.Seed + uint64(i*16+512)},
				wan.Deps{Logger: l.log})
			if err != nil {
				return err
			}
			if err := p.Start(); err != nil {
				return err
			}
			l.onStop(p.Stop)
			l.router.add("global:"+src+">"+g.ID(), p, src, g.Addr(), p.Addr())
		}
	}
	return nil
}

// startRegion starts region name's site: gossip member, regional
// controller, engines with their dcgm-exporter and agents, and gateway on
// gwLn (the region's ingress).
func (l *Lab) startRegion(ctx context.Context, idx int, name string, gwLn net.Listener, gossipAddrs []string) (*Region, error) {
	r := &Region{Name: name, Metrics: prometheus.NewRegistry(), idx: idx, ingress: gwLn.Addr().String(),
		gossipAddrs: gossipAddrs, silenced: map[int]bool{}}
	rid, err := l.pki.issue("regional-"+name, certs.RegionURI(name))
	if err != nil {
		return nil, err
	}
	rc := l.regionalConfig(r, rid)
	if r.Gossip, err = l.startGossip(ctx, r, rc); err != nil {
		return nil, err
	}
	rdeps, err := l.regionalDeps(r, rid, rc)
	if err != nil {
		return nil, err
	}
	r.ctrl = l.controllerFactory(rc, rdeps)
	if r.Ctrl, err = r.ctrl(ctx, "127.0.0.1:0", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	if err := l.startEngines(r); err != nil {
		return nil, err
	}
	for i := range r.Engines {
		ag, err := l.startAgent(r, i)
		if err != nil {
			return nil, err
		}
		r.Agents = append(r.Agents, ag)
	}
	if r.Gateway, err = l.startGateway(ctx, r, gwLn); err != nil {
		return nil, err
	}
	return r, nil
}

// startGossip starts r's gossip member as regional.New would build it from
// rc.Gossip (regional.NewGossip), its traffic routed through the emulated
// WAN. The lab starts it itself because the node outlives controller
// restarts (stop-controller) and a fault stops it.
func (l *Lab) startGossip(ctx context.Context, r *Region, rc regional.Config) (*gossip.Node, error) {
	name := r.Name
	node, err := regional.NewGossip(rc, regional.Deps{Logger: l.log.With("region", name),
		GossipTransport: func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
			return &wan.Transport{NodeAwareTransport: nt, Route: func(a string) string { return l.router.via(name, a) }}
		}})
	if err != nil {
		return nil, err
	}
	if err := node.Start(ctx); err != nil {
		return nil, err
	}
	l.onStop(node.Stop)
	return node, nil
}

// regionalConfig is r's regional controller configuration.
func (l *Lab) regionalConfig(r *Region, rid identity) regional.Config {
	cfg, name := l.cfg, r.Name
	rc := regional.DefaultConfig(name)
	rc.Listen, rc.HTTPListen = "127.0.0.1:0", "127.0.0.1:0"
	// The last pushed cell set survives a controller restart here, as on
	// a persistent volume: the warm start waits for those cells.
	rc.WarmStart.StateDir = filepath.Join(l.dir, "state-"+name)
	rc.HeartbeatInterval, rc.TTLGrace = cfg.HeartbeatInterval, cfg.HeartbeatInterval
	if cfg.Fast {
		// Short heartbeats, and a TTL (2 s) a loaded machine cannot reach
		// by starving a goroutine: under -race on two busy cores the
		// tests saw heartbeats 850–910 ms apart, which a TTL of 4
		// intervals (800 ms) turned into cells flapping to Failed and
		// back. An engine death is still reported at once (the agent's
		// watch, the stream's break), so only silent-agent drills wait
		// for it.
		rc.TTLGrace = 2*time.Second - cfg.HeartbeatInterval
	}
	rc.Global.IngressAddress = r.ingress
	rc.Residency = l.residency
	// The capacity prior: the profile's knee is ~1.3 RPS per cell in real
	// time; a faster clock serves proportionally more, and reaches the
	// TTFT SLO proportionally sooner. Measurements replace the prior.
	rc.Global.NominalCellRPS = 1.3 / cfg.TimeScale
	rc.Global.Capacity.TTFTSLO = time.Duration(float64(capacity.DefaultTTFTSLO) * cfg.TimeScale)
	if cfg.Fast {
		rc.CycleInterval = 20 * time.Millisecond
		rc.Global.SummaryInterval = 200 * time.Millisecond
		rc.Global.DemandTau = 2 * time.Second
		// Capacity stays at the prior: at the tests' time scales the
		// scaled TTFT SLO (75 ms at 0.05) is below the unscaled wall-clock
		// cost of a request on a loaded machine, so a measurement would
		// read every cell as past its SLO.
		rc.Global.Capacity.EvidenceRequests = 1e12
	}
	if !cfg.Insecure {
		rc.TLS = regional.TLSFiles{Cert: rid.cert, Key: rid.key, CA: l.pki.ca}
	}
	l.crossRegion(&rc, r, rid)
	return rc
}

// crossRegion sets rc's gossip member (on r's reserved address, joining
// the first region's; bound to r's identity with the lab's key unless
// insecure) and, with the global pair, the etcd cluster regional.New
// connects to.
func (l *Lab) crossRegion(rc *regional.Config, r *Region, rid identity) {
	cfg := l.cfg
	rc.Gossip = regional.GossipConfig{Listen: r.gossipAddrs[r.idx], Profile: gossip.ProfileLAN}
	if cfg.Fast {
		// Short probes, and an RTT average that follows a step within two
		// probes of a peer (the default 0.2 needs four).
		rc.Gossip.Profile, rc.Gossip.RTTSmoothing = gossip.ProfileLocal, 0.5
	}
	if r.idx > 0 {
		rc.Gossip.Join = []string{r.gossipAddrs[0]}
	}
	if !cfg.Insecure {
		rc.Gossip.SecretKey = l.pki.gossipKey
	}
	if l.Etcd() != nil {
		rc.Etcd = election.ClientConfig{Endpoints: l.Etcd().Endpoints(), DialTimeout: 10 * time.Second}
		if !cfg.Insecure {
			rc.Etcd.TLS = election.TLSFiles{CertFile: rid.cert, KeyFile: rid.key, CAFile: l.pki.ca}
		}
	}
}

// regionalDeps are the collaborators of r's regional controller: its
// gossip member and registry and, with the global pair, its etcd client
// and a dialer through the emulated WAN.
func (l *Lab) regionalDeps(r *Region, rid identity, rc regional.Config) (regional.Deps, error) {
	name, log := r.Name, l.log.With("region", r.Name)
	rdeps := regional.Deps{Logger: log.With("component", "regional"), Gossip: r.Gossip, Registerer: r.Metrics}
	if l.Etcd() != nil {
		// The etcd client from rc.Etcd, as regional.New would open it; the
		// lab opens it once because, like the gossip node, it outlives
		// controller restarts: a controller restarted while etcd is down
		// (controller-restart-blackout) keeps it, where a new client
		// would refuse to start without an answer from etcd.
		cli, err := election.NewClient(rc.Etcd)
		if err != nil {
			return regional.Deps{}, err
		}
		l.onStop(func() { _ = cli.Close() })
		rdeps.Etcd = cli
		dial, err := l.pki.dial(rid)
		if err != nil {
			return regional.Deps{}, err
		}
		d := l.router.dialer(name)
		rdeps.GlobalDialOptions = append(dial, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d(ctx, "tcp", addr)
		}))
	}
	return rdeps, nil
}

// controllerFactory returns what starts a regional controller with rc and
// rdeps on given addresses (the first start, and stop-controller's heal).
func (l *Lab) controllerFactory(rc regional.Config, rdeps regional.Deps) func(ctx context.Context, grpcAddr, httpAddr string) (*regional.Controller, error) {
	return func(ctx context.Context, grpcAddr, httpAddr string) (*regional.Controller, error) {
		c, d := rc, rdeps
		c.Listen, c.HTTPListen = grpcAddr, httpAddr
		if grpcAddr != "127.0.0.1:0" {
			// A restarted controller: its predecessor's instruments hold
			// the names in the region's registry.
			d.Registerer = prometheus.NewRegistry()
		}
		ctrl, err := regional.New(c, d)
		if err != nil {
			return nil, err
		}
		if err := ctrl.Start(ctx); err != nil {
			return nil, err
		}
		l.onStop(ctrl.Stop)
		return ctrl, nil
	}
}

// startEngines starts r's simulated engines and its dcgm-exporter.
func (l *Lab) startEngines(r *Region) error {
	cfg, name, idx, log := l.cfg, r.Name, r.idx, l.log.With("region", r.Name)
	r.DCGM = sim.NewDCGMExporter(sim.DCGMConfig{Hostname: name + "-node"}, sim.Deps{})
	custom, err := cfg.engineProfile()
	if err != nil {
		return err
	}
	for i := range cfg.Cells {
		eng, err := sim.NewEngine(sim.EngineConfig{
			Name: CellID(name, i), Profile: cfg.Profile, CustomProfile: custom, TimeScale: cfg.TimeScale, GPUIndex: i, Seed: int64(idx*64 + i),
		}, sim.Deps{Logger: log.With("component", "sim")})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		if err := eng.Start(ln); err != nil {
			return err
		}
		l.onStop(func() { stopCtx(eng.Stop) })
		r.Engines = append(r.Engines, eng)
		r.DCGM.AddGPU(eng.GPU())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if err := r.DCGM.Start(ln); err != nil {
		return err
	}
	l.onStop(func() { stopCtx(r.DCGM.Stop) })
	return nil
}

// startGateway starts r's gateway on its ingress listener.
func (l *Lab) startGateway(ctx context.Context, r *Region, gwLn net.Listener) (*gateway.Gateway, error) {
	cfg, name, log := l.cfg, r.Name, l.log.With("region", r.Name)
	gid, err := l.pki.issue("gateway-"+name, certs.GatewayURI(name))
	if err != nil {
		return nil, err
	}
	gdial, err := l.pki.dial(gid)
	if err != nil {
		return nil, err
	}
	// The gateway's channel to its controller reconnects within half a
	// second of the controller coming back (grpc-go's default connection
	// backoff starts at 1 s and grows to 2 min), and its xDS streams
	// within a second (MaxBackoff; default 5 s): a data plane that
	// reconnects at once is the harder case for a restarted controller,
	// which must not hand it what it knows before its cells are back.
	gdial = append(gdial, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
		MinConnectTimeout: 2 * time.Second,
	}))
	gcfg := gateway.Config{Controller: r.Ctrl.Addr(), Region: name, LB: gateway.LBMode(cfg.LB),
		MaxBackoff: time.Second, HopKey: l.hopKey, Residency: l.residency}
	// The lab's clients are on loopback: their criticality is trusted.
	gcfg.TrustedSources = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	gw, err := gateway.New(gcfg,
		gateway.Deps{Logger: log.With("component", "gateway"), DialOptions: gdial, DialContext: l.router.dialer(name),
			Registerer: r.Metrics})
	if err != nil {
		return nil, err
	}
	if err := gw.Start(ctx, gwLn); err != nil {
		return nil, err
	}
	l.onStop(gw.Stop)
	return gw, nil
}

// startAgent starts the cellagent of cell i of r.
func (l *Lab) startAgent(r *Region, i int) (*cellagent.Agent, error) {
	cfg, name, log, eng := l.cfg, r.Name, l.log.With("region", r.Name), r.Engines[i]
	cid, err := l.pki.issue(CellID(name, i), certs.CellURI(name, CellID(name, i)))
	if err != nil {
		return nil, err
	}
	ac := cellagent.Config{
		CellID: CellID(name, i), Region: name, ControllerAddr: r.Ctrl.Addr(),
		VLLMURL: "http://" + eng.Addr() + "/metrics", DCGMURL: "http://" + r.DCGM.Addr() + "/metrics",
		DCGMGPU: fmt.Sprint(i), Interval: cfg.HeartbeatInterval,
	}
	// The engine's capacity as an operator would declare it for the
	// deployment: its profile's prefill rate (in real time: a faster clock
	// prefills proportionally more) and running-batch cap.
	prof := eng.Profile()
	ac.PrefillTokensPerSecond = min(prof.PrefillTokensPerSec/cfg.TimeScale, cellagent.MaxPrefillTokensPerSecond)
	ac.MaxNumSeqs = uint32(min(prof.MaxNumSeqs, cellagent.MaxMaxNumSeqs))
	var adeps cellagent.Deps
	adeps.Logger = log.With("component", "cellagent")
	if cfg.Insecure {
		if adeps.DialOptions, err = l.pki.dial(cid); err != nil {
			return nil, err
		}
	} else {
		ac.TLS = cellagent.TLSFiles{Cert: cid.cert, Key: cid.key, CA: l.pki.ca}
	}
	ag, err := cellagent.NewAgent(ac, adeps)
	if err != nil {
		return nil, err
	}
	if err := ag.Start(l.ctx); err != nil {
		return nil, err
	}
	l.onStop(ag.Stop)
	return ag, nil
}

// KillCell SIGKILLs the engine of cell i in region r (listener and
// connections gone at once).
func (l *Lab) KillCell(region string, i int) error {
	for _, r := range l.Regions() {
		if r.Name == region {
			if i < 0 || i >= len(r.Engines) {
				return fmt.Errorf("lab: region %s has no cell %d", region, i)
			}
			r.Engines[i].Kill()
			return nil
		}
	}
	return fmt.Errorf("lab: no region %q", region)
}

func stopCtx(stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = stop(ctx)
}

// freeAddr reserves a loopback address for a gossip member, which binds it
// later (the WAN proxies must know it first). It picks ports below the
// kernels' ephemeral ranges (Linux 32768+, BSD/macOS 49152+), free for both
// TCP and UDP: a port the kernel hands out for ":0" or an outgoing
// connection could be taken again by another process before the member
// binds it.
func freeAddr() (string, error) {
	const lo, hi = 20000, 32768
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		a := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", a)
		_ = ln.Close()
		if err != nil {
			continue
		}
		_ = pc.Close()
		return a, nil
	}
	return "", fmt.Errorf("lab: no free loopback port for gossip in [%d, %d)", lo, hi)
}
