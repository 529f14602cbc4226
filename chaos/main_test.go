package chaos

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them.
// memberlist's probe goroutine (the lab's gossip) outlives Shutdown until
// its probe's ack deadline passes: a bounded straggler of the library.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
