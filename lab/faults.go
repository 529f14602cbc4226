package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/sim"
)

// wanPath is an emulated WAN path (TCP proxy, or TCP+UDP for gossip).
type wanPath interface {
	Partition(on bool)
	SetDelay(delay, jitter time.Duration) error
	Delay() (delay, jitter time.Duration)
}

// faultInjector applies and heals faults, one at a time: its mutex
// serialises them and guards delays, each WAN path's shape from before a
// wan-delay fault. It works on the lab's fleet and router, whose own
// mutexes guard what it replaces.
type faultInjector struct {
	lab *Lab

	mu     sync.Mutex
	delays map[string][2]time.Duration
}

// ErrBadFault marks a fault the lab cannot apply as asked (unknown
// region or cell, nothing to heal...): the caller's mistake, HTTP 400.
var ErrBadFault = errors.New("lab: bad fault")

// throttleLead is how long (model time) a throttling GPU's hardware
// metrics lead its latency.
const throttleLead = 10 * time.Second

// SupportedFaults are the fault kinds this lab can inject.
func (l *Lab) SupportedFaults() []adminapi.FaultKind {
	fs := []adminapi.FaultKind{adminapi.FaultKillEngine, adminapi.FaultSilenceAgent, adminapi.FaultThrottle,
		adminapi.FaultDCGMDown, adminapi.FaultMaxModelLen, adminapi.FaultKillRegion, adminapi.FaultStopController}
	if len(l.cfg.Regions) > 1 {
		fs = append(fs, adminapi.FaultPartition, adminapi.FaultWANDelay)
	}
	if l.cfg.Globals > 0 {
		fs = append(fs, adminapi.FaultKillLeader, adminapi.FaultEtcdDown)
	}
	return fs
}

// Inject applies f and returns it as applied.
func (l *Lab) Inject(f adminapi.Fault) (adminapi.Fault, error) { return l.faults.apply(f, false) }

// Heal undoes f (as Inject returned it).
func (l *Lab) Heal(f adminapi.Fault) (adminapi.Fault, error) { return l.faults.apply(f, true) }

func (fi *faultInjector) apply(f adminapi.Fault, heal bool) (adminapi.Fault, error) {
	l := fi.lab
	fi.mu.Lock()
	defer fi.mu.Unlock()
	if !slices.Contains(l.SupportedFaults(), f.Kind) {
		return f, fmt.Errorf("%w: kind %q: this lab supports %v", ErrBadFault, f.Kind, l.SupportedFaults())
	}
	switch f.Kind {
	case adminapi.FaultKillEngine, adminapi.FaultSilenceAgent, adminapi.FaultThrottle, adminapi.FaultMaxModelLen:
		return f, fi.applyToCells(f, heal)
	case adminapi.FaultDCGMDown:
		regions := f.Regions
		if len(regions) == 0 {
			for _, r := range l.Regions() {
				regions = append(regions, r.Name)
			}
		}
		for _, name := range regions {
			r, err := fi.liveRegion(name)
			if err != nil {
				return f, err
			}
			if err := r.DCGM.SetDown(!heal); err != nil {
				return f, err
			}
		}
		return f, nil
	case adminapi.FaultKillRegion:
		if heal {
			return f, fi.restartRegion(f.Region)
		}
		return f, fi.killRegion(f.Region)
	case adminapi.FaultStopController:
		if !heal && (f.StaggerMS < 0 || f.StaggerMS > 60_000) {
			return f, fmt.Errorf("%w: stagger_ms %v: want 0..60000", ErrBadFault, f.StaggerMS)
		}
		if heal {
			return f, fi.startController(f.Region, time.Duration(f.StaggerMS*float64(time.Millisecond)))
		}
		return f, fi.stopController(f.Region, f.StaggerMS > 0)
	case adminapi.FaultPartition:
		paths, err := fi.regionPaths(f.Region, true)
		if err != nil {
			return f, err
		}
		for _, p := range paths {
			p.Partition(!heal)
		}
		return f, nil
	case adminapi.FaultWANDelay:
		return f, fi.wanDelay(f, heal)
	case adminapi.FaultKillLeader:
		return fi.killLeader(f, heal)
	case adminapi.FaultEtcdDown:
		return f, fi.etcdDown(heal)
	}
	return f, fmt.Errorf("%w: kind %q", ErrBadFault, f.Kind)
}

