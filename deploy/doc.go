// Package deploy holds isobar's deployment files (Envoy bootstraps,
// without and with the endpoint picker; Kubernetes manifests, systemd units, Prometheus configuration and
// alerts, Grafana dashboard; see README.md) and the Go code that reads
// them back for checking.
//
// # What it owns
//
//   - The files under this directory. They use only real subcommands and
//     flags of the isobar binary, and only metric names the code exports;
//     deploy_test.go checks both, validates the Envoy bootstraps against
//     Envoy's protos (including every typed Any inside them), checks how
//     envoy/picker.yaml routes a picked request and its fallback
//     (envoy_picker_test.go), and checks the manifests' internal
//     references (ConfigMaps, Service selectors and ports, the bootstrap
//     ConfigMap's copy of envoy/bootstrap.yaml).
//   - Invocations, which extracts every isobar command line from the
//     Kubernetes manifests and systemd units with placeholders replaced by
//     example values, so that the command tree in cmd/isobar can parse them.
//
// # Concurrency and contracts
//
// Pure functions over an fs.FS; no goroutines, no global state. Invocations
// refuses a placeholder it cannot resolve ($(VAR) without a matching
// container env entry, ${VAR} missing from the example environment file),
// because Kubernetes and systemd would pass it through literally.
package deploy
