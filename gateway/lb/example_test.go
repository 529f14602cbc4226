package lb_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/isobar-mesh/isobar/gateway/lb"
)

// A 4-worker least-request pool over four equally weighted hosts (so each
// pick is power-of-two-choices): each request brings its own random draws,
// and the active counts are shared by all workers and owned by the caller.
func ExamplePool() {
	policy, _ := lb.ParsePolicy("least_request")
	pool, _ := lb.NewPool(policy, 4, rand.New(rand.NewPCG(1, 1))) // one seed per worker
	active := make(lb.Counts, 4)                                  // in flight, per host
	pool.Update([]uint32{1, 1, 1, 1}, active)                     // equal weights: P2C
	var hosts []int
	for req := range 8 {
		r := rand.New(rand.NewPCG(uint64(req), 7)) // this request's draws
		host, _ := pool.Pick(req%pool.Workers(), r, active)
		active[host]++ // the request starts; decrement when it ends
		hosts = append(hosts, host)
	}
	fmt.Println("hosts:", hosts)
	fmt.Println("active:", active)
	// Output:
	// hosts: [1 2 0 1 0 3 2 3]
	// active: [2 2 2 2]
}