// applyToCells applies (or heals) a fault that acts on f.Cells of
// f.Region.
func (fi *faultInjector) applyToCells(f adminapi.Fault, heal bool) error {
	switch f.Kind {
	case adminapi.FaultKillEngine:
		return fi.eachCell(f, func(r *Region, i int) error {
			if !heal {
				r.Engines[i].Kill()
				return nil
			}
			if r.Engines[i].State() != sim.StateKilled {
				return nil
			}
			return r.Engines[i].Restart()
		})
	case adminapi.FaultSilenceAgent:
		return fi.eachCell(f, func(r *Region, i int) error {
			r.Agents[i].Pause(!heal)
			return nil
		})
	case adminapi.FaultThrottle:
		if !heal && (f.Severity <= 0 || f.Severity > 1) {
			return fmt.Errorf("%w: throttle severity %v: want (0, 1]", ErrBadFault, f.Severity)
		}
		return fi.eachCell(f, func(r *Region, i int) error {
			if heal {
				r.Engines[i].Throttle(0, 0)
			} else {
				r.Engines[i].Throttle(f.Severity, throttleLead)
			}
			return nil
		})
	case adminapi.FaultMaxModelLen:
		if !heal && f.MaxModelLen < 1 {
			return fmt.Errorf("%w: max_model_len %d: want >= 1", ErrBadFault, f.MaxModelLen)
		}
		return fi.eachCell(f, func(r *Region, i int) error {
			// A replica restarted with another --max-model-len; healed,
			// restarted with its configured one (a restart alone keeps
			// the engine's current limit).
			if err := r.Engines[i].Restart(); err != nil {
				return err
			}
			if heal {
				r.Engines[i].SetMaxModelLen(0, true)
			} else {
				r.Engines[i].SetMaxModelLen(f.MaxModelLen, !f.Silent)
			}
			return nil
		})
	}
	return fmt.Errorf("%w: kind %q", ErrBadFault, f.Kind)
}

