package scale

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// procFleet runs a point's cells in child processes (Deps.CellProcess),
// dealt round-robin: each child is a real gRPC client on its own
// connections, with its own descriptor limit, and its senders' CPU is
// apart from the controllers'.
type procFleet struct {
	procs    []*cellProc
	interval time.Duration
	seed     uint64
	clock    clockwork.Clock

	mu    sync.Mutex
	owner map[string]*cellProc
	// sinks maps a cell's endpoint to its process's probe sink.
	sinks map[string]string
}

// startProcFleet starts n children. On error every child started is
// reaped before it returns.
func startProcFleet(ctx context.Context, n int, newCmd func() *exec.Cmd, interval time.Duration, seed uint64, clock clockwork.Clock) (*procFleet, error) {
	f := &procFleet{interval: interval, seed: seed, clock: clock, owner: map[string]*cellProc{}, sinks: map[string]string{}}
	for range n {
		p, err := startCellProc(ctx, newCmd, clock)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.procs = append(f.procs, p)
	}
	return f, nil
}

// minFDLimit is the lowest descriptor limit a child reported (0: none
// known).
func (f *procFleet) minFDLimit() uint64 {
	var lim uint64
	for _, p := range f.procs {
		if l := p.hello.FDLimit; l > 0 && (lim == 0 || l < lim) {
			lim = l
		}
	}
	return lim
}

// pids are the children's process ids.
func (f *procFleet) pids() []int {
	out := make([]int, len(f.procs))
	for i, p := range f.procs {
		out[i] = p.hello.PID
	}
	return out
}

func (f *procFleet) start(ctx context.Context, specs []cellSpec) ([]string, error) {
	n := len(f.procs)
	parts := make([][]cellSpec, n)
	for i, s := range specs {
		parts[i%n] = append(parts[i%n], s)
	}
	got, eps := make([][]string, n), make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range f.procs {
		wg.Go(func() {
			rep, err := p.call(ctx, childRequest{Op: opStart, Cells: parts[i], HeartbeatIntervalNs: int64(f.interval), Seed: f.seed})
			if err == nil && (len(rep.IDs) != len(parts[i]) || len(rep.Endpoints) != len(parts[i])) {
				err = fmt.Errorf("scale: cell process %d started %d cells (%d endpoints) of %d", p.hello.PID, len(rep.IDs), len(rep.Endpoints), len(parts[i]))
			}
			got[i], eps[i], errs[i] = rep.IDs, rep.Endpoints, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	ids := make([]string, len(specs))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range specs {
		id, p := got[i%n][i/n], f.procs[i%n]
		ids[i] = id
		f.owner[id] = p
		if p.hello.ProbeSink != "" {
			f.sinks[eps[i%n][i/n]] = p.hello.ProbeSink
		}
	}
	return ids, nil
}

func (f *procFleet) probeSink(endpoint string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr, ok := f.sinks[endpoint]
	return addr, ok
}

func (f *procFleet) proc(id string) (*cellProc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.owner[id]
	if p == nil {
		return nil, fmt.Errorf("scale: no cell %q", id)
	}
	return p, nil
}

func (f *procFleet) one(ctx context.Context, op, id string) error {
	p, err := f.proc(id)
	if err != nil {
		return err
	}
	_, err = p.call(ctx, childRequest{Op: op, Cell: id})
	return err
}

// kill returns the child's time of the close, read on this fleet's clock
// (the child's wall clock is this machine's).
func (f *procFleet) kill(ctx context.Context, id string) (time.Time, error) {
	p, err := f.proc(id)
	if err != nil {
		return time.Time{}, err
	}
	rep, err := p.call(ctx, childRequest{Op: opKill, Cell: id})
	if err != nil {
		return time.Time{}, err
	}
	if rep.KilledAtUnixNs == 0 {
		return time.Time{}, fmt.Errorf("scale: cell process %d: kill %s: no time of the close in the reply", p.cmd.Process.Pid, id)
	}
	return f.clock.Now().Add(time.Until(time.Unix(0, rep.KilledAtUnixNs))), nil
}

func (f *procFleet) silence(ctx context.Context, id string) error { return f.one(ctx, opSilence, id) }
func (f *procFleet) revive(ctx context.Context, id string) error  { return f.one(ctx, opRevive, id) }

func (f *procFleet) up(ctx context.Context, ids []string) (bool, error) {
	by := map[*cellProc][]string{}
	for _, id := range ids {
		p, err := f.proc(id)
		if err != nil {
			return false, err
		}
		by[p] = append(by[p], id)
	}
	for p, ids := range by {
		rep, err := p.call(ctx, childRequest{Op: opUp, IDs: ids})
		if err != nil || !rep.Up {
			return false, err
		}
	}
	return true, nil
}

func (f *procFleet) stats(ctx context.Context) (fleetStats, error) {
	var s fleetStats
	for _, p := range f.procs {
		rep, err := p.call(ctx, childRequest{Op: opStats})
		if err != nil {
			return s, err
		}
		if rep.Stats == nil {
			return s, fmt.Errorf("scale: cell process %d: stats reply without stats", p.hello.PID)
		}
		st := rep.Stats
		s.heartbeats += st.Heartbeats
		s.bytes += st.HeartbeatBytes
		s.streamErrors += st.StreamErrors
		s.cpu += time.Duration(st.CPUNs)
		s.rss += st.RSSBytes
		if st.LastError != "" {
			s.lastError = st.LastError
		}
	}
	return s, nil
}

// stop stops every child at once and returns when all are reaped.
func (f *procFleet) stop() {
	var wg sync.WaitGroup
	for _, p := range f.procs {
		wg.Go(p.stop)
	}
	wg.Wait()
}
