package sim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// maxCatchUp bounds how late the scheduler may wake and still start the
// next step at the previous step's due time, so that wake-up latency does
// not accumulate into the model's step times.
const maxCatchUp = 20 * time.Millisecond

// seqState is one sequence in flight. The HTTP handler builds it
// (Engine.sequences) and hands it over with submit; from then on the
// scheduler goroutine owns every field except tokens, done and notify,
// which it publishes to the handler: tokens is stored before notify is
// signalled, and err and finish are written before done is closed.
type seqState struct {
	id        SeqID
	prompt    int
	maxTokens int
	hashes    []uint64  // the prompt's block hash chain (nil: no prefix caching); the Batcher's once added
	arrival   time.Time // request arrival at the API server
	enqueued  time.Time // joined the waiting queue
	admitted  time.Time
	firstAt   time.Time
	lastAt    time.Time

	tokens atomic.Int64
	done   chan struct{}
	notify chan struct{} // shared by the sequences of one request, capacity 1
	err    error
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// scheduler drives the Batcher of one engine incarnation with the clock.
// Handlers hand work over through submit and abort (non-blocking, under
// mu); only the run goroutine touches the Batcher, live and the prefix
// totals.
type scheduler struct {
	e     *Engine
	b     *Batcher
	vm    *vllmMetrics
	clock clockwork.Clock
	gpu   *GPU
	scale float64

	mu     sync.Mutex
	inbox  []*seqState
	aborts []SeqID
	nextID SeqID
	snap   EngineStats
	wake   chan struct{}

	live map[SeqID]*seqState
	// The Batcher's prefix-cache totals last added to the counters.
	prefixQueries, prefixHits int64
}

func newScheduler(e *Engine, vm *vllmMetrics) *scheduler {
	b, err := NewBatcher(e.prof)
	if err != nil {
		panic("sim: profile validated in NewEngine: " + err.Error())
	}
	return &scheduler{
		e: e, b: b, vm: vm, clock: e.clock, gpu: e.gpu, scale: e.cfg.TimeScale,
		wake: make(chan struct{}, 1),
		live: make(map[SeqID]*seqState),
	}
}

// submit queues a request's sequences (one per prompt, built by
// Engine.sequences), naming them and stamping their enqueue time. From
// then on they are shared with the caller as described on seqState; it
// returns qs.
func (s *scheduler) submit(qs []*seqState) []*seqState {
	now := s.clock.Now()
	s.mu.Lock()
	for _, q := range qs {
		s.nextID++
		q.id, q.enqueued = s.nextID, now
		s.inbox = append(s.inbox, q)
	}
	s.mu.Unlock()
	signal(s.wake)
	return qs
}

// abort drops the sequences of a request whose client went away.
func (s *scheduler) abort(qs []*seqState) {
	s.mu.Lock()
	for _, q := range qs {
		s.aborts = append(s.aborts, q.id)
	}
	s.mu.Unlock()
	signal(s.wake)
}

func (s *scheduler) snapshot() EngineStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

// drain moves handed-over work into the Batcher.
func (s *scheduler) drain() {
	s.mu.Lock()
	in, ab := s.inbox, s.aborts
	s.inbox, s.aborts = nil, nil
	s.mu.Unlock()
	for _, q := range in {
		err := s.b.AddBlocks(q.id, q.prompt, q.maxTokens, q.hashes)
		q.hashes = nil // the Batcher holds the chain now
		if err != nil {
			q.err = err
			close(q.done)
			continue
		}
		s.live[q.id] = q
	}
	for _, id := range ab {
		if q, ok := s.live[id]; ok {
			s.b.Abort(id)
			delete(s.live, id)
			s.vm.success[finishAbort].Inc()
			q.err = context.Canceled
			close(q.done)
		}
	}
	if len(in) > 0 || len(ab) > 0 {
		s.publish()
	}
}

// publish updates the gauges, the prefix-cache counters and the snapshot.
func (s *scheduler) publish() {
	st := s.b.Stats()
	s.vm.running.Set(float64(st.Running))
	s.vm.waiting.Set(float64(st.Waiting))
	s.vm.kvUsage.Set(st.KVUsage)
	// The Batcher counts at admission; the counters follow its totals.
	s.vm.prefixQueries.Add(float64(st.PrefixQueries - s.prefixQueries))
	s.vm.prefixHits.Add(float64(st.PrefixHits - s.prefixHits))
	s.prefixQueries, s.prefixHits = st.PrefixQueries, st.PrefixHits
	s.mu.Lock()
	s.snap.Running, s.snap.Waiting, s.snap.KVUsage = st.Running, st.Waiting, st.KVUsage
	s.snap.PrefixQueries, s.snap.PrefixHits = st.PrefixQueries, st.PrefixHits
	s.mu.Unlock()
}

// run is the scheduler goroutine: it steps the Batcher, waits each step's
// duration on the clock and publishes the tokens. It returns when ctx is
// done, dropping whatever is in flight.
func (s *scheduler) run(ctx context.Context) {
	var lastDue time.Time
	for {
		s.drain()
		if gate := s.e.hangGate(); gate != nil {
			lastDue = time.Time{}
			select {
			case <-ctx.Done():
				return
			case <-gate:
			}
			continue
		}
		if s.b.Idle() {
			lastDue = time.Time{} // the next step starts when work arrives
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			continue
		}
		now := s.clock.Now()
		start := now
		if !lastDue.IsZero() && !now.Before(lastDue) && now.Sub(lastDue) < maxCatchUp {
			start = lastDue
		}
		st := s.b.Step()
		mult := s.gpu.StepMultiplier(start)
		d := time.Duration(float64(st.Duration) * mult * s.scale)
		due := start.Add(d)
		share := 0.0
		if st.Duration > 0 {
			share = float64(st.PrefillDuration) / float64(st.Duration)
		}
		s.gpu.RecordStep(start, due, StepLoad{Batch: st.Scheduled, PrefillShare: share, Tokens: len(st.Tokens)})
		for _, id := range st.Admitted {
			if q, ok := s.live[id]; ok && q.admitted.IsZero() {
				q.admitted = start
				if q.admitted.Before(q.enqueued) {
					q.admitted = q.enqueued
				}
			}
		}
		s.publish()
		if wait := due.Sub(s.clock.Now()); wait > 0 {
			t := s.clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.Chan():
			}
		}
		lastDue = due
		s.deliver(&st, s.clock.Now())
	}
}

