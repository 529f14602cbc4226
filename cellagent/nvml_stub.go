//go:build !nvml

package cellagent

// NVMLSupported reports whether this binary reads GPUs through NVML (built
// with -tags nvml).
const NVMLSupported = false

// newNVMLSource fails: this binary was built without the nvml tag.
func newNVMLSource(string) (hardwareSource, error) { return nil, ErrNoNVML }