// liveRegion returns the named region, which must be up.
func (fi *faultInjector) liveRegion(name string) (*Region, error) {
	l := fi.lab
	for _, r := range l.Regions() {
		if r.Name == name {
			if r.down {
				return nil, fmt.Errorf("%w: region %q is down", ErrBadFault, name)
			}
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: no region %q (have %s)", ErrBadFault, name, strings.Join(l.cfg.Regions, ", "))
}

func (fi *faultInjector) eachCell(f adminapi.Fault, do func(r *Region, i int) error) error {
	r, err := fi.liveRegion(f.Region)
	if err != nil {
		return err
	}
	if len(f.Cells) == 0 {
		return fmt.Errorf("%w: %s names no cells", ErrBadFault, f.Kind)
	}
	for _, i := range f.Cells {
		if i < 0 || i >= len(r.Engines) {
			return fmt.Errorf("%w: region %s has no cell %d (0..%d)", ErrBadFault, r.Name, i, len(r.Engines)-1)
		}
	}
	for _, i := range f.Cells {
		if err := do(r, i); err != nil {
			return err
		}
	}
	return nil
}

// regionPaths returns every WAN path into or out of region (with the
// global paths when withGlobal).
func (fi *faultInjector) regionPaths(region string, withGlobal bool) ([]wanPath, error) {
	l := fi.lab
	if _, err := fi.liveRegion(region); err != nil {
		return nil, err
	}
	if len(l.fleet.members()) > 0 && region == l.cfg.Regions[0] && withGlobal {
		return nil, fmt.Errorf("%w: region %s hosts the global pair in the lab: cut off another region", ErrBadFault, region)
	}
	var out []wanPath
	for _, p := range l.router.touching(region, withGlobal) {
		out = append(out, p)
	}
	return out, nil
}

func (fi *faultInjector) wanDelay(f adminapi.Fault, heal bool) error {
	l := fi.lab
	if !heal && (f.DelayMS < 0 || f.JitterMS < 0 || f.DelayMS+f.JitterMS <= 0 || f.DelayMS > 10_000 || f.JitterMS > 10_000) {
		return fmt.Errorf("%w: wan-delay %gms jitter %gms: want 0..10000 each, not both 0", ErrBadFault, f.DelayMS, f.JitterMS)
	}
	if _, err := fi.liveRegion(f.Region); err != nil {
		return err
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for name, p := range l.router.touching(f.Region, true) {
		orig, saved := fi.delays[name]
		if heal {
			if saved {
				if err := p.SetDelay(orig[0], orig[1]); err != nil {
					return err
				}
				delete(fi.delays, name)
			}
			continue
		}
		if !saved {
			d, j := p.Delay()
			orig = [2]time.Duration{d, j}
			fi.delays[name] = orig
		}
		if err := p.SetDelay(orig[0]+ms(f.DelayMS), orig[1]+ms(f.JitterMS)); err != nil {
			return err
		}
	}
	return nil
}

// killRegion takes the whole site down at once: engines SIGKILLed, agents,
// controller, gateway, gossip member and dcgm-exporter stopped.
func (fi *faultInjector) killRegion(name string) error {
	l := fi.lab
	r, err := fi.liveRegion(name)
	if err != nil {
		return err
	}
	l.fleet.update(func() { r.down = true })
	for _, e := range r.Engines {
		e.Kill()
	}
	for _, a := range r.Agents {
		a.Stop()
	}
	r.Gateway.Stop()
	r.Ctrl.Stop()
	r.Gossip.Stop()
	stopCtx(r.DCGM.Stop)
	for _, e := range r.Engines {
		stopCtx(e.Stop)
	}
	return nil
}

// restartRegion brings a killed region back: a fresh site on the same
// ingress and gossip addresses.
func (fi *faultInjector) restartRegion(name string) error {
	l := fi.lab
	var old *Region
	for _, r := range l.Regions() {
		if r.Name == name {
			old = r
		}
	}
	if old == nil {
		return fmt.Errorf("%w: no region %q", ErrBadFault, name)
	}
	if !old.down {
		return fmt.Errorf("%w: region %s is not down", ErrBadFault, name)
	}
	ln, err := newGatedListener(old.ingress)
	if err != nil {
		return fmt.Errorf("lab: region %s ingress %s: %w", name, old.ingress, err)
	}
	r, err := l.startRegion(l.ctx, old.idx, name, ln, old.gossipAddrs)
	if err != nil {
		_ = ln.Close()
		return err
	}
	l.fleet.setRegion(old.idx, r)
	// The ingress opens once the new gateway routes to every cell: until
	// then clients are refused and fail over, as a readiness check would
	// have them.
	ctx, cancel := context.WithTimeout(l.ctx, readyTimeout)
	defer cancel()
	waitErr := waitGateway(ctx, r)
	if err := openIngress(ctx, ln, l.clock); err != nil {
		return fmt.Errorf("lab: region %s ingress %s: %w", name, old.ingress, err)
	}
	return waitErr
}

// openIngress opens ln, retrying while its port is briefly taken (an
// outgoing connection may hold it as a local port while it was unbound).
func openIngress(ctx context.Context, ln *gatedListener, clock clockwork.Clock) error {
	for {
		err := ln.open()
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-clock.After(100 * time.Millisecond):
		}
	}
}

// killLeader crashes the leading member: its etcd client closes first, so
// the session ends without a resignation and the standby waits out the
// lease; then the member stops. Heal restarts f.Member as a standby.
func (fi *faultInjector) killLeader(f adminapi.Fault, heal bool) (adminapi.Fault, error) {
	l := fi.lab
	if heal {
		for _, m := range l.fleet.members() {
			if m.name == f.Member {
				if !m.down {
					return f, fmt.Errorf("%w: global member %s is not down", ErrBadFault, m.name)
				}
				nm := *m
				if err := l.startMember(&nm); err != nil {
					return f, err
				}
				l.fleet.update(func() { *m = nm })
				return f, nil
			}
		}
		return f, fmt.Errorf("%w: no global member %q to restart", ErrBadFault, f.Member)
	}
	var leader *globalMember
	for _, m := range l.fleet.members() {
		if !m.down && m.srv.IsLeader() {
			leader = m
		}
	}
	if leader == nil {
		return f, fmt.Errorf("lab: no global member leads now")
	}
	_ = leader.cli.Close()
	leader.srv.Stop()
	l.fleet.update(func() { leader.down = true })
	f.Member = leader.name
	return f, nil
}

func (fi *faultInjector) etcdDown(heal bool) error {
	l := fi.lab
	cur := l.Etcd()
	if !heal {
		cur.Stop()
		return nil
	}
	if cur.Running() {
		return fmt.Errorf("%w: etcd is not down", ErrBadFault)
	}
	e, err := election.StartEmbedded(l.ctx, cur.Config())
	if err != nil {
		return fmt.Errorf("lab: restart etcd: %w", err)
	}
	l.fleet.update(func() { l.fleet.etcd = e })
	return nil
}

// stopController stops only region's regional controller, as a
// rescheduled process: engines, agents, gateway and gossip member keep
// running, the agents' streams break and they back off, the gateway keeps
// its last good configuration.
func (fi *faultInjector) stopController(name string, stagger bool) error {
	l := fi.lab
	r, err := fi.liveRegion(name)
	if err != nil {
		return err
	}
	if r.ctrlDown {
		return fmt.Errorf("%w: region %s's controller is already down", ErrBadFault, name)
	}
	r.Ctrl.Stop()
	nr := *r
	nr.ctrlDown = true
	if stagger {
		// Every agent but the first stays quiet until startController
		// releases it (its stream reconnects, but sends nothing).
		for i := 1; i < len(r.Agents); i++ {
			r.Agents[i].Pause(true)
			nr.staggered = append(nr.staggered, i)
		}
	}
	l.fleet.setRegion(r.idx, &nr)
	return nil
}

// startController starts a new controller for region on its predecessor's
// gRPC and HTTP addresses (the agents and the gateway dial them), with
// the same state directory; it retries while a port is briefly taken.
// The agents stopController held back are released one at a time over
// stagger, the first at once.
func (fi *faultInjector) startController(name string, stagger time.Duration) error {
	l := fi.lab
	r, err := fi.liveRegion(name)
	if err != nil {
		return err
	}
	if !r.ctrlDown {
		return fmt.Errorf("%w: region %s's controller is not down", ErrBadFault, name)
	}
	grpcAddr, httpAddr := r.Ctrl.Addr(), r.Ctrl.HTTPAddr()
	ctx, cancel := context.WithTimeout(l.ctx, readyTimeout)
	defer cancel()
	for {
		c, err := r.ctrl(l.ctx, grpcAddr, httpAddr)
		if err == nil {
			nr := *r
			nr.Ctrl, nr.ctrlDown, nr.staggered = c, false, nil
			l.fleet.setRegion(r.idx, &nr)
			fi.release(r, r.staggered, stagger)
			return nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("lab: region %s: restart controller on %s: %w", name, grpcAddr, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lab: region %s: restart controller on %s: %w", name, grpcAddr, err)
		case <-l.clock.After(100 * time.Millisecond):
		}
	}
}

// release resumes r's held-back agents idx, spread evenly over stagger
// (the last at stagger), on its own goroutine: bounded by stagger, ended
// and joined by Stop (registered last, so it runs before the agents stop).
func (fi *faultInjector) release(r *Region, idx []int, stagger time.Duration) {
	l := fi.lab
	if len(idx) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(l.ctx)
	done := make(chan struct{})
	l.onStop(func() { cancel(); <-done })
	go func() {
		defer close(done)
		start := l.clock.Now()
		for k, i := range idx {
			at := start.Add(stagger * time.Duration(k+1) / time.Duration(len(idx)))
			select {
			case <-ctx.Done():
				return
			case <-l.clock.After(at.Sub(l.clock.Now())):
			}
			r.Agents[i].Pause(false)
		}
	}()
}
