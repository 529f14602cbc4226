package placement_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/isobar-mesh/isobar/gateway/placement"
)

// Three engines: a fast one with a long prefill queue, a slow idle one, and
// a far idle one. A 2,000-token prompt goes where it would see its first
// token soonest.
func ExamplePick() {
	hosts := []placement.Host{
		{Weight: 1, PendingPromptTokens: 12000, PrefillTokensPerSecond: 40000, InFlight: 6}, // 0.35 s + 6 × 25 ms
		{Weight: 1, PrefillTokensPerSecond: 8000, InFlight: 1},                              // 0.25 s + 25 ms
		{Weight: 1, RTT: 80 * time.Millisecond, Jitter: 10 * time.Millisecond},              // 0.1 s at 20k/s + 0.1 s
	}
	cfg := placement.DefaultConfig()
	for i, h := range hosts {
		fmt.Printf("host %d: %.3f s\n", i, placement.ExpectedTTFT(cfg, h, 2000))
	}
	i, _ := placement.Pick(cfg, hosts, 2000, rand.New(rand.NewPCG(1, 2)))
	fmt.Println("pick:", i)
	// Output:
	// host 0: 0.500 s
	// host 1: 0.275 s
	// host 2: 0.200 s
	// pick: 2
}
