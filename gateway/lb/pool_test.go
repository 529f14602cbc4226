package lb

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func TestNewPool(t *testing.T) {
	seeds := newScript(t, 10, 11, 12, 13)
	p, err := NewPool(DefaultPolicy(RoundRobin), 0, seeds)
	if err != nil {
		t.Fatal(err)
	}
	seeds.done() // one seed per worker, DefaultWorkers of them
	if p.Workers() != DefaultWorkers {
		t.Errorf("Workers = %d, want %d", p.Workers(), DefaultWorkers)
	}
	if _, err := NewPool(DefaultPolicy(RoundRobin), -1, newScript(t)); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("NewPool(-1 workers) error = %v, want ErrInvalidPolicy", err)
	}
	if _, err := NewPool(Policy{}, 2, newScript(t)); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("NewPool(zero policy) error = %v, want ErrInvalidPolicy", err)
	}
}

// TestPoolWorkers: workers keep their own round-robin indexes and EDF
// schedules but read the same active counts.
func TestPoolWorkers(t *testing.T) {
	type step struct {
		worker int
		active Counts // shared counts when the pick is made
		draws  []uint64
		want   int
	}
	tests := []struct {
		name    string
		policy  Policy
		seeds   []uint64
		weights []uint32
		steps   []step
	}{
		{
			// Worker 0's index starts at 0, worker 1's at 1; each moves
			// only on its own picks.
			name: "round robin indexes per worker", policy: DefaultPolicy(RoundRobin),
			seeds: []uint64{0, 1}, weights: []uint32{1, 1, 1},
			steps: []step{
				{worker: 0, want: 0}, {worker: 1, want: 1}, {worker: 0, want: 1},
				{worker: 1, want: 2}, {worker: 1, want: 0}, {worker: 0, want: 2},
			},
		},
		{
			// Both workers draw hosts 0 then 1. Worker 0 sees 0,0: tie,
			// keeps h0. Its request is in flight when worker 1 picks: h0
			// has 1, so worker 1 takes h1.
			name: "P2C reads counts other workers raised", policy: DefaultPolicy(LeastRequest),
			seeds: []uint64{0, 0}, weights: []uint32{1, 1},
			steps: []step{
				{worker: 0, active: Counts{0, 0}, draws: []uint64{0, 1}, want: 0},
				{worker: 1, active: Counts{1, 0}, draws: []uint64{0, 1}, want: 1},
			},
		},
		{
			// Weights 1,2, both seeds 0: identical schedules at first
			// (h0 1-1e-13, h1 0.5⁻). Each worker re-adds with the shared
			// count at its own pick time.
			name: "least request EDF per worker", policy: DefaultPolicy(LeastRequest),
			seeds: []uint64{0, 0}, weights: []uint32{1, 2},
			steps: []step{
				// w0: h1@0.5⁻ → 2/1 → 1-2.5e-14.
				{worker: 0, active: Counts{0, 0}, want: 1},
				// w1 has its own schedule, so it also picks h1 — and
				// re-adds it with 2/(1+1)=1 (w0's request counts) → 1.5⁻.
				{worker: 1, active: Counts{0, 1}, want: 1},
				// w0: h0@1-1e-13 → 1/1 → 2⁻.
				{worker: 0, active: Counts{0, 2}, want: 0},
				// w1: h0@1-1e-13 → 1/2 → 3⁻.
				{worker: 1, active: Counts{1, 2}, want: 0},
				// w0: h1@1-2.5e-14 → 2/3 → 2.5⁻. w1's h1 is at 1.5⁻.
				{worker: 0, active: Counts{2, 2}, want: 1},
				// w0: h0@2⁻ before its h1@2.5⁻.
				{worker: 0, active: Counts{2, 3}, want: 0},
				// w1: h1@1.5⁻ (its h0 is at 3⁻).
				{worker: 1, active: Counts{3, 3}, want: 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seeds := newScript(t, tt.seeds...)
			p, err := NewPool(tt.policy, len(tt.seeds), seeds)
			if err != nil {
				t.Fatal(err)
			}
			seeds.done()
			p.Update(tt.weights, tt.steps[0].active)
			for i, s := range tt.steps {
				r := newScript(t, append([]uint64{x}, s.draws...)...)
				if got, ok := p.Pick(s.worker, r, s.active); !ok || got != s.want {
					t.Fatalf("step %d (worker %d, active %v): Pick = %d, %v; want %d", i+1, s.worker, s.active, got, ok, s.want)
				}
				r.done()
			}
		})
	}
}

// atomicCounts is an Active that workers on several goroutines share.
type atomicCounts []atomic.Uint64

func (c atomicCounts) Active(h int) uint64 { return c[h].Load() }

// TestPoolConcurrentWorkers runs each worker on its own goroutine, as Envoy
// runs each worker's load balancer on its own thread, with shared atomic
// counts (run with -race): every pick names a host in the set, and the
// counts the caller keeps balance out.
func TestPoolConcurrentWorkers(t *testing.T) {
	for _, name := range []string{"round_robin", "least_request", "least_request_full_scan"} {
		for _, weights := range [][]uint32{{1, 1, 0, 1}, {1, 2, 0, 3}} {
			t.Run(fmt.Sprint(name, weights), func(t *testing.T) {
				policy, _ := ParsePolicy(name)
				pool, err := NewPool(policy, 4, rand.New(rand.NewPCG(1, 2)))
				if err != nil {
					t.Fatal(err)
				}
				counts := make(atomicCounts, len(weights))
				pool.Update(weights, counts)
				var picked [4][4]int
				var wg sync.WaitGroup
				for w := range pool.Workers() {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(w), 9))
						var inflight []int
						for i := range 2000 {
							h, ok := pool.Pick(w, r, counts)
							if !ok || weights[h] == 0 {
								t.Errorf("worker %d: Pick = %d, %v", w, h, ok)
								return
							}
							picked[w][h]++
							counts[h].Add(1)
							inflight = append(inflight, h)
							if i%3 == 2 { // finish the oldest request
								counts[inflight[0]].Add(^uint64(0))
								inflight = inflight[1:]
							}
						}
						for _, h := range inflight {
							counts[h].Add(^uint64(0))
						}
					})
				}
				wg.Wait()
				for h := range counts {
					if c := counts[h].Load(); c != 0 {
						t.Errorf("host %d: %d requests left in flight", h, c)
					}
				}
				for w := range picked {
					total := 0
					for _, n := range picked[w] {
						total += n
					}
					if total != 2000 {
						t.Errorf("worker %d made %d picks, want 2000", w, total)
					}
				}
			})
		}
	}
}
