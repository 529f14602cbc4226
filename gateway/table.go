package gateway

import (
	"slices"
	"time"
)

// typeVersion is the version and arrival time of one resource type.
type typeVersion struct {
	version string
	at      time.Time
}

// Table is a read-only view of the configuration a gateway routes with:
// what its CDS, EDS and RDS subscriptions last accepted. A new Table
// replaces the old one on every accepted update; a Table never changes.
type Table struct {
	// Routes is the RouteConfiguration named Config.RouteName, nil until
	// received.
	Routes *RouteConfig
	// Clusters holds every received cluster with the endpoints of its
	// assignment (in locality order), by cluster name.
	Clusters map[string]ClusterView
	// Models lists the models the routes name, sorted.
	Models []ModelInfo

	versions [len(xdsTypeLabels)]typeVersion
}

// ClusterView is a cluster's policy and endpoints.
type ClusterView struct {
	Policy    ClusterPolicy
	Endpoints []Endpoint
}

// ModelInfo is a model the routes serve.
type ModelInfo struct {
	Name string
	// MaxModelLen is the largest max_model_len among the model's endpoints,
	// 0 when none is known.
	MaxModelLen uint32
}

// Ready reports whether the gateway has received routes, clusters and
// endpoints: what /health requires.
func (t *Table) Ready() bool {
	return t != nil && t.Routes != nil && !t.versions[0].at.IsZero() && !t.versions[1].at.IsZero()
}

// Version returns the version_info and arrival time of the resources in use
// of typ ("cluster", "endpoint" or "route"); zero values before any.
func (t *Table) Version(typ string) (version string, at time.Time) {
	if i := slices.Index(xdsTypeLabels[:], typ); i >= 0 {
		return t.versions[i].version, t.versions[i].at
	}
	return "", time.Time{}
}

// table is the routing form of a Table: compiled routes and clusters linked
// to the shared runtime state.
type table struct {
	view   *Table
	vhosts []VirtualHost
	// internalOnly is the route configuration's internal_only_headers,
	// removed from requests not proven to come from an isobar gateway.
	internalOnly []string
	clusters     map[string]*clusterRT
	soleModel    string // the model when the routes name exactly one
	labels       map[string]struct{}
}

// inputs is what the subscriptions last accepted.
type inputs struct {
	clusters    map[string]*ClusterPolicy
	assignments map[string][]Endpoint
	routes      map[string]*RouteConfig
	versions    [len(xdsTypeLabels)]typeVersion
}

// buildTable links in to the registry's runtime state. region is this
// gateway's region: endpoints of other (non-empty) regions are remote.
func buildTable(in *inputs, routeName, region string, reg *hostRegistry, p *balancer, now time.Time) *table {
	addrs := make(map[string]struct{})
	names := make(map[string]struct{}, len(in.clusters))
	for name, p := range in.clusters {
		names[name] = struct{}{}
		for _, e := range in.assignments[p.ServiceName] {
			addrs[e.Address] = struct{}{}
		}
	}
	hs, cs := reg.sync(addrs, names, now)
	t := &table{
		view:     &Table{Clusters: make(map[string]ClusterView, len(in.clusters)), versions: in.versions},
		clusters: make(map[string]*clusterRT, len(in.clusters)),
		labels:   make(map[string]struct{}, len(addrs)),
	}
	for name, pol := range in.clusters {
		eps := in.assignments[pol.ServiceName]
		t.view.Clusters[name] = ClusterView{Policy: *pol, Endpoints: eps}
		t.clusters[name] = buildCluster(name, pol, eps, cs[name], hs, region, t.labels, p)
	}
	if rc := in.routes[routeName]; rc != nil {
		t.view.Routes = rc
		t.vhosts = rc.VirtualHosts
		t.internalOnly = rc.InternalOnlyHeaders
		maxLen := make(map[string]uint32)
		for _, vh := range rc.VirtualHosts {
			for _, r := range vh.Routes {
				if r.Model == "" {
					continue
				}
				n := maxLen[r.Model]
				if cl := t.clusters[r.Cluster]; cl != nil {
					for _, h := range cl.all {
						n = max(n, h.ep.MaxModelLen)
					}
				}
				maxLen[r.Model] = n
			}
		}
		for m, n := range maxLen {
			t.view.Models = append(t.view.Models, ModelInfo{Name: m, MaxModelLen: n})
		}
		slices.SortFunc(t.view.Models, func(a, b ModelInfo) int {
			switch {
			case a.Name < b.Name:
				return -1
			case a.Name > b.Name:
				return 1
			}
			return 0
		})
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
func buildCluster(name string, p *ClusterPolicy, eps []Endpoint, st *clusterState, hs map[string]*hostState,
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
