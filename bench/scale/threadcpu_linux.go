//go:build linux

package scale

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling OS thread's CPU time so far
// (CLOCK_THREAD_CPUTIME_ID, clock_gettime(2)): what the thread ran, not
// the time it waited for a core. The caller holds runtime.LockOSThread,
// so the thread runs its goroutine alone (and the garbage collector's
// assists that goroutine is charged, not the background mark workers).
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
