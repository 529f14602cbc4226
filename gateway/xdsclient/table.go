package xdsclient

import (
	"slices"
	"strings"
	"time"
)

// TypeLabels names the resource types a gateway subscribes to (CDS, EDS,
// RDS), as log and metric labels; a type's index here is its index in
// Inputs.Versions. Read-only.
var TypeLabels = [...]string{"cluster", "endpoint", "route"}

// TypeVersion is the version_info and arrival time of one resource type's
// resources in use.
type TypeVersion struct {
	Version string
	At      time.Time
}

// Inputs is what a gateway's subscriptions last accepted, by type. Its
// owner (the gateway's configuration goroutine) replaces a map whole on
// each accepted update and never changes one in place.
type Inputs struct {
	Clusters    map[string]*ClusterPolicy
	Assignments map[string][]Endpoint // by EDS service name
	Routes      map[string]*RouteConfig
	Versions    [len(TypeLabels)]TypeVersion
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

	versions [len(TypeLabels)]TypeVersion
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

// NewTable is the view of in with routeName's RouteConfiguration. It keeps
// references to in's maps' values, which their owner never changes.
func NewTable(in *Inputs, routeName string) *Table {
	t := &Table{Clusters: make(map[string]ClusterView, len(in.Clusters)), versions: in.Versions}
	for name, pol := range in.Clusters {
		t.Clusters[name] = ClusterView{Policy: *pol, Endpoints: in.Assignments[pol.ServiceName]}
	}
	rc := in.Routes[routeName]
	if rc == nil {
		return t
	}
	t.Routes = rc
	maxLen := make(map[string]uint32)
	for _, vh := range rc.VirtualHosts {
		for _, r := range vh.Routes {
			if r.Model == "" {
				continue
			}
			n := maxLen[r.Model]
			for _, e := range t.Clusters[r.Cluster].Endpoints {
				n = max(n, e.MaxModelLen)
			}
			maxLen[r.Model] = n
		}
	}
	for m, n := range maxLen {
		t.Models = append(t.Models, ModelInfo{Name: m, MaxModelLen: n})
	}
	slices.SortFunc(t.Models, func(a, b ModelInfo) int { return strings.Compare(a.Name, b.Name) })
	return t
}

// Ready reports whether the gateway has received routes, clusters and
// endpoints: what /health requires.
func (t *Table) Ready() bool {
	return t != nil && t.Routes != nil && !t.versions[0].At.IsZero() && !t.versions[1].At.IsZero()
}

// Version returns the version_info and arrival time of the resources in use
// of typ ("cluster", "endpoint" or "route"); zero values before any.
func (t *Table) Version(typ string) (version string, at time.Time) {
	if i := slices.Index(TypeLabels[:], typ); i >= 0 {
		return t.versions[i].Version, t.versions[i].At
	}
	return "", time.Time{}
}