// deliver publishes a finished step's tokens at now.
func (s *scheduler) deliver(st *Step, now time.Time) {
	vm := s.vm
	// Count the tokens before any handler can see them.
	s.mu.Lock()
	s.snap.GeneratedTokens += int64(len(st.Tokens))
	s.mu.Unlock()
	vm.promptTokens.Add(float64(st.PromptTokensDone))
	vm.preemptions.Add(float64(len(st.Preempted)))
	vm.iterTokens.Observe(float64(st.PrefillTokens + st.Decodes))
	for _, ev := range st.Tokens {
		q := s.live[ev.ID]
		if q == nil {
			continue // aborted while the step ran
		}
		if ev.N == 1 {
			q.firstAt = now
			vm.ttft.Observe(now.Sub(q.arrival).Seconds())
		} else {
			vm.itl.Observe(now.Sub(q.lastAt).Seconds())
		}
		q.lastAt = now
		q.tokens.Store(int64(ev.N))
		if ev.Done {
			delete(s.live, ev.ID)
			admitted := q.admitted
			if admitted.IsZero() {
				admitted = q.enqueued
			}
			vm.success[finishLength].Inc()
			vm.e2e.Observe(now.Sub(q.arrival).Seconds())
			vm.queue.Observe(admitted.Sub(q.enqueued).Seconds())
			vm.inference.Observe(now.Sub(admitted).Seconds())
			vm.prefill.Observe(q.firstAt.Sub(admitted).Seconds())
			vm.decode.Observe(now.Sub(q.firstAt).Seconds())
			vm.promptHist.Observe(float64(q.prompt))
			vm.genHist.Observe(float64(ev.N))
			close(q.done)
		}
		signal(q.notify)
	}
	vm.generationTokens.Add(float64(len(st.Tokens)))
	s.publish()
}
