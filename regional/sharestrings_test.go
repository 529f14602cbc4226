package regional

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// decoded is hb as a heartbeat decoded off the wire holds it: every string
// a copy of its own.
func decoded(hb *isobarpb.CellHeartbeat) *isobarpb.CellHeartbeat {
	hb.CellId, hb.Endpoint, hb.Incarnation, hb.Region = strings.Clone(hb.CellId), strings.Clone(hb.Endpoint), strings.Clone(hb.Incarnation), strings.Clone(hb.Region)
	hb.Capability.Model = strings.Clone(hb.Capability.Model)
	return hb
}

func same(a, b string) bool { return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b) }

// A cell's later heartbeats, each with its own copies of the strings, reach
// the view holding the strings the registry already held: the cell's id
// and its first heartbeat's endpoint, incarnation and model; and a second
// cell of the same model holds the first's model name. A string that
// changed is the new one.
func TestHeartbeatStringsShared(t *testing.T) {
	f := newRegFixture(t)
	f.send(decoded(heartbeat("c1", "10.0.0.1:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)))
	first, _ := f.reg.View().Cell("c1")
	for range 3 {
		f.send(decoded(heartbeat("c1", "10.0.0.1:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)))
	}
	later, _ := f.reg.View().Cell("c1")
	for _, p := range []struct{ name, a, b string }{
		{"id", first.ID, later.ID}, {"endpoint", first.Endpoint, later.Endpoint},
		{"incarnation", first.Incarnation, later.Incarnation}, {"model", first.Model, later.Model},
	} {
		if !same(p.a, p.b) {
			t.Errorf("the %s of a later heartbeat is a copy of its own, not the one the registry held", p.name)
		}
	}
	f.send(decoded(heartbeat("c2", "10.0.0.2:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)))
	other, _ := f.reg.View().Cell("c2")
	if !same(other.Model, first.Model) {
		t.Error("a second cell of the same model holds its own copy of the model's name")
	}
	moved := decoded(heartbeat("c1", "10.0.0.9:8000", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	f.send(moved)
	if now, _ := f.reg.View().Cell("c1"); now.Endpoint != "10.0.0.9:8000" || !same(now.ID, first.ID) {
		t.Errorf("after a move: endpoint %q (want the new one), id shared %v", now.Endpoint, same(now.ID, first.ID))
	}
}
