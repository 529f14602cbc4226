package gossip

import (
	"testing"

	"go.uber.org/goleak"
)

// memberlist's probe goroutine outlives Shutdown until its probe's ack
// deadline (one probe interval) passes: a bounded straggler of the
// library, not a leak of ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
