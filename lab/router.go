package lab

import (
	"context"
	"net"
	"strings"
	"sync"
)

// wanRouter maps a destination address to the emulated WAN path that
// carries it, per source region (gateway forwarding, gossip, regional →
// global), and keeps the paths by name (http:a>b, gossip:a>b,
// global:a>g1) for the faults that cut or slow them. Its mutex guards both
// maps; dialers read it on every dial.
type wanRouter struct {
	mu     sync.RWMutex
	routes map[string]map[string]string
	paths  map[string]wanPath
}

func newWANRouter() *wanRouter {
	return &wanRouter{routes: map[string]map[string]string{}, paths: map[string]wanPath{}}
}

// add records path p, named name, as the way from region src to dst; via
// is p's listen address.
func (w *wanRouter) add(name string, p wanPath, src, dst, via string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paths[name] = p
	if w.routes[src] == nil {
		w.routes[src] = map[string]string{}
	}
	w.routes[src][dst] = via
}

// via returns the address that reaches dst from region src.
func (w *wanRouter) via(src, dst string) string {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if v, ok := w.routes[src][dst]; ok {
		return v
	}
	return dst
}

// dialer dials as region src does: through the WAN path to the address.
func (w *wanRouter) dialer(src string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, w.via(src, addr))
	}
}

// touching returns, by name, every path into or out of region (the paths
// to the global pair only when withGlobal).
func (w *wanRouter) touching(region string, withGlobal bool) map[string]wanPath {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := map[string]wanPath{}
	for name, p := range w.paths {
		_, ends, _ := strings.Cut(name, ":")
		src, dst, _ := strings.Cut(ends, ">")
		if (src == region || dst == region) && (withGlobal || !strings.HasPrefix(name, "global:")) {
			out[name] = p
		}
	}
	return out
}
