// Package eventually is the tests' one way to await a condition: poll it
// until it holds or a deadline passes, then fail the test saying what was
// awaited. Tests wait on state, never on the clock: the deadline is a bound
// (generous, so a busy 2-core machine passes), not an assertion about speed.
//
// It owns no state; each call polls on the calling goroutine.
package eventually

import (
	"testing"
	"time"
)

// Timeout is the default bound on a wait: long enough for a loaded machine
// under -race, short enough that a broken condition fails the test well
// inside go test's own timeout.
const Timeout = 30 * time.Second

// True polls cond until it returns true, failing t with "timed out after
// <timeout> waiting for <what>" when timeout passes first. A timeout of 0
// means Timeout. The poll starts at 1 ms and backs off to 50 ms.
func True(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Wait(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", orDefault(timeout), what)
	}
}

// NoError polls f until it returns nil, failing t with the last error when
// timeout (0: Timeout) passes first.
func NoError(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	var last error
	if !Wait(timeout, func() bool { last = f(); return last == nil }) {
		t.Fatalf("timed out after %v waiting for %s: last: %v", orDefault(timeout), what, last)
	}
}

// Wait polls cond until it returns true (true) or timeout (0: Timeout)
// passes (false), for a caller that reports the failure itself.
func Wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(orDefault(timeout))
	defer deadline.Stop()
	step := time.Millisecond
	for !cond() {
		tick := time.NewTimer(step)
		select {
		case <-deadline.C:
			tick.Stop()
			return cond()
		case <-tick.C:
		}
		if step < 50*time.Millisecond {
			step *= 2
		}
	}
	return true
}

func orDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return Timeout
	}
	return d
}
