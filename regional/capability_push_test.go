package regional

import (
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// TestCapabilityChangeAloneIsPushed: a cell that restarts with another
// capability (a shorter max_model_len, another max_num_seqs or prefill
// rate) and the same state and load changes what its endpoint publishes
// but no weight. The cycle that sees it must offer a state carrying it:
// a data plane that keeps the old max_model_len sends the cell prompts it
// refuses (the capability-mismatch drill). Before the fix such a change
// waited for a push with another cause, a weight or a round trip's drift.
func TestCapabilityChangeAloneIsPushed(t *testing.T) {
	changes := []struct {
		name string
		set  func(*isobarpb.Capability)
		got  func(xds.Endpoint) bool
	}{
		{"max_model_len", func(c *isobarpb.Capability) { c.MaxModelLen = 1024 }, func(e xds.Endpoint) bool { return e.MaxModelLen == 1024 }},
		{"max_num_seqs", func(c *isobarpb.Capability) { c.MaxNumSeqs = 7 }, func(e xds.Endpoint) bool { return e.MaxNumSeqs == 7 }},
		{"prefill_tokens_per_s", func(c *isobarpb.Capability) { c.PrefillTokensPerS = 1234 }, func(e xds.Endpoint) bool { return e.PrefillTokensPerSecond == 1234 }},
	}
	for _, ch := range changes {
		for _, arrival := range []bool{false, true} {
			name := ch.name
			if arrival {
				// Another cell registers (still loading) in the same cycle:
				// the order changes and the slots are remade.
				name += "/with_a_cell_arriving"
			}
			t.Run(name, func(t *testing.T) {
				cb := newCycleBenchFleet(t, 4, xds.Config{Region: "r1", Zone: "r1"}, false)
				seq := uint64(1)
				step := func(change bool) *xds.State {
					cb.clock.Advance(cb.cfg.Projection.MinInterval)
					now := cb.clock.Now()
					seq++
					for i, h := range cb.hbs {
						hb := heartbeat(h.CellId, h.Endpoint, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, seq)
						if change && i == 0 {
							ch.set(hb.Capability)
						}
						cb.r.applyHeartbeat(now, hb)
					}
					if change && arrival {
						cb.r.applyHeartbeat(now, heartbeat("cell-new", "10.200.0.1:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, seq))
					}
					cb.r.cycle(now)
					cb.r.pub.mu.Lock()
					st := cb.r.pub.pending
					cb.r.pub.pending = nil
					cb.r.pub.mu.Unlock()
					if st != nil {
						c := cloneState(*st)
						cb.r.pub.spend(st)
						return &c
					}
					return nil
				}
				// The fleet settles: the weights stop moving and the cycles
				// stop offering.
				quiet := 0
				for i := 0; i < 60 && quiet < 3; i++ {
					if step(false) == nil {
						quiet++
					} else {
						quiet = 0
					}
				}
				if quiet < 3 {
					t.Fatal("the fleet never settled: every cycle offered a state")
				}
				st := step(true)
				if st == nil {
					t.Fatalf("cell %s restarted with a new %s and no cycle offered it", cb.hbs[0].CellId, ch.name)
				}
				found := false
				for _, m := range st.Models {
					for _, l := range m.Localities {
						for _, e := range l.Endpoints {
							if e.CellID == cb.hbs[0].CellId {
								found = true
								if !ch.got(e) {
									t.Errorf("the offered endpoint %+v does not carry the new %s", e, ch.name)
								}
							}
						}
					}
				}
				if !found {
					t.Errorf("the offer does not hold %s", cb.hbs[0].CellId)
				}
				if step(true) != nil {
					t.Error("the cycle after offered again with nothing changed")
				}
			})
		}
	}
}
