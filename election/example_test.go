package election_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/isobar-mesh/isobar/election"
)

// Two candidates on an embedded etcd: the first leads and writes through
// the fence; after it resigns the second leads, and the first one's stale
// write is refused.
func Example() {
	dir, err := os.MkdirTemp("", "election-example")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ctx := context.Background()
	etcd, err := election.StartEmbedded(ctx, election.EmbeddedConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		panic(err)
	}
	defer etcd.Stop()
	cli, err := etcd.Client()
	if err != nil {
		panic(err)
	}
	defer func() { _ = cli.Close() }()

	a, _ := election.NewCandidate(cli, election.Config{ID: "global-a@10.0.0.1:7000", TTL: election.DefaultTTL}, election.Deps{})
	b, _ := election.NewCandidate(cli, election.Config{ID: "global-b@10.0.0.2:7000"}, election.Deps{})

	la, _ := a.Campaign(ctx)
	id, _, _ := election.Leader(ctx, cli, "")
	fmt.Println("leader:", id)
	fmt.Println("a writes:", election.FencedPut(ctx, cli, la, "/isobar/global/plan", "plan-1"))

	won := make(chan *election.Leadership)
	go func() {
		lb, _ := b.Campaign(ctx)
		won <- lb
	}()
	_ = a.Resign(ctx)
	lb := <-won
	id, _, _ = election.Leader(ctx, cli, "")
	fmt.Println("leader:", id, "epoch increased:", lb.Epoch > la.Epoch)
	err = election.FencedPut(ctx, cli, la, "/isobar/global/plan", "stale")
	fmt.Println("a writes again, not leader:", errors.Is(err, election.ErrNotLeader))
	_ = b.Resign(ctx)
	// Output:
	// leader: global-a@10.0.0.1:7000
	// a writes: <nil>
	// leader: global-b@10.0.0.2:7000 epoch increased: true
	// a writes again, not leader: true
}
