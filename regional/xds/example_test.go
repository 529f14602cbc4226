package xds_test

import (
	"fmt"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// Build a State into the two resource sets and name what each node kind
// receives.
func ExampleBuilder_Build() {
	b, err := xds.NewBuilder(xds.Config{Region: "us-east", LBPolicy: xdscontract.RingHash})
	if err != nil {
		panic(err)
	}
	res, err := b.Build(xds.State{Models: []xds.Model{{
		Name: "meta-llama/Llama-3.1-8B-Instruct",
		Localities: []xds.Locality{{Weight: 1, Endpoints: []xds.Endpoint{
			{CellID: "cell-a", Host: "10.0.0.1", Port: 8000, Weight: 3, MaxModelLen: 8192},
			{CellID: "cell-b", Host: "10.0.0.2", Port: 8000, Weight: 1},
		}}},
	}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("envoy listener:", res.Envoy.Listeners[0].GetName(), "route:", res.Envoy.Routes[0].GetName())
	fmt.Println("grpc listener:", res.GRPC.Listeners[0].GetName())
	cla := res.Envoy.Endpoints[0]
	fmt.Println("cluster:", cla.GetClusterName(), "locality:", cla.GetEndpoints()[0].GetLocality().GetRegion())
	for _, e := range cla.GetEndpoints()[0].GetLbEndpoints() {
		cell, maxLen := xdscontract.EndpointMetadata(e.GetMetadata())
		fmt.Println(" ", cell, e.GetLoadBalancingWeight().GetValue(), maxLen)
	}
	// Output:
	// envoy listener: isobar_http route: isobar_models
	// grpc listener: meta-llama/Llama-3.1-8B-Instruct
	// cluster: isobar/meta-llama/Llama-3.1-8B-Instruct locality: us-east
	//   cell-a 3 8192
	//   cell-b 1 0
}
