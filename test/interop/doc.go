// Package interop runs isobar's outputs past judges that share no code with
// it: gRPC's Node (@grpc/grpc-js-xds) and C-core (python3-grpcio) xDS
// clients against a real `isobar regional` fleet, a real etcd 3.4 server
// under the election, Prometheus's promtool and a live Prometheus over the
// alert rules, Kubernetes' JSON schemas over the manifests, and podman over
// the Containerfile. `make interop` runs it; docs/interop.md records what
// each client runs.
//
// The package holds only tests. They run when ISOBAR_INTEROP=1 (make
// interop sets it) and skip otherwise; a judge whose tool is not installed
// skips with a line starting "INTEROP-SKIP:", which make interop counts and
// prints. Every process a test starts is a child of the test, bound to
// 127.0.0.1, and stopped (SIGTERM, then SIGKILL) in t.Cleanup; each test
// waits for state by polling with a deadline, never by sleeping.
package interop
