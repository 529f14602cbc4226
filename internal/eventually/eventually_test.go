package eventually

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestTrueReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	True(t, 0, "three polls", func() bool { return n.Add(1) >= 3 })
	if n.Load() < 3 {
		t.Fatalf("returned after %d polls", n.Load())
	}
}

func TestWaitGivesUpAtTheDeadline(t *testing.T) {
	if Wait(5*time.Millisecond, func() bool { return false }) {
		t.Fatal("Wait reported a condition that never held")
	}
}

// fakeTB records a Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	msg string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.msg = format
}

func TestNoErrorFailsWithTheLastError(t *testing.T) {
	f := &fakeTB{TB: t}
	NoError(f, 5*time.Millisecond, "never", func() error { return errors.New("still broken") })
	if f.msg == "" {
		t.Fatal("NoError did not fail on an error that never cleared")
	}
}
