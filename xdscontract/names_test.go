package xdscontract

import "testing"

// The names are wire contract: Envoy configurations, dashboards and data
// planes built apart from this repository match on them.
func TestNames(t *testing.T) {
	const m = "meta-llama/Llama-3.1-8B-Instruct"
	for _, tc := range []struct{ got, want string }{
		{ListenerName, "isobar_http"},
		{RouteName, "isobar_models"},
		{ClusterName(m), "isobar/" + m},
		{LocalClusterName(m), "isobar/" + m + "/local"},
		{ClassClusterName(m, 8192), "isobar/" + m + "/ctx-8192"},
		{LocalClassClusterName(m, 131072), "isobar/" + m + "/local/ctx-131072"},
		{PinnedClusterName(m, "eu"), "isobar/" + m + "/pin-eu"},
		{PinnedClassClusterName(m, "eu", 32768), "isobar/" + m + "/pin-eu/ctx-32768"},
		{GRPCListenerName(m), m},
	} {
		if tc.got != tc.want {
			t.Errorf("name %q, want %q", tc.got, tc.want)
		}
	}
}
