package gateway

import (
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// table is the routing form of a Table: compiled routes and clusters linked
// to the shared runtime state.
type table struct {
	view   *xdsclient.Table
	vhosts []xdsclient.VirtualHost
	// internalOnly is the route configuration's internal_only_headers,
	// removed from requests not proven to come from an isobar gateway.
	internalOnly []string
	clusters     map[string]*clusterRT
	soleModel    string // the model when the routes name exactly one
	labels       map[string]struct{}
	// hosts is the runtime state of every address the table lists, once
	// each (the flow-control queue's mean slot hold).
	hosts []*hostState
}

// buildTable links in to the registry's runtime state. region is this
// gateway's region: endpoints of other (non-empty) regions are remote.
func buildTable(in *xdsclient.Inputs, routeName, region string, reg *hostRegistry, p *balancer, now time.Time) *table {
	addrs := make(map[string]struct{})
	names := make(map[string]struct{}, len(in.Clusters))
	for name, p := range in.Clusters {
		names[name] = struct{}{}
		for _, e := range in.Assignments[p.ServiceName] {
			addrs[e.Address] = struct{}{}
		}
	}
	hs, cs := reg.sync(addrs, names, now)
	t := &table{
		view:     xdsclient.NewTable(in, routeName),
		clusters: make(map[string]*clusterRT, len(in.Clusters)),
		labels:   make(map[string]struct{}, len(addrs)),
		hosts:    make([]*hostState, 0, len(hs)),
	}
	for _, h := range hs {
		t.hosts = append(t.hosts, h)
	}
	for name, pol := range in.Clusters {
		t.clusters[name] = buildCluster(name, pol, in.Assignments[pol.ServiceName], cs[name], hs, region, t.labels, p)
	}
	if rc := t.view.Routes; rc != nil {
		t.vhosts = rc.VirtualHosts
		t.internalOnly = rc.InternalOnlyHeaders
		if len(t.view.Models) == 1 {
			t.soleModel = t.view.Models[0].Name
		}
	}
	return t
}

// buildCluster links a cluster's endpoints to their runtime state and
// installs its host set in the cluster's load balancer (kept in st across
// rebuilds; a new one when the LB settings changed). pk supplies the mode
// and the seed source. Only the configuration goroutine calls it (under
// the gateway's configuration mutex).
func buildCluster(name string, p *xdsclient.ClusterPolicy, eps []xdsclient.Endpoint, st *clusterState, hs map[string]*hostState,
	region string, labels map[string]struct{}, pk *balancer) *clusterRT {
	c := &clusterRT{name: name, policy: p, st: st}
	type locKey struct {
		prio                  uint32
		region, zone, subZone string
	}
	locs := make(map[locKey]*localityRT)
	locIndex := make(map[*localityRT]int)
	prios := make(map[uint32]*priorityRT)
	for _, e := range eps {
		h := &hostRT{ep: e, st: hs[e.Address], label: e.Cell, remote: e.Region != "" && e.Region != region}
		h.st.setProbeBudget(e.ProbeBudget)
		if h.label == "" {
			h.label = e.Address
		}
		labels[h.label] = struct{}{}
		c.all = append(c.all, h)
		pr := prios[e.Priority]
		if pr == nil {
			pr = &priorityRT{}
			prios[e.Priority] = pr
		}
		pr.hosts = append(pr.hosts, h)
		k := locKey{e.Priority, e.Region, e.Zone, e.SubZone}
		l := locs[k]
		if l == nil {
			l = &localityRT{weight: e.LocalityWeight}
			locs[k] = l
			locIndex[l] = len(pr.localities)
			pr.localities = append(pr.localities, l)
		}
		l.hosts = append(l.hosts, h)
		pr.locOf = append(pr.locOf, locIndex[l])
	}
	// Priorities in order; Envoy fails over through them in order whatever
	// their numbers.
	keys := make([]uint32, 0, len(prios))
	for k := range prios {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		c.priorities = append(c.priorities, prios[k])
	}
	// The baselines balance over one host set of all the cluster's hosts,
	// ignoring priorities and localities.
	lbPrios := c.priorities
	if pk.mode == LBRoundRobin || pk.mode == LBLeastRequest {
		flat := &priorityRT{localities: []*localityRT{{hosts: c.all}}, hosts: c.all, locOf: make([]int, len(c.all))}
		lbPrios = []*priorityRT{flat}
	}
	if st.lb == nil || st.lb.key != lbKey(pk.mode, p) {
		st.lb = newLBState(pk.mode, p, pk.rand.Uint64())
	}
	c.lb = st.lb
	c.lb.install(lbPrios)
	return c
}
