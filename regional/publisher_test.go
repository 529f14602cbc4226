package regional

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional/xds"
)

// The publisher hands back each state it is done with, for the registry
// to build the next one in: one replaced before its push at once, a
// pushed or refused one after its push returns, never one still pushing.
func TestPublisherSpentStates(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan string), make(chan struct{})
	push := func(st xds.State) (string, error) {
		entered <- st.Models[0].Name
		<-release
		if st.Models[0].Name == "refused" {
			return "", xds.ErrStopped
		}
		return "1", nil
	}
	p := newPublisher(push, clockwork.NewFakeClock(), slog.New(slog.DiscardHandler), m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	state := func(name string) xds.State { return xds.State{Models: []xds.Model{{Name: name}}} }
	name := func(st xds.State) string {
		if len(st.Models) == 0 {
			return ""
		}
		return st.Models[0].Name
	}

	if got := name(p.takeSpent()); got != "" {
		t.Fatalf("spent before any offer: %q", got)
	}
	p.offer(state("a"), nil)
	if got := <-entered; got != "a" {
		t.Fatalf("pushing %q", got)
	}
	// a is being pushed: not spent. b then c queue; c replaces b.
	p.offer(state("b"), nil)
	if got := name(p.takeSpent()); got != "" {
		t.Fatalf("spent while a pushes and b waits: %q", got)
	}
	p.offer(state("refused"), nil)
	if got := name(p.takeSpent()); got != "b" {
		t.Fatalf("spent after b was replaced: %q, want b", got)
	}
	release <- struct{}{} // a's push returns
	if got := <-entered; got != "refused" {
		t.Fatalf("pushing %q", got)
	}
	if got := name(p.takeSpent()); got != "a" {
		t.Fatalf("spent after a was pushed: %q, want a", got)
	}
	if got := name(p.takeSpent()); got != "" {
		t.Fatalf("a was handed out twice: %q", got)
	}
	release <- struct{}{}    // the refused push returns
	p.offer(state("d"), nil) // waits for the publisher to be back for it
	if got := <-entered; got != "d" {
		t.Fatalf("pushing %q", got)
	}
	if got := name(p.takeSpent()); got != "refused" {
		t.Fatalf("spent after a refused push: %q, want refused", got)
	}
	release <- struct{}{}
}
