package lb

import "fmt"

// DefaultWorkers is the worker count NewPool uses for 0. (Envoy's own
// default, --concurrency, is the machine's hardware thread count; four is
// the benchmark's model of a proxy.)
const DefaultWorkers = 4

// Pool is one Envoy process's load balancers for one cluster: a Balancer
// per worker thread, each with its own round-robin index and EDF schedule,
// all reading the same active-request counts (which the caller owns and
// passes to every call). Which worker handles a request — in Envoy, the
// worker whose listener accepted the downstream connection — is the
// caller's choice.
//
// Concurrency: Pick for different workers may run on different goroutines
// (one goroutine per worker, like Envoy's threads) if the Active passed is
// safe for concurrent use; Update must not run concurrently with anything.
type Pool struct {
	workers []*Balancer
}

// NewPool returns workers balancers (0 means DefaultWorkers). Each draws its
// seed from seeds in worker order, as each Envoy worker's load balancer
// draws seed_ from the random generator when it is built. The error wraps
// ErrInvalidPolicy.
func NewPool(p Policy, workers int, seeds Rand) (*Pool, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if workers < 0 {
		return nil, fmt.Errorf("%w: %d workers, must be >= 0", ErrInvalidPolicy, workers)
	}
	if workers == 0 {
		workers = DefaultWorkers
	}
	pool := &Pool{workers: make([]*Balancer, workers)}
	for i := range pool.workers {
		b, err := NewBalancer(p, seeds.Uint64())
		if err != nil {
			return nil, err
		}
		pool.workers[i] = b
	}
	return pool, nil
}

// Workers is the number of workers.
func (p *Pool) Workers() int { return len(p.workers) }

// Worker returns worker i's balancer. It panics if i is out of range.
func (p *Pool) Worker(i int) *Balancer { return p.workers[i] }

// Update refreshes every worker with the new weights (see Balancer.Update),
// as every Envoy worker refreshes its thread-local host set.
func (p *Pool) Update(weights []uint32, active Active) {
	for _, b := range p.workers {
		b.Update(weights, active)
	}
}

// Pick has worker pick a host for one request (see Balancer.Pick). It
// panics if worker is out of range.
func (p *Pool) Pick(worker int, r Rand, active Active) (host int, ok bool) {
	return p.workers[worker].Pick(r, active)
}
