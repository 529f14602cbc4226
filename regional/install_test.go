package regional

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// TestInstallShowsOnlyWhatTheRegistryTook (issue 22 item 12): install used
// to swap the table /debug/routes shows under its lock and hand it to the
// registry outside it, so a table the registry never took (it stopped, or
// the context ended) was shown as in force, and two installers (the plan
// stream and the summaries loop) could hand the registry their tables in
// the other order from the one /debug/routes ended with. Now both happen
// under the lock, registry first.
func TestInstallShowsOnlyWhatTheRegistryTook(t *testing.T) {
	t.Run("refused table not shown", func(t *testing.T) {
		f := newLimitedFixture(t, func(c *Config) { c.InboxSize = 16 })
		s := newTestSyncer(DefaultConfig("r1").Global, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
		taken := &RouteTable{Source: RoutesLocal, Epoch: 1}
		s.routes.install(t.Context(), taken)
		if s.Routes() != taken {
			t.Fatalf("table in force %+v, want the installed one", s.Routes())
		}
		// A stopped registry with a full inbox takes nothing more.
		f.reg.Stop()
		for len(f.reg.inbox) < cap(f.reg.inbox) {
			f.reg.inbox <- message{}
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		s.routes.install(ctx, &RouteTable{Source: RoutesFallback, Epoch: 2})
		if got := s.Routes(); got != taken {
			t.Fatalf("/debug/routes shows %+v, a table the registry never took; want %+v", got, taken)
		}
	})
	t.Run("concurrent installers agree with the registry", func(t *testing.T) {
		f := newRegFixture(t)
		s := newTestSyncer(DefaultConfig("r1").Global, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 200 {
					s.routes.install(t.Context(), &RouteTable{Source: fmt.Sprintf("w%d-%d", w, i)})
				}
			})
		}
		wg.Wait()
		// The inbox is FIFO: once a later request is answered, every
		// table handed over before it has been applied.
		if err := f.reg.SetDrain(t.Context(), "nobody", true); !errors.Is(err, ErrUnknownCell) {
			t.Fatalf("sync request: %v", err)
		}
		f.reg.Stop() // joins the registry goroutine: its fields are ours to read
		if got, want := f.reg.routes, s.Routes(); got != want {
			t.Fatalf("registry serves %q, /debug/routes shows %q", got.Source, want.Source)
		}
	})
}
