package lab

import (
	"net"
	"sync"
)

// gatedListener is a region's ingress that is not bound until open: while
// a restarted site's gateway has no routes yet, its address refuses
// connections, as an ingress kept out of DNS or a load balancer by a
// failing readiness check would, so clients fail over instead of reaching
// a gateway that can only answer 503. Accept blocks until open or Close.
type gatedListener struct {
	addr *net.TCPAddr

	mu     sync.Mutex
	ln     net.Listener
	closed bool
	ready  chan struct{} // closed by open or Close
}

func newGatedListener(addr string) (*gatedListener, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &gatedListener{addr: a, ready: make(chan struct{})}, nil
}

// open binds the address; later Accepts take connections.
func (g *gatedListener) open() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return net.ErrClosed
	}
	if g.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", g.addr.String())
	if err != nil {
		return err
	}
	g.ln = ln
	close(g.ready)
	return nil
}

func (g *gatedListener) Accept() (net.Conn, error) {
	<-g.ready
	g.mu.Lock()
	ln := g.ln
	g.mu.Unlock()
	if ln == nil {
		return nil, net.ErrClosed
	}
	return ln.Accept()
}

func (g *gatedListener) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.ln == nil {
		close(g.ready)
		return nil
	}
	return g.ln.Close()
}

func (g *gatedListener) Addr() net.Addr { return g.addr }

var _ net.Listener = (*gatedListener)(nil)
