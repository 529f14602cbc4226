package gossip

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport counts what memberlist sends through it.
type countingTransport struct {
	memberlist.NodeAwareTransport
	packets, streams *atomic.Int64
}

func (c *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	c.packets.Add(1)
	return c.NodeAwareTransport.WriteToAddress(b, a)
}

func (c *countingTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	c.streams.Add(1)
	return c.NodeAwareTransport.DialAddressTimeout(a, d)
}

// Deps.WrapTransport puts a wrapper between memberlist and its sockets
// (the lab's WAN paths), with the ephemeral port still advertised.
func TestWrapTransport(t *testing.T) {
	var packets, streams atomic.Int64
	wrap := func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		return &countingTransport{NodeAwareTransport: nt, packets: &packets, streams: &streams}
	}
	a := startNode(t, regional("a"), Deps{WrapTransport: wrap})
	b := startNode(t, regional("b", a.Addr()), Deps{})
	if err := a.SetLocalSummary(summary("a", "i", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b has a's summary", func() bool { _, ok := b.Summaries()["a"]; return ok })
	waitFor(t, 10*time.Second, "a's probes go through the wrapper", func() bool { return packets.Load() > 0 })
	t.Logf("through the wrapper: %d packets, %d streams; a at %s", packets.Load(), streams.Load(), a.Addr())
}
