package wan

import (
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport routes a memberlist node's traffic through the WAN paths from
// that node: every packet and stream to a peer goes to the address Route
// returns for the peer's advertised address, normally the listen address
// of the path's TCP Proxy and UDPProxy (one port, both protocols, as
// memberlist uses one port for both). Route returns the address unchanged
// for peers without a path. Receiving is the wrapped transport's.
//
// Each direction of a node pair then crosses its own path: a probe goes
// out over a→b and its ack, which memberlist sends to the prober's
// advertised address, comes back over b→a, so memberlist's probe RTT is
// delay(a→b)+delay(b→a). Without a UDP path a probe gets no ack: memberlist
// falls back to a TCP ping, keeps the peer alive, and reports no RTT at all
// (see the package doc and TestMemberlistRTTNeedsUDPPath).
//
// Set it as memberlist.Config.Transport. Route is called on memberlist's
// goroutines and must be safe for concurrent use.
type Transport struct {
	memberlist.NodeAwareTransport
	Route func(addr string) string
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// WriteTo sends a packet to addr through its path.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.NodeAwareTransport.WriteTo(b, t.Route(addr))
}

// WriteToAddress sends a packet to a through its path.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	a.Addr = t.Route(a.Addr)
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

// DialTimeout opens a stream to addr through its path.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.NodeAwareTransport.DialTimeout(t.Route(addr), timeout)
}

// DialAddressTimeout opens a stream to a through its path.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	a.Addr = t.Route(a.Addr)
	return t.NodeAwareTransport.DialAddressTimeout(a, timeout)
}
