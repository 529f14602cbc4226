//go:build !unix

package scale

import "time"

// cpuTime is unavailable here: CPU figures are reported as 0.
func cpuTime() (time.Duration, bool) { return 0, false }

// fdLimit is unknown here: no point is skipped for file descriptors.
func fdLimit() uint64 { return 0 }

// raiseFDLimit is unknown here.
func raiseFDLimit() uint64 { return 0 }
