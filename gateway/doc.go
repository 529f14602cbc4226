// Package gateway is isobar's Go data plane for places without Envoy. It
// consumes the same ADS resources the regional controller serves to Envoy.
//
// This file set currently holds the xDS side: Watcher, an EDS subscriber
// built on go-control-plane's ADS client (pkg/client/sotw/v3) with its own
// reconnect and jittered backoff. The HTTP proxy arrives with the lab.
//
// Concurrency: a Watcher runs one goroutine (Start/Stop) that owns the gRPC
// stream; readers get immutable Assignments through Latest and WaitFor,
// which are safe from any goroutine.
package gateway
