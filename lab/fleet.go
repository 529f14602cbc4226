package lab

import (
	"sync"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/global"
)

// fleet holds the handles of the running components that faults and heals
// replace: the embedded etcd, the members of the global pair and the
// regions. Its mutex guards the slices, their elements and the members'
// and regions' down flags; a Region value is otherwise immutable once
// published (a heal publishes a new one).
type fleet struct {
	mu      sync.RWMutex
	etcd    *election.Embedded
	globals []*globalMember
	regions []*Region
}

// view runs fn with the fleet read-locked: fn may read every field and
// must not call another fleet method.
func (f *fleet) view(fn func()) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn()
}

// update runs fn with the fleet write-locked: fn may change the handles
// and the down flags and must not call another fleet method.
func (f *fleet) update(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// Regions are the regions in order.
func (f *fleet) Regions() []*Region {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return append([]*Region(nil), f.regions...)
}

// members are the members of the global pair, up or down.
func (f *fleet) members() []*globalMember {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return append([]*globalMember(nil), f.globals...)
}

// running are the servers of the members that are up.
func (f *fleet) running() []*global.Server {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []*global.Server
	for _, m := range f.globals {
		if !m.down {
			out = append(out, m.srv)
		}
	}
	return out
}

// Etcd is the embedded etcd (nil without one).
func (f *fleet) Etcd() *election.Embedded {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.etcd
}

// setRegion publishes r as the region at index idx (appending when idx is
// the next one).
func (f *fleet) setRegion(idx int, r *Region) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if idx == len(f.regions) {
		f.regions = append(f.regions, r)
		return
	}
	f.regions[idx] = r
}
