package xdscontract

import (
	"net/url"
	"strings"
)

// LEDS (Locality Endpoint Discovery Service) names. With the regional
// controller's LEDS layout on (regional/xds Config.LEDS), delta xDS clients
// get ClusterLoadAssignments whose localities carry no endpoints but a
// leds_cluster_locality_config naming an LbEndpoint glob collection
// (LEDSCollection), and the endpoints as one LbEndpoint resource each
// (LEDSEndpointName), so a change to one endpoint sends that endpoint.
// Envoy's shapes: api/envoy/config/endpoint/v3/endpoint_components.proto
// (LedsClusterLocalityConfig: "If the name ends in /*, it indicates an
// LbEndpoint glob collection, which is supported only in the xDS
// incremental protocol variants"), api/envoy/service/endpoint/v3/leds.proto
// (delta only), and the xdstp:// naming of xds/core/v3/resource_name.proto
// (xdstp://{authority}/{type}/{id}, glob collections ending in "/*").
const (
	// LbEndpointType is the type URL of a LEDS resource.
	LbEndpointType = "type.googleapis.com/envoy.config.endpoint.v3.LbEndpoint"
	// LEDSAuthority is the xdstp authority of isobar's LEDS collections.
	LEDSAuthority = "isobar"
	// ledsPrefix starts every LEDS collection and resource name.
	ledsPrefix = "xdstp://" + LEDSAuthority + "/envoy.config.endpoint.v3.LbEndpoint/"
)

// LEDSCollection is the glob collection name of the endpoints of cluster's
// locality region/zone: xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint/
// {cluster}/{region/zone}/*, each segment path-escaped (a cluster name holds
// slashes). A locality names its own cluster's collection, or another
// cluster's whose endpoints are the same at the same weights and health
// (the regional controller shares a collection between a model's main,
// local and context-class clusters while they hold the same endpoints, so
// a uniform fleet serves each cell once): a client fills each locality
// from the collection it names, whichever cluster's name that carries.
// Where the clusters' endpoints differ, the same cell is a resource in
// each collection.
func LEDSCollection(cluster, region, zone string) string {
	return ledsPrefix + url.PathEscape(cluster) + "/" + url.PathEscape(region+"/"+zone) + "/*"
}

// LEDSEndpointName is the name of the LbEndpoint resource of address
// host:port in collection (a LEDSCollection name).
func LEDSEndpointName(collection, hostPort string) string {
	return strings.TrimSuffix(collection, "*") + url.PathEscape(hostPort)
}

// LEDSCollectionOf returns the glob collection a LEDS resource name belongs
// to, and false when name is not an isobar LEDS resource name.
func LEDSCollectionOf(name string) (string, bool) {
	if !strings.HasPrefix(name, ledsPrefix) || strings.HasSuffix(name, "/*") {
		return "", false
	}
	i := strings.LastIndexByte(name, '/')
	if i < len(ledsPrefix) {
		return "", false
	}
	return name[:i+1] + "*", true
}

// IsLEDSCollection reports whether name is an isobar LEDS glob collection
// name (what a client subscribes to).
func IsLEDSCollection(name string) bool {
	return strings.HasPrefix(name, ledsPrefix) && strings.HasSuffix(name, "/*")
}
