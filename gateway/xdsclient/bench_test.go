package xdsclient

import (
	"testing"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// BenchmarkMatchRoute is the cost of matching a request against the
// controller's route configuration for two models with classes.
func BenchmarkMatchRoute(b *testing.B) {
	s := builtSet(b)
	dec := Decoder{ModelHeader: "x-isobar-model"}
	rcs, err := dec.DecodeRoutes(anys(b, s.Routes))
	if err != nil {
		b.Fatal(err)
	}
	vh := &rcs[xdscontract.RouteName].VirtualHosts[0]
	h := mapView{"x-isobar-model": "m", "content-length": "100000"}
	for b.Loop() {
		if MatchRoute(vh, "/v1/completions", h) == nil {
			b.Fatal("no route")
		}
	}
}
