//go:build !linux

package scale

import "time"

// threadCPU is unavailable here: cycles' CPU times are reported as null.
func threadCPU() (time.Duration, bool) { return 0, false }
